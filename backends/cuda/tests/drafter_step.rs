//! A whole drafter step (loss and every gradient) against the reference backend, through
//! `dflash_tests::drafter_step`, in each GEMM precision and activation mode; the target
//! forward in both activation modes.
//!
//! Skips cleanly without CUDA; inputs, poisoning and the tolerance scheme: `common`.

mod common;

use std::sync::Arc;

use common::*;
use dflash_backend_cuda::GemmPrecision;
use dflash_core::Backend;
use dflash_tests::drafter_step::{
    ALL_PROBLEMS, StepProblem, StepTolerance,
    drafter_step_matches_reference as drafter_step_matches_reference_on,
};

// ---------------------------------------------------------------------------------------
// A whole drafter step: `dflash_tests::drafter_step` (written once over any backend).

#[test]
fn drafter_step_matches_reference() {
    if cuda().is_none() {
        return;
    }
    for (prec, tol) in DRAFTER_TOLS {
        let Some(cu) = cuda_with(prec) else { return };
        let label = format!("{prec:?}");
        drafter_step_matches_reference_on(Arc::new(cu), &label, &ALL_PROBLEMS, &tol);
    }
}

const BF16_WHY: &str = "bf16 GEMM operands through every layer (~4e-3 per product, compounding)";
const TF32_WHY: &str = "TF32 GEMMs through every layer (~1e-3 per GEMM, compounding)";

/// bf16: 8x TF32's unit roundoff (2^-8 vs 2^-11 per operand), and every GEMM of the step
/// (forward, both backward products, the fused CE) is affected, like the bf16 flash attention
/// test (~3e-3 rel-L2 per op, rel-L2 3e-2 over a step) but on every projection: rel-L2 5e-2
/// per gradient tensor (each bf16 GEMM output is ~2e-3..4e-3 rel-L2; ~20 GEMMs on a gradient's
/// path compound to ~1e-2..2e-2). Per element the all-TF32 run reaches 5.5e-3 of max|want|;
/// 8x that is ~4.4e-2, so atol 1e-1 of max (rtol 2e-1) catches only gross local errors. Loss
/// rel 1e-2 (TF32 measured 8.9e-5; 8x is ~7e-4); predictions >= 90% equal, like the flash
/// attention step. Exact-f32 GEMMs: `StepTolerance::F32`.
const DRAFTER_TOLS: [(GemmPrecision, StepTolerance); 3] = [
    (
        GemmPrecision::Bf16,
        StepTolerance {
            grad: Tolerance {
                atol: 1e-1,
                rtol: 2e-1,
                atol_unit: AtolUnit::MaxWant,
                why: BF16_WHY,
            },
            grad_rel_l2: Some(RelL2 {
                max: 5e-2,
                why: BF16_WHY,
            }),
            loss: Tolerance {
                atol: 0.0,
                rtol: 1e-2,
                atol_unit: AtolUnit::Absolute,
                why: BF16_WHY,
            },
            correct_slack_div: 20,
            same_pct: 90,
        },
    ),
    (
        GemmPrecision::Tf32,
        StepTolerance {
            grad: Tolerance {
                atol: 1e-2,
                rtol: 3e-2,
                atol_unit: AtolUnit::MaxWant,
                why: TF32_WHY,
            },
            grad_rel_l2: None,
            loss: Tolerance {
                atol: 0.0,
                rtol: 5e-3,
                atol_unit: AtolUnit::Absolute,
                why: TF32_WHY,
            },
            correct_slack_div: 50,
            same_pct: 95,
        },
    ),
    (GemmPrecision::Fp32, StepTolerance::F32),
];

