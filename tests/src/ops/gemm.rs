//! GEMMs against a naive f64 matmul: every transpose combination, `matmul_acc` with several
//! `beta` (0 must not read `c`: it holds NaN), edge sizes, leading dims folded into rows, an
//! empty inner dimension, and malformed shapes with the reference's messages.

use dflash_core::{GemmOps, MemoryOps, Transpose};

use dflash_core::Tensor;

use super::{
    Format, OpPath, assert_same_error, check_exact, down, narrow_compute_format, rand_vec,
    reference, rng, up, upload_held,
};

/// A path's GEMM bound: `|err| <= tol * sum_k |a_ik||b_kj|` per element (the natural error
/// scale of a dot product), set by the operands its products multiply.
#[derive(Debug, Clone, Copy)]
pub struct GemmPrecision {
    pub tol: f64,
    pub why: &'static str,
}

impl GemmPrecision {
    /// f32 products with f32 accumulation against f64: `|err| <= ~K * 2^-24` of the scale.
    pub const F32: GemmPrecision = GemmPrecision {
        tol: 1e-5,
        why: "f32 products, f32 accumulation (<= K * 2^-24)",
    };
}

/// `op(a) (M, K) @ op(b) (K, N)` in f64, and `sum_k |a||b|` (the natural error scale).
pub fn naive(
    a: &[f32],
    ta: bool,
    b: &[f32],
    tb: bool,
    (m, k, n): (usize, usize, usize),
) -> (Vec<f64>, Vec<f64>) {
    let at = |i: usize, p: usize| if ta { a[p * m + i] } else { a[i * k + p] } as f64;
    let bt = |p: usize, j: usize| if tb { b[j * k + p] } else { b[p * n + j] } as f64;
    let mut c = vec![0.0; m * n];
    let mut s = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            for p in 0..k {
                c[i * n + j] += at(i, p) * bt(p, j);
                s[i * n + j] += (at(i, p) * bt(p, j)).abs();
            }
        }
    }
    (c, s)
}

/// Element `i` passes when `|got - want| <= tol * scale_i`; NaN or infinity in `got` fails.
/// Returns the worst `|err| / scale`.
pub fn check_scaled(name: &str, got: &[f32], want: &[f64], scale: &[f64], tol: f64) -> f64 {
    assert_eq!(got.len(), want.len(), "{name}: lengths");
    assert_eq!(got.len(), scale.len(), "{name}: scale length");
    let mut worst: f64 = 0.0;
    for (i, ((&g, &w), &s)) in got.iter().zip(want).zip(scale).enumerate() {
        assert!(g.is_finite(), "{name}[{i}]: {g}");
        let r = (g as f64 - w).abs() / (s + 1e-30);
        assert!(
            r <= tol,
            "{name}[{i}]: got {g}, want {w}, err/sum|a||b| {r:.3e} > {tol:e}"
        );
        worst = worst.max(r);
    }
    worst
}

/// `beta * c0 + product` and its scale (`beta` 0 never reads `c0`, which may hold NaN).
pub fn with_beta(want: &[f64], scale: &[f64], c0: &[f32], beta: f32) -> (Vec<f64>, Vec<f64>) {
    want.iter()
        .zip(scale)
        .zip(c0)
        .map(|((p, s), &c)| {
            let bc = if beta == 0.0 {
                0.0
            } else {
                beta as f64 * c as f64
            };
            (bc + p, s + bc.abs())
        })
        .unzip()
}

pub fn transpose(t: bool) -> Transpose {
    if t { Transpose::Yes } else { Transpose::No }
}

/// `(m, k, n)`: edge tiles, a single element, tall/wide, one past 64-tiles in every dimension,
/// more than 8 tile rows of 128, (200, 33, 100) (a last tile of c partial in the second half of
/// its rows and columns; k one past two steps of 16), (130, 40, 131) (tails in every
/// dimension of a 128 x 128 tile), and a product of whole 128-tiles.
pub const SHAPES: [(usize, usize, usize); 10] = [
    (7, 5, 3),
    (33, 65, 17),
    (1, 9, 1),
    (130, 257, 67),
    (64, 128, 192),
    (3, 700, 2),
    (1100, 5, 130),
    (200, 33, 100),
    (130, 40, 131),
    (512, 128, 384),
];
/// On bindings of a few KiB every operand is split (hundreds of small dispatches): fewer
/// shapes, still splitting M, N and K.
pub const SHAPES_SMALL: [(usize, usize, usize); 3] = [(7, 5, 3), (70, 40, 90), (3, 700, 2)];

