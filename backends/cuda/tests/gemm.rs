//! GEMMs against a naive f64 matmul, in every precision.
//!
//! Skips cleanly without CUDA; inputs, poisoning and the tolerance scheme: `common`.

mod common;

use common::*;
use dflash_backend_cuda::GemmPrecision;
use dflash_core::{GemmOps, Transpose};
use dflash_tests::ops::gemm::{self, naive};

/// The shared body (`dflash_tests::ops::gemm`) in every GEMM precision, with the bound its
/// operands allow; then the plan cache (a repeated shape reuses its plan and algorithm, so the
/// result is bit-identical) and no bf16 shape falling back to TF32.
#[test]
fn gemm_ops_match_naive() {
    for (prec, bounds) in [
        (
            GemmPrecision::Bf16,
            gemm::GemmPrecision {
                tol: 1e-2,
                why: "bf16 operands (RNE, rel <= 2^-9 each, so <= ~2^-8 per product) + f32 \
                      accumulation: error <= ~3.9e-3 of sum|a||b|",
            },
        ),
        (
            GemmPrecision::Tf32,
            gemm::GemmPrecision {
                tol: 4e-3,
                why: "TF32: 10-bit operand mantissas, error <= ~2^-9 of sum|a||b|",
            },
        ),
        (GemmPrecision::Fp32, gemm::GemmPrecision::F32),
    ] {
        let Some(cu) = cuda_with(prec) else { return };
        let p = CudaPath::new(
            &format!("{prec:?} GEMMs"),
            cu,
            dflash_backend_cuda::DType::F32,
        );
        let worst = gemm::products(&p, &bounds);
        let cu = &p.cu;
        let mut r = rng(20);
        let (m, k, n) = (130, 257, 67);
        let a = up(cu, &rand_vec(&mut r, m * k, 1.0), &[m, k]);
        let b = up(cu, &rand_vec(&mut r, k * n, 1.0), &[k, n]);
        let first = down(
            cu,
            &cu.matmul(&a, Transpose::No, &b, Transpose::No).unwrap(),
        );
        let plans = cu.gemm_plans_cached();
        assert!(plans > 0, "no cuBLASLt plan cached");
        let again = down(
            cu,
            &cu.matmul(&a, Transpose::No, &b, Transpose::No).unwrap(),
        );
        assert_eq!(
            cu.gemm_plans_cached(),
            plans,
            "a repeated shape built a new plan"
        );
        check_exact("matmul repeated (cached plan)", &again, &first);
        println!(
            "  GEMM {prec:?}: worst |err| / sum|a||b| = {worst:.2e} (tolerance {:.0e}); \
             {plans} plans cached, {} bf16 fallbacks to TF32",
            bounds.tol,
            cu.gemm_bf16_fallbacks()
        );
        assert_eq!(
            cu.gemm_bf16_fallbacks(),
            0,
            "cuBLASLt found no bf16 algorithm for some shape (see the stderr line)"
        );
    }
}

// ---------------------------------------------------------------------------------------
// bf16 operands (tensors kept in bf16 by `to_compute_format`)

/// Worst `|got - want| / scale` (asserting finite outputs).
fn worst_scaled(name: &str, got: &[f32], want: &[f32], scale: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len(), "{name}: lengths differ");
    let mut worst = 0.0f64;
    for (i, ((&g, &w), &s)) in got.iter().zip(want).zip(scale).enumerate() {
        assert!(g.is_finite(), "{name}[{i}]: {g}");
        worst = worst.max((g as f64 - w as f64).abs() / (s as f64 + 1e-30));
    }
    worst
}