/// A whole drafter step (small config: head_dim 64, a sliding layer, overlapping and padding
/// blocks) with `"cuda-flash"` attention and exact-f32 GEMMs, so the bf16 attention is the
/// only low-precision part. Tolerances: each attention op is ~3e-3 relative (rel-L2, see the
/// flash attention tests), compounding through 3 layers forward and backward: gradients
/// rel-L2 3e-2 per tensor; per element rtol 1e-1, atol 5e-2 of the tensor's max (bf16 has 4x
/// TF32's unit roundoff; the all-TF32 run reaches ~4.5e-3 of max per element, so ~2e-2 is
/// expected here); loss rel 1e-2; >= 90% equal predictions.
#[test]
fn drafter_step_with_cuda_flash_matches_reference() {
    let Some(cu) = cuda_attn("cuda-flash", GemmPrecision::Fp32) else {
        return;
    };
    const WHY: &str = "bf16 flash attention (f32 GEMMs) vs f64 reference";
    let tol = StepTolerance {
        grad: Tolerance {
            atol: 5e-2,
            rtol: 1e-1,
            atol_unit: AtolUnit::MaxWant,
            why: WHY,
        },
        grad_rel_l2: Some(RelL2 {
            max: 3e-2,
            why: WHY,
        }),
        loss: Tolerance {
            atol: 0.0,
            rtol: 1e-2,
            atol_unit: AtolUnit::Absolute,
            why: WHY,
        },
        correct_slack_div: 20,
        same_pct: 90,
    };
    let problems = [StepProblem::Small, StepProblem::Packed];
    drafter_step_matches_reference_on(Arc::new(cu), "cuda-flash, Fp32 GEMMs", &problems, &tol);
}

// ---------------------------------------------------------------------------------------
// bf16 activations

/// The whole drafter step with bf16 GEMMs and bf16 activations (the backend default) against
/// the reference. On top of the bf16-GEMM run above (rel-L2 5e-2 per gradient: operand
/// rounding of ~20 GEMMs on a gradient's path), every stored activation and activation
/// gradient is now rounded once to bf16: per layer ~12 elementwise outputs on the forward
/// (norms, rope, swiglu, adds, attention) and ~15 on the backward, each 2^-9 RMS relative at
/// most (~1.1e-3 for uniformly distributed rounding), i.e. ~55 roundings over a tiny/small
/// step; GEMM operands were already bf16, so only the elementwise roundings are new. As a
/// random walk that is ~sqrt(55) * 1.1e-3 ~ 8e-3, worst-case aligned ~2.5e-2: gradient rel-L2
/// 7.5e-2 (5e-2 + 2.5e-2), per element rtol 2e-1 / atol 1e-1 of max (gross errors only, as
/// bf16 GEMMs); loss rel 2e-2 (bf16 GEMMs 1e-2 + the same margin); predictions >= 85% equal;
/// `correct` within 1 + counted/10. Parameter gradients must come back f32.
#[test]
fn drafter_step_bf16_activations_matches_reference() {
    use dflash_backend_cuda::DType;
    let Some(simple) = cuda_act(GemmPrecision::Bf16, DType::Bf16) else {
        return;
    };
    let Some(flash) = cuda_attn_act("cuda-flash", GemmPrecision::Bf16, DType::Bf16) else {
        return;
    };
    // cuda-flash (its head dims: the small and packed problems only) adds its own bf16 rounding of P and
    // dS: rel-L2 <= 3e-2 budget in its f32-GEMM test above (measured ~1.5e-2), on top.
    // (backend, its attention, which problems (small?), gradient rel-L2 tolerance)
    type Run = (Arc<dyn Backend>, &'static str, &'static [StepProblem], f64);
    let runs: [Run; 2] = [
        (Arc::new(simple), "cuda-simple", &ALL_PROBLEMS, 7.5e-2),
        (
            Arc::new(flash),
            "cuda-flash",
            &[StepProblem::Small, StepProblem::Packed],
            1e-1,
        ),
    ];
    const WHY: &str = "bf16 GEMM operands + bf16 activation storage through every layer";
    for (cu, attn, problems, tol_l2) in runs {
        let tol = StepTolerance {
            grad: Tolerance {
                atol: 1e-1,
                rtol: 2e-1,
                atol_unit: AtolUnit::MaxWant,
                why: WHY,
            },
            grad_rel_l2: Some(RelL2 {
                max: tol_l2,
                why: WHY,
            }),
            loss: Tolerance {
                atol: 0.0,
                rtol: 2e-2,
                atol_unit: AtolUnit::Absolute,
                why: WHY,
            },
            correct_slack_div: 10,
            same_pct: 85,
        };
        let label = format!("{attn}, bf16 GEMMs + bf16 activations");
        drafter_step_matches_reference_on(cu, &label, problems, &tol);
    }
    // Parameter gradients stay f32 (zeros + matmul_acc / add_assign keep the dtype).
    let cu: Arc<dyn Backend> = match cuda_act(GemmPrecision::Bf16, DType::Bf16) {
        Some(b) => Arc::new(b),
        None => return,
    };
    let cfg = dflash_tests::drafter_step::problem_config(StepProblem::Tiny);
    let g = dflash_models::DrafterParams::zeros(cu.as_ref(), &cfg).unwrap();
    for t in g.tensors() {
        assert_dtype("parameter gradient", t, DType::F32);
    }
}

