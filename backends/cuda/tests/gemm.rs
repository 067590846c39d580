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
            "  GEMM {prec:?}: worst |err| / sum|a||b| = {worst:.2e} (tolerance {:e}); \
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

/// `matmul`, `matmul_acc` and `linear` with a bf16 A, a bf16 B or both, in every precision:
/// the shared body (`gemm::compute_format_operands`). In bf16 mode an f32 operand holds the raw
/// values, which the GEMM rounds itself (RNE, like the host); in TF32 / FP32 mode it holds
/// bf16-representable values, which those modes would otherwise round differently. So every
/// product is exact in f32 in every mode and the only error is f32 accumulation. Then a bf16 c
/// in `matmul_acc` (an activation gradient: accumulated in f32, rounded once) keeps its dtype,
/// and no shape made cuBLASLt fall back from bf16.
#[test]
fn gemm_bf16_operands_match_reference() {
    let tol = 1e-4; // <= ~K * 2^-23 = 8.3e-5 of sum|a||b| at K = 700 even if tensor-core adds truncate
    for (prec, f32_operands) in [
        (GemmPrecision::Bf16, gemm::F32Operands::RoundedByGemm),
        (GemmPrecision::Tf32, gemm::F32Operands::AsStored),
        (GemmPrecision::Fp32, gemm::F32Operands::AsStored),
    ] {
        let Some(cu) = cuda_with(prec) else { return };
        let p = CudaPath::new(
            &format!("{prec:?} GEMMs"),
            cu,
            dflash_backend_cuda::DType::F32,
        );
        gemm::compute_format_operands(&p, f32_operands, tol);
        let cu = &p.cu;
        let mut r = rng(104);
        let mut cb = up_bf16(cu, &rand_vec(&mut r, 6, 1.0), &[2, 3]);
        let a = up(cu, &rand_vec(&mut r, 8, 1.0), &[2, 4]);
        let b = up(cu, &rand_vec(&mut r, 12, 1.0), &[4, 3]);
        cu.matmul_acc(&mut cb, &a, Transpose::No, &b, Transpose::No, 1.0)
            .unwrap();
        assert_eq!(dtype_of(&cb), dflash_backend_cuda::DType::Bf16);
        assert!(down(cu, &cb).iter().all(|v| v.is_finite()));
        assert_eq!(
            cu.gemm_bf16_fallbacks(),
            0,
            "{prec:?}: cuBLASLt found no bf16 algorithm for some shape (see the stderr line)"
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
             matmul_acc {worst_acc:.3} [tol 2^-8 |ref| + {tol:e} sum|a||b|: bf16-representable \
             operands (exact products), f32 accumulation, one rounding of a bf16 D]"
        );
    }
}
