//! GEMMs against a naive f64 matmul, in every precision.
//!
//! Skips cleanly without CUDA; inputs, poisoning and the tolerance scheme: `common`.

mod common;

use common::*;
use dflash_backend_cuda::GemmPrecision;
use dflash_core::{GemmOps, Transpose};

// ---------------------------------------------------------------------------------------
// GEMM

/// `op(a) (M, K) @ op(b) (K, N)` in f64, and `sum_k |a||b|` (the natural error scale).
fn naive_matmul(
    a: &[f32],
    ta: bool,
    b: &[f32],
    tb: bool,
    m: usize,
    k: usize,
    n: usize,
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

fn gemm_check(name: &str, got: &[f32], want: &[f64], scale: &[f64], tol: f64) -> f64 {
    let mut worst: f64 = 0.0;
    for (i, ((&g, &w), &s)) in got.iter().zip(want).zip(scale).enumerate() {
        assert!(g.is_finite(), "{name}[{i}]: {g}");
        let r = (g as f64 - w).abs() / (s + 1e-30);
        worst = worst.max(r);
        assert!(
            r <= tol,
            "{name}[{i}]: got {g}, want {w}, err/sum|a||b| {r:.3e} > {tol:.0e}"
        );
    }
    worst
}

#[test]
fn gemm_ops_match_naive() {
    for (prec, tol, why) in [
        (
            GemmPrecision::Bf16,
            1e-2,
            "bf16 operands (RNE, rel <= 2^-9 each, so <= ~2^-8 per product) + f32 accumulation: \
             error <= ~3.9e-3 of sum|a||b|",
        ),
        (
            GemmPrecision::Tf32,
            4e-3,
            "TF32: 10-bit operand mantissas, error <= ~2^-9 of sum|a||b|",
        ),
        (
            GemmPrecision::Fp32,
            1e-5,
            "exact f32: accumulation rounding only (<= K * 2^-24)",
        ),
    ] {
        let Some(cu) = cuda_with(prec) else { return };
        println!(
            "GEMM precision {prec:?} (tolerance on |err| / sum_k |a_ik b_kj|: {tol:.0e}; {why})"
        );
        let mut r = rng(2);
        let mut worst = 0.0f64;
        for &(m, k, n) in &[
            (7, 5, 3),
            (33, 65, 17),
            (1, 9, 1),
            (130, 257, 67),
            (512, 128, 384),
        ] {
            for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
                let a = rand_vec(&mut r, m * k, 1.0);
                let b = rand_vec(&mut r, k * n, 1.0);
                let a_shape = if ta { [k, m] } else { [m, k] };
                let b_shape = if tb { [n, k] } else { [k, n] };
                let tr = |t: bool| if t { Transpose::Yes } else { Transpose::No };
                let c = cu
                    .matmul(
                        &up(&cu, &a, &a_shape),
                        tr(ta),
                        &up(&cu, &b, &b_shape),
                        tr(tb),
                    )
                    .unwrap();
                assert_eq!(c.dims(), &[m, n]);
                let (want, scale) = naive_matmul(&a, ta, &b, tb, m, k, n);
                worst = worst.max(gemm_check(
                    &format!("matmul {m}x{k}x{n} ta={ta} tb={tb}"),
                    &down(&cu, &c),
                    &want,
                    &scale,
                    tol,
                ));
                // matmul_acc with beta (and c read), same product
                for beta in [1.0f32, -0.5] {
                    let c0 = rand_vec(&mut r, m * n, 1.0);
                    let mut ct = up(&cu, &c0, &[m, n]);
                    cu.matmul_acc(
                        &mut ct,
                        &up(&cu, &a, &a_shape),
                        tr(ta),
                        &up(&cu, &b, &b_shape),
                        tr(tb),
                        beta,
                    )
                    .unwrap();
                    let w2: Vec<f64> = want
                        .iter()
                        .zip(&c0)
                        .map(|(p, &c)| beta as f64 * c as f64 + p)
                        .collect();
                    let s2: Vec<f64> = scale
                        .iter()
                        .zip(&c0)
                        .map(|(s, &c)| s + (beta as f64 * c as f64).abs())
                        .collect();
                    worst = worst.max(gemm_check(
                        &format!("matmul_acc beta={beta} {m}x{k}x{n}"),
                        &down(&cu, &ct),
                        &w2,
                        &s2,
                        tol,
                    ));
                }
            }
        }
        // beta = 0 must not read c (NaN there), leading dims fold into rows, linear = x w^T.
        let (m, k, n) = (9, 14, 6);
        let a = rand_vec(&mut r, m * k, 1.0);
        let b = rand_vec(&mut r, k * n, 1.0);
        let mut c = up(&cu, &vec![f32::NAN; m * n], &[m, n]);
        cu.matmul_acc(
            &mut c,
            &up(&cu, &a, &[m, k]),
            Transpose::No,
            &up(&cu, &b, &[k, n]),
            Transpose::No,
            0.0,
        )
        .unwrap();
        let (want, scale) = naive_matmul(&a, false, &b, false, m, k, n);
        worst = worst.max(gemm_check(
            "matmul_acc beta=0 over NaN",
            &down(&cu, &c),
            &want,
            &scale,
            tol,
        ));
        let x = rand_vec(&mut r, 2 * 3 * 8, 1.0);
        let w = rand_vec(&mut r, 5 * 8, 1.0);
        let y = cu
            .linear(&up(&cu, &x, &[2, 3, 8]), &up(&cu, &w, &[5, 8]))
            .unwrap();
        assert_eq!(y.dims(), &[6, 5]);
        let (want, scale) = naive_matmul(&x, false, &w, true, 6, 8, 5);
        worst = worst.max(gemm_check(
            "linear (2,3,8) x (5,8)^T",
            &down(&cu, &y),
            &want,
            &scale,
            tol,
        ));
        // K = 0: the product is empty.
        let e = cu
            .matmul(
                &up(&cu, &[], &[4, 0]),
                Transpose::No,
                &up(&cu, &[], &[0, 3]),
                Transpose::No,
            )
            .unwrap();
        check_exact("matmul with K = 0", &down(&cu, &e), &[0.0; 12]);
        // Plan cache: a repeated shape reuses its plan (no new entry) and the same algorithm,
        // so the result is bit-identical.
        let (m, k, n) = (130, 257, 67);
        let a = up(&cu, &rand_vec(&mut r, m * k, 1.0), &[m, k]);
        let b = up(&cu, &rand_vec(&mut r, k * n, 1.0), &[k, n]);
        let first = down(
            &cu,
            &cu.matmul(&a, Transpose::No, &b, Transpose::No).unwrap(),
        );
        let plans = cu.gemm_plans_cached();
        assert!(plans > 0, "no cuBLASLt plan cached");
        let again = down(
            &cu,
            &cu.matmul(&a, Transpose::No, &b, Transpose::No).unwrap(),
        );
        assert_eq!(
            cu.gemm_plans_cached(),
            plans,
            "a repeated shape built a new plan"
        );
        check_exact("matmul repeated (cached plan)", &again, &first);
        println!(
            "  GEMM {prec:?}: worst |err| / sum|a||b| = {worst:.2e} (tolerance {tol:.0e}); \
             {plans} plans cached, {} bf16 fallbacks to TF32",
            cu.gemm_bf16_fallbacks()
        );
        assert_eq!(
            cu.gemm_bf16_fallbacks(),
            0,
            "cuBLASLt found no bf16 algorithm for some shape (see the stderr line)"
        );
    }
}