/// The target forward (random Qwen3, 4 layers: hidden states of every layer, the features the
/// drafter reads, the logits) on CUDA with bf16 GEMMs, in both activation modes, against the
/// reference with the same weights (`random_normal` is the same stream on every backend; the
/// CUDA copy of each frozen weight is rounded to bf16 by `to_compute_format`). Hidden states
/// are residual sums dominated by the embedding: weight rounding (2^-9 RMS per operand) and,
/// with bf16 activations, one rounding per stored output (~8 per layer) keep them within
/// rel-L2 2e-2; logits pass through the final norm and the bf16 LM head: rel-L2 5e-2.
#[test]
fn target_forward_matches_reference_in_both_activation_modes() {
    use dflash_backend_cuda::DType;
    use dflash_config::Qwen3Config;
    use dflash_core::pipeline::{Features, Target};
    use dflash_models::Qwen3Target;
    if cuda().is_none() {
        return;
    }
    let (v, h) = (300, 64);
    let json = format!(
        r#"{{"model_type": "qwen3", "vocab_size": {v}, "hidden_size": {h},
            "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 16, "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0, "max_position_embeddings": 4096,
            "tie_word_embeddings": false, "torch_dtype": "float32"}}"#
    );
    let cfg = Qwen3Config::from_json_str(&json, "test").unwrap();
    let ids: Vec<u32> = (0..57).map(|i| (i * 37 % v) as u32).collect();
    let layer_ids = [1usize, 3];
    let rb: Arc<dyn Backend> = Arc::new(reference());
    let tr = Qwen3Target::random(rb.clone(), cfg.clone(), &[3], 5).unwrap();
    let want_h = tr.hidden_states(&ids).unwrap();
    let want_l = tr.logits(&ids).unwrap();
    let tr2 = Qwen3Target::random(rb.clone(), cfg.clone(), &layer_ids, 5).unwrap();
    let want_f = match tr2.features(&ids).unwrap() {
        Features::Tensor(t) => rb.download(&t).unwrap(),
        Features::Host(hst) => hst,
    };
    for act in [DType::F32, DType::Bf16] {
        let Some(cu) = cuda_act(GemmPrecision::Bf16, act) else {
            return;
        };
        let cb: Arc<dyn Backend> = Arc::new(cu);
        let why = match act {
            DType::F32 => "bf16 GEMMs, f32 activations",
            DType::Bf16 => "bf16 GEMMs, bf16 activations",
        };
        let t = Qwen3Target::random(cb.clone(), cfg.clone(), &[3], 5).unwrap();
        let got_h = t.hidden_states(&ids).unwrap();
        for (i, (g, w)) in got_h.iter().zip(&want_h).enumerate() {
            assert_rel_l2(
                &format!("target hidden state {i} ({})", act.name()),
                g,
                w,
                &RelL2 { max: 2e-2, why },
            );
        }
        assert_rel_l2(
            &format!("target logits ({})", act.name()),
            &t.logits(&ids).unwrap(),
            &want_l,
            &RelL2 { max: 5e-2, why },
        );
        let t2 = Qwen3Target::random(cb.clone(), cfg.clone(), &layer_ids, 5).unwrap();
        let got_f = match t2.features(&ids).unwrap() {
            Features::Tensor(f) => {
                // bf16 GEMMs: the features are kept in bf16 (to_compute_format).
                assert_dtype("target features", &f, DType::Bf16);
                cb.download(&f).unwrap()
            }
            Features::Host(hst) => hst,
        };
        assert_rel_l2(
            &format!("target features ({})", act.name()),
            &got_f,
            &want_f,
            &RelL2 { max: 2e-2, why },
        );
    }
}
