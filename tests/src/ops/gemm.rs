//! GEMMs against a naive f64 matmul: every transpose combination, `matmul_acc` with several
//! `beta` (0 must not read `c`: it holds NaN), edge sizes, leading dims folded into rows, an
//! empty inner dimension, and malformed shapes with the reference's messages.

use dflash_core::{GemmOps, MemoryOps, Transpose};

use super::{OpPath, assert_same_error, check_exact, down, rand_vec, reference, rng, up};

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
            "{name}[{i}]: got {g}, want {w}, err/sum|a||b| {r:.3e} > {tol:.0e}"
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
        "  [{label}] every shape and transpose: worst err/sum|a||b| {worst:.2e} (tol {:.0e}: {})",
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
