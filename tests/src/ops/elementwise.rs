//! RMSNorm, RoPE, SwiGLU, the embedding gather and AdamW: forward and backward against the
//! reference backend, in every input format the path takes.

use dflash_core::{
    ActivationOps, AdamWParams, EmbeddingOps, MemoryOps, NormOps, OptimizerOps, RopeOps, Tensor,
};
use rand::Rng;

use super::{
    Arithmetic, Format, OpPath, assert_same_error, check_activation, check_exact, check_f32, down,
    rand_vec, reference, rng, up, upload_held,
};
use crate::tolerance::{AtolUnit, Tolerance, assert_close};

const fn max_want(atol: f64, rtol: f64, why: &'static str) -> Tolerance {
    Tolerance {
        atol,
        rtol,
        atol_unit: AtolUnit::MaxWant,
        why,
    }
}

/// `(rows, cols)` of the norm cases. Full: odd widths, one wider than a block, the QK-norm
/// shape (many short rows), more than 64 rows (several column-sum blocks), widths not divisible
/// by 8 (the CUDA kernels' scalar path), past 32 vectors per lane group (8200), the widest row
/// the CUDA vector path holds (16384) and wider ones (the scalar path at 512 lanes).
const NORM_SHAPES: [(usize, usize); 13] = [
    (13, 24),
    (64, 4096),
    (3000, 64),
    (5, 1000),
    (1, 7),
    (37, 100),
    (1000, 128),
    (130, 257),
    (64, 1000),
    (3, 8200),
    (2, 16384),
    (2, 20000),
    (2, 40000),
];
/// On small bindings: tails on both sides of a 4 KiB binding's rows.
const NORM_SHAPES_SMALL: [(usize, usize); 4] = [(13, 15), (300, 8), (1, 7), (129, 12)];

/// `rms_norm` and its backward: `y` (an activation), `rstd` (f32 statistics), `dx`
/// (activation), `dw` (f32), for every pair of input formats of `x` and `dy`.
pub fn rms_norm(path: &dyn OpPath) {
    let (be, rf) = (path.backend(), reference());
    let mut r = rng(3);
    let shapes: &[(usize, usize)] = if path.small() {
        &NORM_SHAPES_SMALL
    } else {
        &NORM_SHAPES
    };
    let sums = "f32 row sums (up to C terms) vs f64";
    for &(rows, c) in shapes {
        let eps = 1e-6f32;
        let x = rand_vec(&mut r, rows * c, 2.0);
        let w: Vec<f32> = rand_vec(&mut r, c, 0.5).iter().map(|v| 1.0 + v).collect();
        let dy = rand_vec(&mut r, rows * c, 1.0);
        let (wb, wr) = (up(be, &w, &[c]), up(&rf, &w, &[c]));
        for xd in path.activation_inputs() {
            let (xb, xv) = upload_held(path, &x, &[rows, c], xd);
            let xr = up(&rf, &xv, &[rows, c]);
            let (yb, rb) = be.rms_norm(&xb, &wb, eps).unwrap();
            let (yr, rr) = rf.rms_norm(&xr, &wr, eps).unwrap();
            let tag = format!("({rows}x{c}, x {})", xd.name());
            let y_want = down(&rf, &yr);
            let tol = max_want(1e-6, 1e-5, sums);
            check_activation(path, &format!("rms_norm y {tag}"), &yb, &y_want, &tol);
            let rstd_want = down(&rf, &rr);
            let tol = max_want(0.0, 1e-5, sums);
            check_f32(path, &format!("rms_norm rstd {tag}"), &rb, &rstd_want, &tol);
            for gd in path.activation_inputs() {
                let (dyb, dyv) = upload_held(path, &dy, &[rows, c], gd);
                let dyr = up(&rf, &dyv, &[rows, c]);
                let (dxb, dwb) = be.rms_norm_backward(&dyb, &xb, &wb, &rb).unwrap();
                let (dxr, dwr) = rf.rms_norm_backward(&dyr, &xr, &wr, &rr).unwrap();
                let tag = format!("({rows}x{c}, dy {}, x {})", gd.name(), xd.name());
                let why = "f32 row dot + cancellation in dy*w - xhat*dot";
                let dx_want = down(&rf, &dxr);
                let tol = max_want(1e-5, 1e-4, why);
                check_activation(
                    path,
                    &format!("rms_norm_backward dx {tag}"),
                    &dxb,
                    &dx_want,
                    &tol,
                );
                let dw_want = down(&rf, &dwr);
                let tol = max_want(1e-5, 1e-4, "f32 column sums over R rows vs f64");
                check_f32(
                    path,
                    &format!("rms_norm_backward dw {tag}"),
                    &dwb,
                    &dw_want,
                    &tol,
                );
            }
        }
    }
}

/// `(tokens, heads, head dim, theta)`: head dims 8 to 256, D/2 not a multiple of 8 (the CUDA
/// kernel's scalar path), odd head counts.
const ROPE_SHAPES: [(usize, usize, usize, f32); 6] = [
    (11, 4, 8, 10_000.0),
    (300, 8, 128, 1_000_000.0),
    (40, 2, 64, 10_000.0),
    (17, 1, 256, 500_000.0),
    (9, 3, 20, 10_000.0),
    (5, 5, 16, 10_000.0),
];