/// `matmul`, `matmul_acc` and `linear` with a bf16 A, a bf16 B or both, in every precision,
/// against the reference backend on the same bf16-rounded values. Every value the GEMM
/// multiplies is bf16-representable (a bf16 operand by construction; an f32 operand holds the
/// raw values in bf16 mode, which the GEMM rounds itself (RNE, like the host), and the
/// rounded values in TF32/FP32 mode, which would otherwise round them differently), so each
/// product is exact in f32 in every mode and the only error is f32 accumulation.
#[test]
fn gemm_bf16_operands_match_reference() {
    let tol = 1e-4;
    let why = "bf16-representable operands: products exact in f32 in every mode; f32 \
               accumulation only, <= ~K * 2^-23 = 3.1e-5 of sum|a||b| at K = 257 even if \
               tensor-core adds truncate";
    let rf = reference();
    let tr = |t: bool| if t { Transpose::Yes } else { Transpose::No };
    let abs = |v: &[f32]| v.iter().map(|x| x.abs()).collect::<Vec<f32>>();
    for prec in [
        GemmPrecision::Bf16,
        GemmPrecision::Tf32,
        GemmPrecision::Fp32,
    ] {
        let Some(cu) = cuda_with(prec) else { return };
        println!("GEMM {prec:?} with bf16 operands (tolerance {tol:.0e} of sum|a||b|: {why})");
        let mut r = rng(103);
        let mut worst_all = 0.0f64;
        // The operand uploaded as f32 (see the doc comment).
        let f32_vals = |raw: &[f32], rounded: &[f32]| {
            if prec == GemmPrecision::Bf16 {
                raw.to_vec()
            } else {
                rounded.to_vec()
            }
        };
        for &(m, k, n) in &[(7, 5, 3), (33, 65, 17), (130, 257, 67), (64, 128, 96)] {
            let mut worst = 0.0f64;
            for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
                for (a_bf, b_bf) in [(true, false), (false, true), (true, true)] {
                    let a = rand_vec(&mut r, m * k, 2.0);
                    let b = rand_vec(&mut r, k * n, 2.0);
                    let (ar, br) = (bf16_rounded(&a), bf16_rounded(&b));
                    let a_shape = if ta { [k, m] } else { [m, k] };
                    let b_shape = if tb { [n, k] } else { [k, n] };
                    let ac = if a_bf {
                        up_bf16(&cu, &a, &a_shape)
                    } else {
                        up(&cu, &f32_vals(&a, &ar), &a_shape)
                    };
                    let bc = if b_bf {
                        up_bf16(&cu, &b, &b_shape)
                    } else {
                        up(&cu, &f32_vals(&b, &br), &b_shape)
                    };
                    let (arf, brf) = (up(&rf, &ar, &a_shape), up(&rf, &br, &b_shape));
                    let name = format!(
                        "{m}x{k}x{n} ta={ta} tb={tb} a {} b {}",
                        if a_bf { "bf16" } else { "f32" },
                        if b_bf { "bf16" } else { "f32" }
                    );
                    let c = cu.matmul(&ac, tr(ta), &bc, tr(tb)).unwrap();
                    assert_eq!(
                        (c.dims(), dtype_of(&c)),
                        (&[m, n][..], dflash_backend_cuda::DType::F32)
                    );
                    assert_eq!(
                        cu.gemm_bf16_fallbacks(),
                        0,
                        "{name}: cuBLASLt found no bf16 algorithm (see the stderr line)"
                    );
                    let want = down(&rf, &rf.matmul(&arf, tr(ta), &brf, tr(tb)).unwrap());
                    let scale = down(
                        &rf,
                        &rf.matmul(
                            &up(&rf, &abs(&ar), &a_shape),
                            tr(ta),
                            &up(&rf, &abs(&br), &b_shape),
                            tr(tb),
                        )
                        .unwrap(),
                    );
                    let e = worst_scaled(&name, &down(&cu, &c), &want, &scale);
                    assert!(e <= tol, "matmul {name}: err/sum|a||b| {e:.3e} > {tol:.0e}");
                    worst = worst.max(e);
                    for beta in [1.0f32, -0.5] {
                        let c0 = rand_vec(&mut r, m * n, 1.0);
                        let mut cc = up(&cu, &c0, &[m, n]);
                        cu.matmul_acc(&mut cc, &ac, tr(ta), &bc, tr(tb), beta)
                            .unwrap();
                        let mut cr = up(&rf, &c0, &[m, n]);
                        rf.matmul_acc(&mut cr, &arf, tr(ta), &brf, tr(tb), beta)
                            .unwrap();
                        let s2: Vec<f32> = scale
                            .iter()
                            .zip(&c0)
                            .map(|(s, c)| s + (beta * c).abs())
                            .collect();
                        let e = worst_scaled(&name, &down(&cu, &cc), &down(&rf, &cr), &s2);
                        assert!(
                            e <= tol,
                            "matmul_acc beta={beta} {name}: err/scale {e:.3e} > {tol:.0e}"
                        );
                        worst = worst.max(e);
                    }
                }
            }
            println!(
                "  matmul + matmul_acc {m}x{k}x{n}, 4 transposes x 3 operand dtypes: \
                 worst err/sum|a||b| {worst:.2e} (err/tol {:.3})",
                worst / tol
            );
            worst_all = worst_all.max(worst);
        }
        // linear: an f32 activation (leading dims folded) times a bf16 frozen weight.
        let (x, w) = (
            rand_vec(&mut r, 3 * 5 * 64, 2.0),
            rand_vec(&mut r, 96 * 64, 0.5),
        );
        let (xr, wr) = (bf16_rounded(&x), bf16_rounded(&w));
        let y = cu
            .linear(
                &up(&cu, &f32_vals(&x, &xr), &[3, 5, 64]),
                &up_bf16(&cu, &w, &[96, 64]),
            )
            .unwrap();
        assert_eq!(y.dims(), &[15, 96]);
        let want = down(
            &rf,
            &rf.linear(&up(&rf, &xr, &[3, 5, 64]), &up(&rf, &wr, &[96, 64]))
                .unwrap(),
        );
        let scale = down(
            &rf,
            &rf.linear(
                &up(&rf, &abs(&xr), &[3, 5, 64]),
                &up(&rf, &abs(&wr), &[96, 64]),
            )
            .unwrap(),
        );
        worst_all = worst_all.max(check_scaled(
            "linear (3,5,64) f32 x (96,64)^T bf16",
            &down(&cu, &y),
            &want,
            &scale,
            tol,
            why,
        ));
        // K = 0 with bf16 operands: the product is empty.
        let e = cu
            .matmul(
                &up_bf16(&cu, &[], &[4, 0]),
                Transpose::No,
                &up_bf16(&cu, &[], &[0, 3]),
                Transpose::No,
            )
            .unwrap();
        check_exact("bf16 matmul with K = 0", &down(&cu, &e), &[0.0; 12]);
        // matmul_acc keeps c's dtype: a bf16 c (an activation gradient) is accumulated in
        // f32 and rounded once (formerly rejected; checked in detail by
        // `gemm_bf16_activations_match_reference`).
        let mut cb = up_bf16(&cu, &rand_vec(&mut r, 6, 1.0), &[2, 3]);
        let a = up(&cu, &rand_vec(&mut r, 8, 1.0), &[2, 4]);
        let b = up(&cu, &rand_vec(&mut r, 12, 1.0), &[4, 3]);
        cu.matmul_acc(&mut cb, &a, Transpose::No, &b, Transpose::No, 1.0)
            .unwrap();
        assert_eq!(dtype_of(&cb), dflash_backend_cuda::DType::Bf16);
        assert!(down(&cu, &cb).iter().all(|v| v.is_finite()));
        println!(
            "  GEMM {prec:?} bf16 operands: worst err/sum|a||b| {worst_all:.2e} (tol {tol:.0e}); \
             {} bf16 fallbacks to TF32",
            cu.gemm_bf16_fallbacks()
        );
    }
}

