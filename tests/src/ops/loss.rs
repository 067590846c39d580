//! The fused linear cross-entropy and the greedy argmax against the reference backend: one
//! vocabulary chunk and several (the online log-sum-exp and the recomputed logits), several
//! row chunks, skipped rows exactly 0, loss-only calls, malformed calls with the reference's
//! messages, NaN propagation.

use dflash_core::LossOps;
use rand::Rng;
use rand_chacha::ChaCha8Rng;

use dflash_core::Tensor;

use super::{Format, OpPath, assert_same_error, down, rand_vec, reference, rng, up, upload_held};
use crate::tolerance::{AtolUnit, Tolerance, assert_close};

/// How closely a path's loss follows the reference's: it depends on the operands its GEMMs
/// multiply in (f32, or rounded to TF32 / bf16 on tensor cores).
#[derive(Debug, Clone, Copy)]
pub struct LossPrecision {
    /// Relative bound on `sum(w * CE)`.
    pub loss_rtol: f64,
    /// `dx`'s bound: `rtol`, and `atol` in units of `max |dx|`.
    pub dx_rtol: f64,
    pub dx_atol: f64,
    /// Rows whose top-2 logit margin is below this may flip their argmax (and `correct`).
    pub near_tie: f64,
    pub why: &'static str,
}

impl LossPrecision {
    /// f32 products and f32 softmax against f64: ~1e-6 relative, stated with an order of
    /// magnitude for summation order over V and H.
    pub const F32: LossPrecision = LossPrecision {
        loss_rtol: 1e-5,
        dx_rtol: 2e-4,
        dx_atol: 2e-5,
        near_tie: 1e-4,
        why: "f32 logits, log-sum-exp and GEMMs over V and H vs f64",
    };
}

/// `(argmax, top1 - top2)` of each row of `x @ w^T`, in f64.
pub fn margins(x: &[f32], w: &[f32], t: usize, h: usize, v: usize) -> Vec<(usize, f64)> {
    (0..t)
        .map(|i| {
            let (mut b1, mut i1, mut b2) = (f64::NEG_INFINITY, 0, f64::NEG_INFINITY);
            for j in 0..v {
                let z: f64 = (0..h)
                    .map(|c| x[i * h + c] as f64 * w[j * h + c] as f64)
                    .sum();
                if z > b1 {
                    (b2, b1, i1) = (b1, z, j);
                } else if z > b2 {
                    b2 = z;
                }
            }
            (i1, b1 - b2)
        })
        .collect()
}

/// Labels (40% the row's argmax, so `correct` counts something, else uniform) and loss weights
/// (30% exactly 0: skipped rows, else in [0.1, 1)) for rows with the given `(argmax, margin)`.
pub fn ce_targets(r: &mut ChaCha8Rng, m: &[(usize, f64)], v: usize) -> (Vec<u32>, Vec<f32>) {
    m.iter()
        .map(|&(am, _)| {
            let label = if r.random_bool(0.4) {
                am as u32
            } else {
                r.random_range(0..v as u32)
            };
            let weight = if r.random_bool(0.3) {
                0.0
            } else {
                r.random_range(0.1f32..1.0)
            };
            (label, weight)
        })
        .unzip()
}

/// `correct` (greedy hits on weighted rows, `(got, want)`) may differ only by the weighted rows
/// whose top-2 logit margin is under `margin` (where rounding can flip the argmax).
pub fn check_correct_within_ties(
    name: &str,
    (got, want): (u64, u64),
    weights: &[f32],
    m: &[(usize, f64)],
    margin: f64,
) {
    let near_ties = weights
        .iter()
        .zip(m)
        .filter(|&(&w, &(_, gap))| w > 0.0 && gap < margin)
        .count() as u64;
    println!(
        "  {name} CE correct {got} vs {want} (rows with top-2 margin < {margin}: {near_ties})"
    );
    assert!(
        got.abs_diff(want) <= near_ties,
        "{name}: correct {got} vs {want} with only {near_ties} near ties"
    );
}

/// `(T, H, V)`. Full: whole-vocabulary chunks of up to 1024 rows (1100: two of them), a
/// vocabulary of 40 000 (several vocabulary chunks on any backend), 2600 rows with ~70% active
/// (more than two row chunks and a tail). Small bindings: one chunk of all rows and many
/// vocabulary chunks (the backward recomputing each chunk's logits).
const SHAPES: [(usize, usize, usize); 5] = [
    (37, 64, 1000),
    (3, 8, 5),
    (300, 16, 40_000),
    (1100, 8, 50),
    (2600, 64, 1200),
];
const SHAPES_SMALL: [(usize, usize, usize); 3] = [(37, 32, 100), (3, 8, 5), (150, 16, 200)];