/// `rope` and `rope_backward` at positions up to ~8K (where an angle computed in f32 would
/// already be off by ~1e-3 rad), and an odd head dim refused.
pub fn rope(path: &dyn OpPath) {
    let (be, rf) = (path.backend(), reference());
    let mut r = rng(4);
    let tol = max_want(
        1e-6,
        1e-5,
        "the same f64 angles rounded to f32; FMA contraction",
    );
    for &(t, heads, d, theta) in &ROPE_SHAPES {
        let positions: Vec<i32> = (0..t).map(|_| r.random_range(0..8192)).collect();
        let x = rand_vec(&mut r, t * heads * d, 1.0);
        for xd in path.activation_inputs() {
            let (xb, xv) = upload_held(path, &x, &[t, heads, d], xd);
            let xr = up(&rf, &xv, &[t, heads, d]);
            let tag = format!("({t},{heads},{d}) theta {theta}, x {}", xd.name());
            let want = down(&rf, &rf.rope(&xr, &positions, theta).unwrap());
            let got = be.rope(&xb, &positions, theta).unwrap();
            check_activation(path, &format!("rope {tag}"), &got, &want, &tol);
            let want = down(&rf, &rf.rope_backward(&xr, &positions, theta).unwrap());
            let got = be.rope_backward(&xb, &positions, theta).unwrap();
            check_activation(path, &format!("rope_backward {tag}"), &got, &want, &tol);
        }
    }
    let bad = up(be, &[0.1; 12], &[2, 2, 3]);
    let e = be.rope(&bad, &[0, 1], 1e4).err().unwrap().to_string();
    assert!(e.contains("D even") && e.contains(path.device()), "{e}");
}

/// Backends cache what they derive from positions (tables, uploaded arrays): arrays of equal
/// length but different values must never share an entry, and a repeat must still be right
/// after others went through. Exact: the same kernel on the same inputs.
pub fn rope_cache(path: &dyn OpPath) {
    let be = path.backend();
    let mut r = rng(44);
    let (t, heads, d, theta) = (64, 2, 64, 10_000.0f32);
    let x = up(be, &rand_vec(&mut r, t * heads * d, 1.0), &[t, heads, d]);
    let pos: Vec<Vec<i32>> = (0..20)
        .map(|_| (0..t).map(|_| r.random_range(0..4096)).collect())
        .collect();
    let fresh: Vec<Vec<f32>> = pos
        .iter()
        .map(|p| down(be, &be.rope(&x, p, theta).unwrap()))
        .collect();
    for i in [3, 0, 19, 7, 3, 18, 0] {
        let again = down(be, &be.rope(&x, &pos[i], theta).unwrap());
        let name = format!("[{}] rope with positions #{i} again", path.label());
        check_exact(&name, &again, &fresh[i]);
        let other = (i + 1) % pos.len();
        assert_ne!(again, fresh[other], "{name}: the same output as #{other}");
    }
}

/// `swiglu` and its backward, deep into both tails of the sigmoid, with every input in f32 and,
/// where the path takes a narrower format, uniform and mixed combinations of it.
pub fn swiglu(path: &dyn OpPath) {
    let (be, rf) = (path.backend(), reference());
    let mut r = rng(5);
    let (t, i) = (333, 257);
    let s = [t, i];
    let g = rand_vec(&mut r, t * i, 8.0);
    let u = rand_vec(&mut r, t * i, 2.0);
    let dh = rand_vec(&mut r, t * i, 1.0);
    let tol = max_want(1e-7, 1e-5, "f32 exp (a few ulp) vs f64");
    // (dh, g, u) formats.
    let f = Format::F32;
    let mut combos = vec![(f, f, f)];
    if let Some(&n) = path.activation_inputs().get(1) {
        combos.extend([(n, n, n), (n, f, n), (f, n, f)]);
    }
    for (dd, gd, ud) in combos {
        let (gb, gv) = upload_held(path, &g, &s, gd);
        let (ub, uv) = upload_held(path, &u, &s, ud);
        let (db, dv) = upload_held(path, &dh, &s, dd);
        let (gr, ur, dr) = (up(&rf, &gv, &s), up(&rf, &uv, &s), up(&rf, &dv, &s));
        let tag = format!("g {}, u {}", gd.name(), ud.name());
        let want = down(&rf, &rf.swiglu(&gr, &ur).unwrap());
        let got = be.swiglu(&gb, &ub).unwrap();
        check_activation(path, &format!("swiglu ({tag})"), &got, &want, &tol);
        let (dgb, dub) = be.swiglu_backward(&db, &gb, &ub).unwrap();
        let (dgr, dur) = rf.swiglu_backward(&dr, &gr, &ur).unwrap();
        let tag = format!("dh {}, {tag}", dd.name());
        let name = format!("swiglu_backward d_gate ({tag})");
        check_activation(path, &name, &dgb, &down(&rf, &dgr), &tol);
        let name = format!("swiglu_backward d_up ({tag})");
        check_activation(path, &name, &dub, &down(&rf, &dur), &tol);
    }
    let e = be
        .swiglu(&path.upload_as(&g, &s, f), &up(be, &[1.0; 3], &[3]))
        .err()
        .unwrap()
        .to_string();
    let gr = up(&rf, &g, &s);
    let want = rf.swiglu(&gr, &up(&rf, &[1.0; 3], &[3])).err().unwrap();
    assert_same_error(path, &e, &want.to_string());
}