// ---------------------------------------------------------------------------------------
// bf16 activations

/// With bf16 activations `matmul` / `linear` write a bf16 D and `matmul_acc` keeps c's dtype
/// (bf16 activation gradients; f32 parameter gradients), in every GEMM mode (bf16: cuBLASLt
/// writes bf16 D itself; TF32 / FP32: through f32 scratch). Operands (f32 or bf16, mixed) hold
/// bf16-representable values, so products are exact in every mode and the f32 result is off
/// only by f32 accumulation (1e-4 of sum|a||b|, as `gemm_bf16_operands_match_reference`);
/// tolerance per element: that, plus one bf16 rounding of D, 2^-8 of |ref|. An f32 c stays
/// f32 at the plain 1e-4 tolerance.
#[test]
fn gemm_bf16_activations_match_reference() {
    use dflash_backend_cuda::DType;
    let tol = 1e-4;
    let tr = |t: bool| if t { Transpose::Yes } else { Transpose::No };
    for prec in [
        GemmPrecision::Bf16,
        GemmPrecision::Tf32,
        GemmPrecision::Fp32,
    ] {
        let Some(cu) = cuda_act(prec, DType::Bf16) else {
            return;
        };
        let mut r = rng(213);
        let (mut worst_d, mut worst_acc) = (0.0f64, 0.0f64);
        for &(m, k, n) in &[(7, 5, 3), (33, 65, 17), (130, 257, 67)] {
            for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
                for (ad, bd) in [
                    (DType::F32, DType::F32),
                    (DType::Bf16, DType::F32),
                    (DType::Bf16, DType::Bf16),
                ] {
                    let a = bf16_rounded(&rand_vec(&mut r, m * k, 2.0));
                    let b = bf16_rounded(&rand_vec(&mut r, k * n, 2.0));
                    let a_shape = if ta { [k, m] } else { [m, k] };
                    let b_shape = if tb { [n, k] } else { [k, n] };
                    let (ac, _) = up_as(&cu, &a, &a_shape, ad);
                    let (bc, _) = up_as(&cu, &b, &b_shape, bd);
                    let (want, scale) = naive(&a, ta, &b, tb, (m, k, n));
                    let name = format!(
                        "{prec:?} {m}x{k}x{n} ta={ta} tb={tb} a {} b {}",
                        ad.name(),
                        bd.name()
                    );
                    let c = cu.matmul(&ac, tr(ta), &bc, tr(tb)).unwrap();
                    assert_dtype(&name, &c, DType::Bf16);
                    let got = down(&cu, &c);
                    for i in 0..m * n {
                        assert_eq!(got[i].to_bits() & 0xffff, 0, "{name}: not bf16");
                        let e = (got[i] as f64 - want[i]).abs()
                            / (BF16_ROUND * want[i].abs() + tol * scale[i] + 1e-30);
                        worst_d = worst_d.max(e);
                        assert!(e <= 1.0, "{name}[{i}]: got {}, want {}", got[i], want[i]);
                    }
                    // matmul_acc into a bf16 c (beta 1 and 0.5) and into an f32 c.
                    let c0 = bf16_rounded(&rand_vec(&mut r, m * n, 2.0));
                    for (cd, beta) in [(DType::Bf16, 1.0f32), (DType::Bf16, 0.5), (DType::F32, 1.0)]
                    {
                        let (mut cc, _) = up_as(&cu, &c0, &[m, n], cd);
                        cu.matmul_acc(&mut cc, &ac, tr(ta), &bc, tr(tb), beta)
                            .unwrap();
                        assert_dtype("matmul_acc keeps c's dtype", &cc, cd);
                        let got = down(&cu, &cc);
                        let rel = if cd == DType::Bf16 { BF16_ROUND } else { 0.0 };
                        for i in 0..m * n {
                            let w = beta as f64 * c0[i] as f64 + want[i];
                            let sc = scale[i] + (beta as f64 * c0[i] as f64).abs();
                            let e = (got[i] as f64 - w).abs() / (rel * w.abs() + tol * sc + 1e-30);
                            worst_acc = worst_acc.max(e);
                            assert!(
                                e <= 1.0,
                                "{name} matmul_acc c {} beta {beta} [{i}]: got {}, want {w}",
                                cd.name(),
                                got[i]
                            );
                        }
                    }
                }
            }
        }
        // linear = matmul(x, w^T): bf16 out.
        let x = rand_vec(&mut r, 9 * 16, 1.0);
        let w = rand_vec(&mut r, 5 * 16, 1.0);
        let y = cu
            .linear(&up(&cu, &x, &[9, 16]), &up(&cu, &w, &[5, 16]))
            .unwrap();
        assert_dtype("linear", &y, DType::Bf16);
        assert_eq!(cu.gemm_bf16_fallbacks(), 0, "no bf16 plan may be missing");
        println!(
            "  GEMM {prec:?}, bf16 activations: worst err/tol matmul D {worst_d:.3}, \
             matmul_acc {worst_acc:.3} [tol 2^-8 |ref| + {tol:.0e} sum|a||b|: bf16-representable \
             operands (exact products), f32 accumulation, one rounding of a bf16 D]"
        );
    }
}