/// One fused-CE problem: `x (T, H)` and the head `(V, H)` on the path, the values they hold
/// (what the reference gets), and targets from [`ce_targets`].
struct CeCase {
    tag: String,
    dims: (usize, usize, usize),
    x: (Tensor, Vec<f32>),
    head: (Tensor, Vec<f32>),
    labels: Vec<u32>,
    weights: Vec<f32>,
    margins: Vec<(usize, f64)>,
}

/// The loss, its statistics, `dx` and the argmax on targets from [`ce_targets`], f32 inputs.
pub fn cross_entropy(path: &dyn OpPath, prec: &LossPrecision) {
    let be = path.backend();
    let mut r = rng(7);
    let shapes: &[(usize, usize, usize)] = if path.small() { &SHAPES_SMALL } else { &SHAPES };
    for &(t, h, v) in shapes {
        let x = rand_vec(&mut r, t * h, 1.5);
        let w = rand_vec(&mut r, v * h, 0.5);
        let margins = margins(&x, &w, t, h, v);
        let (labels, weights) = ce_targets(&mut r, &margins, v);
        let case = CeCase {
            tag: format!("[{}] ({t}, {h}, {v})", path.label()),
            dims: (t, h, v),
            x: (up(be, &x, &[t, h]), x),
            head: (up(be, &w, &[v, h]), w),
            labels,
            weights,
            margins,
        };
        compare(path, prec, &case);
    }
}

/// The head stored in `format`, narrower than f32 (a frozen LM head in the compute format,
/// as the models keep it), and `x` holding values of that format (f32 tensors), against the
/// reference on the same values: every logit product is exact, so the loss is as close as in
/// f32; `dx` as `prec` allows (a GEMM mode may round the dlogits).
pub fn narrow_head(path: &dyn OpPath, prec: &LossPrecision, format: Format) {
    let be = path.backend();
    let cf = format;
    let mut r = rng(106);
    let shapes: &[(usize, usize, usize)] = if path.small() {
        &[(37, 32, 100), (20, 9, 200)]
    } else {
        &[(1100, 64, 1200), (9, 33, 300), (300, 16, 40_000)]
    };
    for &(t, h, v) in shapes {
        let x: Vec<f32> = rand_vec(&mut r, t * h, 1.5)
            .iter()
            .map(|&e| cf.round(e))
            .collect();
        let w = rand_vec(&mut r, v * h, 0.5);
        let head = upload_held(path, &w, &[v, h], cf);
        assert!(
            head.1 != w,
            "the head must not hold {} values already",
            cf.name()
        );
        let margins = margins(&x, &head.1, t, h, v);
        let (labels, weights) = ce_targets(&mut r, &margins, v);
        let case = CeCase {
            tag: format!("[{}] {} head ({t}, {h}, {v})", path.label(), cf.name()),
            dims: (t, h, v),
            x: (up(be, &x, &[t, h]), x),
            head,
            labels,
            weights,
            margins,
        };
        compare(path, prec, &case);
    }
}