/// A gather, so bit-exact: the rows the table holds, rounded once where the path stores
/// activations in a narrower format. Odd `H` puts rows of 2-byte elements at every alignment;
/// tables larger than a small binding are walked in chunks. An id past the table is the
/// reference's error.
pub fn embedding(path: &dyn OpPath) {
    let mut r = rng(6);
    for (v, h) in [(1000, 96), (777, 97), (5, 1)] {
        let table = rand_vec(&mut r, v * h, 4.0);
        let ids: Vec<u32> = (0..517).map(|_| r.random_range(0..v as u32)).collect();
        for td in path.activation_inputs() {
            let (tb, tv) = upload_held(path, &table, &[v, h], td);
            let name = format!("embedding ({v}, {h}), table {}", td.name());
            check_gather(path, &name, &tb, &tv, (v, h), &ids);
        }
    }
}

/// The embedding of `ids` from `table` (its `(V, H)` values `held`, which the reference gets):
/// bit-exact, stored as the path's activations; an id past the table is the reference's error.
pub(super) fn check_gather(
    path: &dyn OpPath,
    name: &str,
    table: &Tensor,
    held: &[f32],
    (v, h): (usize, usize),
    ids: &[u32],
) {
    let (be, rf) = (path.backend(), reference());
    let out = path.activation_output();
    let tr = up(&rf, held, &[v, h]);
    let eb = be.embedding(table, ids).unwrap();
    assert_eq!(eb.dims(), &[ids.len(), h]);
    assert_eq!(path.format_of(&eb), out, "[{}] {name}", path.label());
    let want: Vec<f32> = down(&rf, &rf.embedding(&tr, ids).unwrap())
        .into_iter()
        .map(|x| out.round(x))
        .collect();
    check_exact(&format!("[{}] {name}", path.label()), &down(be, &eb), &want);
    let e = be.embedding(table, &[3, v as u32]).err().unwrap();
    let want = rf.embedding(&tr, &[3, v as u32]).err().unwrap();
    assert_same_error(path, &e.to_string(), &want.to_string());
}

/// Five AdamW steps with weight decay and a gradient scale that changes each step; a step of 0
/// (bias correction is 1-based) refused.
pub fn adamw(path: &dyn OpPath) {
    let (be, rf) = (path.backend(), reference());
    let mut r = rng(8);
    let n = if path.small() { 10_003 } else { 100_003 };
    let p0 = rand_vec(&mut r, n, 1.0);
    let (mut pb, mut mb, mut vb) = (
        up(be, &p0, &[n]),
        be.zeros(&[n]).unwrap(),
        be.zeros(&[n]).unwrap(),
    );
    let (mut pr, mut mr, mut vr) = (
        up(&rf, &p0, &[n]),
        rf.zeros(&[n]).unwrap(),
        rf.zeros(&[n]).unwrap(),
    );
    for step in 1..=5u64 {
        let g = rand_vec(&mut r, n, 0.1);
        let hp = AdamWParams {
            lr: 6e-4,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
            step,
            grad_scale: 0.37 * step as f32,
        };
        be.adamw_step(&mut pb, &up(be, &g, &[n]), &mut mb, &mut vb, &hp)
            .unwrap();
        rf.adamw_step(&mut pr, &up(&rf, &g, &[n]), &mut mr, &mut vr, &hp)
            .unwrap();
    }
    let tol = match path.adamw_arithmetic() {
        Arithmetic::F64 => max_want(
            0.0,
            1e-7,
            "the same f64 per-element formula, one f32 rounding per state",
        ),
        Arithmetic::F32 => max_want(
            1e-6,
            1e-5,
            "f32 per-element AdamW (a few roundings a state a step) vs f64, 5 steps",
        ),
    };
    let label = path.label();
    for (what, got, want) in [
        ("param after 5 steps", &pb, &pr),
        ("m", &mb, &mr),
        ("v", &vb, &vr),
    ] {
        assert_close(
            &format!("[{label}] adamw {what}"),
            &down(be, got),
            &down(&rf, want),
            &tol,
        );
    }
    let bad = AdamWParams {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.99,
        eps: 1e-8,
        weight_decay: 0.0,
        step: 0,
        grad_scale: 1.0,
    };
    let g = be.zeros(&[n]).unwrap();
    let e = be
        .adamw_step(&mut pb, &g, &mut mb, &mut vb, &bad)
        .unwrap_err()
        .to_string();
    assert!(e.contains("1-based") && e.contains(path.device()), "{e}");
}