/// Every shape and transpose through `matmul` and `matmul_acc` (beta 0 over NaN, 1, -0.5),
/// `linear` with leading dims, `K = 0`, and shape errors. Returns the worst `|err| / scale`.
pub fn products(path: &dyn OpPath, prec: &GemmPrecision) -> f64 {
    let be = path.backend();
    let label = path.label();
    let mut r = rng(2);
    let mut worst = 0.0f64;
    let shapes: &[(usize, usize, usize)] = if path.small() { &SHAPES_SMALL } else { &SHAPES };
    for &(m, k, n) in shapes {
        for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
            let a = rand_vec(&mut r, m * k, 1.0);
            let b = rand_vec(&mut r, k * n, 1.0);
            let ash = if ta { [k, m] } else { [m, k] };
            let bsh = if tb { [n, k] } else { [k, n] };
            let (ab, bb) = (up(be, &a, &ash), up(be, &b, &bsh));
            let c = be.matmul(&ab, transpose(ta), &bb, transpose(tb)).unwrap();
            assert_eq!(c.dims(), &[m, n]);
            let (want, scale) = naive(&a, ta, &b, tb, (m, k, n));
            let name = format!("[{label}] matmul {m}x{k}x{n} ta={ta} tb={tb}");
            worst = worst.max(check_scaled(&name, &down(be, &c), &want, &scale, prec.tol));
            for beta in [0.0f32, 1.0, -0.5] {
                let c0 = if beta == 0.0 {
                    vec![f32::NAN; m * n]
                } else {
                    rand_vec(&mut r, m * n, 1.0)
                };
                let mut ct = up(be, &c0, &[m, n]);
                be.matmul_acc(&mut ct, &ab, transpose(ta), &bb, transpose(tb), beta)
                    .unwrap();
                let (w2, s2) = with_beta(&want, &scale, &c0, beta);
                let name = format!("[{label}] matmul_acc beta={beta} {m}x{k}x{n} ta={ta} tb={tb}");
                worst = worst.max(check_scaled(&name, &down(be, &ct), &w2, &s2, prec.tol));
            }
        }
    }
    let x = rand_vec(&mut r, 2 * 3 * 8, 1.0);
    let w = rand_vec(&mut r, 5 * 8, 1.0);
    let y = be
        .linear(&up(be, &x, &[2, 3, 8]), &up(be, &w, &[5, 8]))
        .unwrap();
    assert_eq!(y.dims(), &[6, 5]);
    let (want, scale) = naive(&x, false, &w, true, (6, 8, 5));
    let name = format!("[{label}] linear (2,3,8) x (5,8)^T");
    worst = worst.max(check_scaled(&name, &down(be, &y), &want, &scale, prec.tol));
    println!(
        "  [{label}] every shape and transpose: worst err/sum|a||b| {worst:.2e} (tol {:e}: {})",
        prec.tol, prec.why
    );
    empty_inner_dimension(path);
    shape_errors(path);
    worst
}

/// K = 0: the product is empty, so `matmul` gives zeros and `matmul_acc` scales c by beta.
fn empty_inner_dimension(path: &dyn OpPath) {
    let be = path.backend();
    let (a, b) = (be.zeros(&[3, 0]).unwrap(), be.zeros(&[0, 4]).unwrap());
    let c = be.matmul(&a, Transpose::No, &b, Transpose::No).unwrap();
    let label = path.label();
    check_exact(&format!("[{label}] matmul K=0"), &down(be, &c), &[0.0; 12]);
    let mut c = up(be, &[2.0; 12], &[3, 4]);
    be.matmul_acc(&mut c, &a, Transpose::No, &b, Transpose::No, 0.5)
        .unwrap();
    check_exact(
        &format!("[{label}] matmul_acc K=0 beta=0.5"),
        &down(be, &c),
        &[1.0; 12],
    );
}

/// Inner dimensions that disagree, for `matmul` and `matmul_acc`: the reference's errors.
fn shape_errors(path: &dyn OpPath) {
    let (be, rf) = (path.backend(), reference());
    let (a, b) = (up(be, &[1.0; 6], &[2, 3]), up(be, &[1.0; 8], &[2, 4]));
    let (ra, rb) = (up(&rf, &[1.0; 6], &[2, 3]), up(&rf, &[1.0; 8], &[2, 4]));
    let e = be.matmul(&a, Transpose::No, &b, Transpose::No).unwrap_err();
    let want = rf
        .matmul(&ra, Transpose::No, &rb, Transpose::No)
        .unwrap_err();
    assert_same_error(path, &e.to_string(), &want.to_string());
    let mut c = be.zeros(&[3, 3]).unwrap();
    let mut rc = rf.zeros(&[3, 3]).unwrap();
    let e = be
        .matmul_acc(&mut c, &a, Transpose::Yes, &b, Transpose::No, 1.0)
        .unwrap_err();
    let want = rf
        .matmul_acc(&mut rc, &ra, Transpose::Yes, &rb, Transpose::No, 1.0)
        .unwrap_err();
    assert_same_error(path, &e.to_string(), &want.to_string());
    println!("  [{}] {e}", path.label());
}