/// `case` on the path against the reference: the weighted loss, the weight sum, `counted`,
/// `correct` within near ties, `dx` (exactly 0 on skipped rows), a loss-only call (the same
/// statistics, dx 0), an unsupervised one, and the argmax on rows with a clear maximum.
fn compare(path: &dyn OpPath, prec: &LossPrecision, case: &CeCase) {
    let (be, rf) = (path.backend(), reference());
    let (t, h, v) = case.dims;
    let (tag, labels, weights, m) = (&case.tag, &case.labels, &case.weights, &case.margins);
    let tol = |atol, rtol, why| Tolerance {
        atol,
        rtol,
        atol_unit: AtolUnit::MaxWant,
        why,
    };
    let (xb, wb) = (&case.x.0, &case.head.0);
    let (xr, wr) = (up(&rf, &case.x.1, &[t, h]), up(&rf, &case.head.1, &[v, h]));
    let gs = 0.37;
    let (sb, dxb) = be
        .linear_cross_entropy(xb, wb, labels, weights, gs)
        .unwrap();
    let (sr, dxr) = rf
        .linear_cross_entropy(&xr, &wr, labels, weights, gs)
        .unwrap();
    let name = format!("sum(w*CE) {tag}");
    let loss_tol = tol(0.0, prec.loss_rtol, prec.why);
    assert_close(&name, &[sb.weighted_loss], &[sr.weighted_loss], &loss_tol);
    let why = "the same f32 weights summed in f64";
    let name = format!("sum(w) {tag}");
    assert_close(
        &name,
        &[sb.weight_sum],
        &[sr.weight_sum],
        &tol(0.0, 1e-12, why),
    );
    assert_eq!(sb.counted, sr.counted, "{tag}: counted");
    check_correct_within_ties(tag, (sb.correct, sr.correct), weights, m, prec.near_tie);
    let gb = down(be, &dxb);
    let dx_tol = tol(prec.dx_atol, prec.dx_rtol, prec.why);
    assert_close(&format!("dx {tag}"), &gb, &down(&rf, &dxr), &dx_tol);
    for i in (0..t).filter(|&i| weights[i] == 0.0) {
        let zero = gb[i * h..(i + 1) * h].iter().all(|&g| g == 0.0);
        assert!(zero, "{tag}: skipped row {i}");
    }
    // Loss only (grad_scale 0): the same statistics, dx exactly zero.
    let (s0, dx0) = be
        .linear_cross_entropy(xb, wb, labels, weights, 0.0)
        .unwrap();
    let same = s0.weighted_loss.to_bits() == sb.weighted_loss.to_bits();
    assert!(same, "{tag}: stats depend on grad_scale");
    assert!(
        down(be, &dx0).iter().all(|&d| d == 0.0),
        "{tag}: loss-only dx"
    );
    // Nothing supervised.
    let (se, dxe) = be
        .linear_cross_entropy(xb, wb, labels, &vec![0.0; t], 1.0)
        .unwrap();
    assert_eq!((se.counted, se.weight_sum), (0, 0.0), "{tag}");
    assert!(
        down(be, &dxe).iter().all(|&d| d == 0.0),
        "{tag}: unsupervised dx"
    );
    let ab = be.linear_argmax(xb, wb).unwrap();
    let ar = rf.linear_argmax(&xr, &wr).unwrap();
    let differ = (0..t)
        .filter(|&i| ab[i] != ar[i] && m[i].1 >= prec.near_tie)
        .count();
    assert_eq!(
        differ, 0,
        "{tag}: argmax differs on rows with a clear maximum"
    );
    println!(
        "  linear_argmax {tag}: equal on all {t} rows (margins under {} may differ)",
        prec.near_tie
    );
}

/// Malformed calls (a label out of range, a NaN weight, wrong lengths) fail with the reference's
/// messages, an argmax with the wrong hidden size names its op, and a NaN feature makes its
/// row's loss NaN, as on the reference.
pub fn cross_entropy_errors_and_nan(path: &dyn OpPath) {
    let (be, rf) = (path.backend(), reference());
    let (t, h, v) = (4, 3, 5);
    let x = rand_vec(&mut rng(70), t * h, 1.0);
    let w = rand_vec(&mut rng(71), v * h, 1.0);
    let (xb, wb) = (up(be, &x, &[t, h]), up(be, &w, &[v, h]));
    let (xr, wr) = (up(&rf, &x, &[t, h]), up(&rf, &w, &[v, h]));
    for (labels, weights) in [
        (vec![0, 1, 9, 2], vec![1.0; 4]),
        (vec![0, 1, 2, 3], vec![1.0, f32::NAN, 1.0, 1.0]),
        (vec![0, 1], vec![1.0; 2]),
    ] {
        let e = be
            .linear_cross_entropy(&xb, &wb, &labels, &weights, 1.0)
            .unwrap_err();
        let want = rf
            .linear_cross_entropy(&xr, &wr, &labels, &weights, 1.0)
            .unwrap_err();
        assert_same_error(path, &e.to_string(), &want.to_string());
        println!("  [{}] {e}", path.label());
    }
    let bad = up(be, &[1.0; 8], &[2, 4]);
    let e = be.linear_argmax(&bad, &wb).unwrap_err().to_string();
    assert!(
        e.contains("linear_argmax") && e.contains(path.device()),
        "{e}"
    );
    let mut xn = x.clone();
    xn[4] = f32::NAN;
    let (labels, weights) = ([0, 1, 2, 3], [1.0; 4]);
    let (s, _) = be
        .linear_cross_entropy(&up(be, &xn, &[t, h]), &wb, &labels, &weights, 1.0)
        .unwrap();
    let (sr, _) = rf
        .linear_cross_entropy(&up(&rf, &xn, &[t, h]), &wr, &labels, &weights, 1.0)
        .unwrap();
    assert!(
        s.weighted_loss.is_nan() && sr.weighted_loss.is_nan(),
        "[{}] {s:?} vs {sr:?}",
        path.label()
    );
    println!(
        "  [{}] a NaN feature gives a NaN loss, as on the reference",
        path.label()
    );
}