/// What [`compute_format_operands`] feeds the reference for an f32 operand: what the path's
/// GEMM multiplies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum F32Operands {
    /// The GEMM takes f32 operands as they are (exact f32 products, or TF32 ones): the test
    /// uploads values already in the compute format, so every product is exact.
    AsStored,
    /// The GEMM rounds f32 operands to the compute format itself (the CUDA backend's bf16
    /// GEMMs, to nearest even): the test uploads the raw values and the reference gets them
    /// rounded, which checks that rounding too.
    RoundedByGemm,
}

/// Products with an operand (or both) in the path's compute format, every transpose, against
/// the naive product of the values the GEMM multiplies (each product then exact in f32, so
/// `tol` bounds the f32 accumulation only); `matmul_acc` with beta 1 and -0.5; `linear` of an
/// f32 activation with leading dims by a compute-format weight; `K = 0`. Odd sizes put stored
/// rows at odd 2-byte offsets. A path whose compute format is f32 has nothing to check here.
/// Returns the worst `|err| / scale`.
pub fn compute_format_operands(path: &dyn OpPath, f32_operands: F32Operands, tol: f64) -> f64 {
    let be = path.backend();
    let label = path.label();
    let Some(cf) = narrow_compute_format(path, "operands") else {
        return 0.0;
    };
    // An operand: in the compute format, or f32 (see F32Operands); and what the GEMM multiplies.
    let operand = |x: &[f32], shape: &[usize], narrow: bool| -> (Tensor, Vec<f32>) {
        let rounded: Vec<f32> = x.iter().map(|&v| cf.round(v)).collect();
        match (narrow, f32_operands) {
            (true, _) => upload_held(path, x, shape, cf),
            (false, F32Operands::AsStored) => (up(be, &rounded, shape), rounded),
            (false, F32Operands::RoundedByGemm) => (up(be, x, shape), rounded),
        }
    };
    let mut r = rng(103);
    let mut worst = 0.0f64;
    let shapes: &[(usize, usize, usize)] = if path.small() { &SHAPES_SMALL } else { &SHAPES };
    for &(m, k, n) in shapes {
        for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
            for (a_cf, b_cf) in [(true, false), (false, true), (true, true)] {
                let a = rand_vec(&mut r, m * k, 2.0);
                let b = rand_vec(&mut r, k * n, 2.0);
                let ash = if ta { [k, m] } else { [m, k] };
                let bsh = if tb { [n, k] } else { [k, n] };
                let (ab, ha) = operand(&a, &ash, a_cf);
                let (bb, hb) = operand(&b, &bsh, b_cf);
                let name = format!(
                    "[{label}] {m}x{k}x{n} ta={ta} tb={tb} a {} b {}",
                    if a_cf { cf.name() } else { "f32" },
                    if b_cf { cf.name() } else { "f32" }
                );
                let c = be.matmul(&ab, transpose(ta), &bb, transpose(tb)).unwrap();
                assert_eq!(c.dims(), &[m, n]);
                assert_eq!(
                    path.format_of(&c),
                    Format::F32,
                    "{name}: the product is f32"
                );
                let (want, scale) = naive(&ha, ta, &hb, tb, (m, k, n));
                worst = worst.max(check_scaled(&name, &down(be, &c), &want, &scale, tol));
                for beta in [1.0f32, -0.5] {
                    let c0 = rand_vec(&mut r, m * n, 1.0);
                    let mut ct = up(be, &c0, &[m, n]);
                    be.matmul_acc(&mut ct, &ab, transpose(ta), &bb, transpose(tb), beta)
                        .unwrap();
                    let (w2, s2) = with_beta(&want, &scale, &c0, beta);
                    let name = format!("{name} acc beta={beta}");
                    worst = worst.max(check_scaled(&name, &down(be, &ct), &w2, &s2, tol));
                }
            }
        }
    }
    let (x, w) = (
        rand_vec(&mut r, 3 * 5 * 64, 2.0),
        rand_vec(&mut r, 96 * 64, 0.5),
    );
    let (xb, hx) = operand(&x, &[3, 5, 64], false);
    let (wb, hw) = operand(&w, &[96, 64], true);
    let y = be.linear(&xb, &wb).unwrap();
    assert_eq!(y.dims(), &[15, 96]);
    let (want, scale) = naive(&hx, false, &hw, true, (15, 64, 96));
    let name = format!("[{label}] linear (3,5,64) f32 x (96,64)^T {}", cf.name());
    worst = worst.max(check_scaled(&name, &down(be, &y), &want, &scale, tol));
    let empty_a = upload_held(path, &[], &[4, 0], cf).0;
    let empty_b = upload_held(path, &[], &[0, 3], cf).0;
    let e = be
        .matmul(&empty_a, Transpose::No, &empty_b, Transpose::No)
        .unwrap();
    check_exact(
        &format!("[{label}] {} matmul with K = 0", cf.name()),
        &down(be, &e),
        &[0.0; 12],
    );
    println!(
        "  [{label}] {} operands: worst err/sum|a||b| {worst:.2e} (tol {tol:e}: products exact, \
         f32 accumulation)",
        cf.name()
    );
    worst
}
