//! A whole drafter step (loss and every gradient) against the reference backend.
//!
//! Skips cleanly without CUDA; inputs, poisoning and the tolerance scheme: `common`.

mod common;

use std::sync::Arc;

use common::*;
use dflash_backend_cuda::GemmPrecision;
use dflash_core::Backend;

// ---------------------------------------------------------------------------------------
// A whole drafter step

mod drafter {
    use super::*;
    use dflash_config::{DrafterConfig, DrafterShape, LayerType, Qwen3Config};
    use dflash_data::{block_targets, default_gamma};
    use dflash_models::drafter::{FrozenTarget, normal_vec};
    use dflash_models::{DraftInput, Drafter, DrafterParams};
    use rand::Rng;

    pub struct Problem {
        pub cfg: DrafterConfig,
        pub host_params: Vec<(String, Vec<usize>, Vec<f32>)>,
        pub embed: Vec<f32>,
        pub lm_head: Vec<f32>,
        pub v: usize,
        pub h: usize,
        pub features: Vec<f32>,
        pub anchors: Vec<i32>,
        pub ids: Vec<u32>,
        pub loss_mask: Vec<u8>,
    }

    fn target_cfg(v: usize, h: usize) -> Qwen3Config {
        let json = format!(
            r#"{{"model_type": "qwen3", "vocab_size": {v}, "hidden_size": {h},
                "intermediate_size": {i}, "num_hidden_layers": 4, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": {hd}, "rms_norm_eps": 1e-6,
                "rope_theta": 10000.0, "max_position_embeddings": 4096,
                "tie_word_embeddings": false, "torch_dtype": "float32"}}"#,
            i = 2 * h,
            hd = h / 4
        );
        Qwen3Config::from_json_str(&json, "test").expect("tiny target config")
    }

    /// `small = false`: the tiny drafter of the models tests (H 16, 2 layers, 4/2 heads of 8,
    /// V 40, block 4, S 11, anchors [2, 3, 9, -1]). `small = true`: H 128, heads 4/2 of 64,
    /// 3 layers (the middle one sliding, window 24), V 500, block 16, S 160, 10 blocks.
    pub fn problem(small: bool, seed: u64) -> Problem {
        let (h, v, bs, s, layers, hd) = if small {
            (128, 500, 16, 160, 3, 64)
        } else {
            (16, 40, 4, 11, 2, 8)
        };
        let mask_id = (v - 1) as u32;
        let mut shape = DrafterShape::standard(mask_id);
        shape.num_layers = layers;
        shape.block_size = bs;
        shape.num_target_features = 2;
        shape.target_layer_ids = Some(vec![1, 3]);
        shape.intermediate_size = Some(if small { 256 } else { 24 });
        shape.num_attention_heads = Some(4);
        shape.num_key_value_heads = Some(2);
        shape.head_dim = Some(hd);
        shape.dtype = dflash_config::DType::Float32;
        if small {
            shape.layer_types = Some(vec![
                LayerType::FullAttention,
                LayerType::SlidingAttention,
                LayerType::FullAttention,
            ]);
            shape.sliding_window = Some(24);
        }
        let cfg = DrafterConfig::for_target(&target_cfg(v, h), &shape).expect("drafter config");
        let rf = reference();
        let params = DrafterParams::init_random(&rf, &cfg, 0.2, seed).unwrap();
        let mut r = rng(seed ^ 0x5eed);
        let host_params = DrafterParams::layout(&cfg)
            .into_iter()
            .zip(params.tensors())
            .map(|((name, shape), t)| {
                let mut w = down(&rf, t);
                if name.ends_with("norm.weight") {
                    // Non-unit norm weights so gradient bugs they would hide show.
                    w = normal_vec(&mut r, w.len(), 0.2)
                        .iter()
                        .map(|x| 1.0 + x)
                        .collect();
                }
                (name, shape, w)
            })
            .collect();
        let embed = normal_vec(&mut r, v * h, 1.0);
        let lm_head = normal_vec(&mut r, v * h, 0.5);
        let ids: Vec<u32> = (0..s).map(|_| r.random_range(0..mask_id)).collect();
        let mut loss_mask = vec![1u8; s];
        loss_mask[0] = 0;
        loss_mask[1] = 0;
        loss_mask[5] = 0;
        let features = normal_vec(&mut r, s * 2 * h, 1.0);
        let anchors = if small {
            vec![2, 5, 30, 31, 70, 100, 150, 155, -1, -1] // overlapping, past the end, padding
        } else {
            vec![2, 3, 9, -1]
        };
        Problem {
            cfg,
            host_params,
            embed,
            lm_head,
            v,
            h,
            features,
            anchors,
            ids,
            loss_mask,
        }
    }

    pub struct Run {
        pub loss: f64,
        pub weight_sum: f64,
        pub correct: u64,
        pub counted: u64,
        pub loss_only: f64,
        pub predict: Vec<u32>,
        pub grads: Vec<(String, Vec<f32>)>,
    }

    pub fn run(b: Arc<dyn Backend>, p: &Problem, recompute: bool) -> Run {
        let params = DrafterParams::from_tensors(
            p.host_params
                .iter()
                .map(|(_, shape, w)| b.upload(w, shape).unwrap())
                .collect(),
        );
        let frozen = Arc::new(FrozenTarget {
            embed: b.upload(&p.embed, &[p.v, p.h]).unwrap(),
            lm_head: b.upload(&p.lm_head, &[p.v, p.h]).unwrap(),
        });
        let bs = p.cfg.block_size;
        let bt = block_targets(
            &p.ids,
            &p.loss_mask,
            &p.anchors,
            bs,
            default_gamma(bs),
            p.cfg.mask_token_id,
        );
        let inp = DraftInput {
            features: (&p.features).into(),
            anchors: &p.anchors,
            block_ids: &bt.block_ids,
            positions: &bt.positions,
            labels: &bt.labels,
            weights: &bt.weights,
            doc_starts: &[],
            ctx_positions: &[],
        };
        let drafter = Drafter::new(b.clone(), p.cfg.clone(), params, frozen).unwrap();
        let mut g = DrafterParams::zeros(b.as_ref(), &p.cfg).unwrap();
        let stats = drafter
            .forward_backward(&inp, 1.0 / 3.0, &mut g, recompute)
            .unwrap();
        let loss_only = drafter.loss(&inp).unwrap().weighted_loss;
        let predict = drafter.predict(&inp).unwrap();
        let grads = DrafterParams::layout(&p.cfg)
            .into_iter()
            .zip(g.tensors())
            .map(|((name, _), t)| (name, b.download(t).unwrap()))
            .collect();
        Run {
            loss: stats.weighted_loss,
            weight_sum: stats.weight_sum,
            correct: stats.correct,
            counted: stats.counted,
            loss_only,
            predict,
            grads,
        }
    }
}

#[test]
fn drafter_step_matches_reference() {
    dflash_backend_reference::link();
    if cuda().is_none() {
        return;
    }
    let reference: Arc<dyn Backend> = Arc::new(reference());
    for small in [false, true] {
        let p = drafter::problem(small, 11);
        let want = drafter::run(reference.clone(), &p, false);
        assert!(want.counted > 0 && want.loss > 0.0);
        for t in DRAFTER_TOLS {
            let prec = t.prec;
            let Some(cu) = cuda_with(prec) else { return };
            let cu: Arc<dyn Backend> = Arc::new(cu);
            for recompute in [false, true] {
                let got = drafter::run(cu.clone(), &p, recompute);
                let which = format!(
                    "{} drafter, {prec:?}, recompute={recompute}",
                    if small { "small" } else { "tiny" }
                );
                println!("{which}");
                check_step(&got, &want, &t);
            }
        }
    }
}

/// Tolerances of one GEMM precision in the whole-drafter-step test.
struct DrafterTol {
    prec: GemmPrecision,
    /// Per element: `|err| <= rtol * |want| + atol * max|want|`.
    rtol: f64,
    atol: f64,
    /// Per tensor relative L2 bound (the precision check where per-element bounds are loose).
    rel_l2: Option<f64>,
    loss_rtol: f64,
    /// `correct` may differ by `1 + counted / correct_slack_div`.
    correct_slack_div: u64,
    /// Percentage of equal greedy predictions required.
    same_pct: usize,
    why: &'static str,
}

/// Checks one whole drafter step against the reference's: loss (through the step and the
/// loss-only path), weight sum, counts, greedy predictions and every parameter gradient.
fn check_step(got: &drafter::Run, want: &drafter::Run, t: &DrafterTol) {
    check_scalar("  loss sum(w*CE)", got.loss, want.loss, t.loss_rtol, t.why);
    check_scalar(
        "  loss only (grad_scale 0)",
        got.loss_only,
        want.loss,
        t.loss_rtol,
        t.why,
    );
    check_scalar(
        "  weight_sum",
        got.weight_sum,
        want.weight_sum,
        1e-12,
        "same weights",
    );
    assert_eq!(got.counted, want.counted);
    let slack = 1 + want.counted / t.correct_slack_div;
    assert!(
        got.correct.abs_diff(want.correct) <= slack,
        "correct {} vs {}",
        got.correct,
        want.correct
    );
    let same = got
        .predict
        .iter()
        .zip(&want.predict)
        .filter(|(a, b)| a == b)
        .count();
    println!(
        "    predict: {same} of {} slots equal; correct {} vs {}",
        want.predict.len(),
        got.correct,
        want.correct
    );
    assert!(
        same * 100 >= want.predict.len() * t.same_pct,
        "predictions differ too often"
    );
    for ((name, g), (_, w)) in got.grads.iter().zip(&want.grads) {
        if let Some(l2) = t.rel_l2 {
            check_rel_l2(&format!("  d {name}"), g, w, l2, t.why);
        }
        check(&format!("  d {name}"), g, w, t.rtol, t.atol, t.why);
    }
}

/// bf16: 8x TF32's unit roundoff (2^-8 vs 2^-11 per operand), and every GEMM of the step
/// (forward, both backward products, the fused CE) is affected, like the bf16 flash attention
/// test (~3e-3 rel-L2 per op, rel-L2 3e-2 over a step) but on every projection: rel-L2 5e-2
/// per gradient tensor (each bf16 GEMM output is ~2e-3..4e-3 rel-L2; ~20 GEMMs on a gradient's
/// path compound to ~1e-2..2e-2). Per element the all-TF32 run reaches 5.5e-3 of max|want|;
/// 8x that is ~4.4e-2, so atol 1e-1 of max (rtol 2e-1) catches only gross local errors. Loss
/// rel 1e-2 (TF32 measured 8.9e-5; 8x is ~7e-4); predictions >= 90% equal, like the flash
/// attention step.
const DRAFTER_TOLS: [DrafterTol; 3] = [
    DrafterTol {
        prec: GemmPrecision::Bf16,
        rtol: 2e-1,
        atol: 1e-1,
        rel_l2: Some(5e-2),
        loss_rtol: 1e-2,
        correct_slack_div: 20,
        same_pct: 90,
        why: "bf16 GEMM operands through every layer (~4e-3 per product, compounding)",
    },
    DrafterTol {
        prec: GemmPrecision::Tf32,
        rtol: 3e-2,
        atol: 1e-2,
        rel_l2: None,
        loss_rtol: 5e-3,
        correct_slack_div: 50,
        same_pct: 95,
        why: "TF32 GEMMs through every layer (~1e-3 per GEMM, compounding)",
    },
    DrafterTol {
        prec: GemmPrecision::Fp32,
        rtol: 1e-3,
        atol: 1e-4,
        rel_l2: None,
        loss_rtol: 1e-5,
        correct_slack_div: u64::MAX,
        same_pct: 95,
        why: "f32 kernels vs f64 reference reductions",
    },
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
    dflash_backend_reference::link();
    let Some(cu) = cuda_attn("cuda-flash", GemmPrecision::Fp32) else {
        return;
    };
    let cu: Arc<dyn Backend> = Arc::new(cu);
    let reference: Arc<dyn Backend> = Arc::new(reference());
    let p = drafter::problem(true, 11);
    let want = drafter::run(reference, &p, false);
    assert!(want.counted > 0 && want.loss > 0.0);
    let tol = DrafterTol {
        prec: GemmPrecision::Fp32,
        rtol: 1e-1,
        atol: 5e-2,
        rel_l2: Some(3e-2),
        loss_rtol: 1e-2,
        correct_slack_div: 20,
        same_pct: 90,
        why: "bf16 flash attention (f32 GEMMs) vs f64 reference",
    };
    for recompute in [false, true] {
        let got = drafter::run(cu.clone(), &p, recompute);
        println!("small drafter, cuda-flash, Fp32 GEMMs, recompute={recompute}");
        check_step(&got, &want, &tol);
    }
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
    dflash_backend_reference::link();
    let Some(simple) = cuda_act(GemmPrecision::Bf16, DType::Bf16) else {
        return;
    };
    let Some(flash) = cuda_attn_act("cuda-flash", GemmPrecision::Bf16, DType::Bf16) else {
        return;
    };
    let reference: Arc<dyn Backend> = Arc::new(reference());
    // cuda-flash (its head dims: the small problem only) adds its own bf16 rounding of P and
    // dS: rel-L2 <= 3e-2 budget in its f32-GEMM test above (measured ~1.5e-2), on top.
    // (backend, its attention, which problems (small?), gradient rel-L2 tolerance)
    type Run = (Arc<dyn Backend>, &'static str, &'static [bool], f64);
    let runs: [Run; 2] = [
        (Arc::new(simple), "cuda-simple", &[false, true], 7.5e-2),
        (Arc::new(flash), "cuda-flash", &[true], 1e-1),
    ];
    for (cu, attn, smalls, tol_l2) in runs {
        let tol = DrafterTol {
            prec: GemmPrecision::Bf16,
            rtol: 2e-1,
            atol: 1e-1,
            rel_l2: Some(tol_l2),
            loss_rtol: 2e-2,
            correct_slack_div: 10,
            same_pct: 85,
            why: "bf16 GEMM operands + bf16 activation storage through every layer",
        };
        for &small in smalls {
            let p = drafter::problem(small, 11);
            let want = drafter::run(reference.clone(), &p, false);
            for recompute in [false, true] {
                let got = drafter::run(cu.clone(), &p, recompute);
                println!(
                    "{} drafter, {attn}, bf16 GEMMs + bf16 activations, recompute={recompute}",
                    if small { "small" } else { "tiny" }
                );
                check_step(&got, &want, &tol);
            }
        }
    }
    // Parameter gradients stay f32 (zeros + matmul_acc / add_assign keep the dtype).
    let cu: Arc<dyn Backend> = match cuda_act(GemmPrecision::Bf16, DType::Bf16) {
        Some(b) => Arc::new(b),
        None => return,
    };
    let p = drafter::problem(false, 11);
    let g = dflash_models::DrafterParams::zeros(cu.as_ref(), &p.cfg).unwrap();
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
    dflash_backend_reference::link();
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
        let why = format!("bf16 GEMMs, {} activations", act.name());
        let t = Qwen3Target::random(cb.clone(), cfg.clone(), &[3], 5).unwrap();
        let got_h = t.hidden_states(&ids).unwrap();
        for (i, (g, w)) in got_h.iter().zip(&want_h).enumerate() {
            check_rel_l2(
                &format!("target hidden state {i} ({})", act.name()),
                g,
                w,
                2e-2,
                &why,
            );
        }
        check_rel_l2(
            &format!("target logits ({})", act.name()),
            &t.logits(&ids).unwrap(),
            &want_l,
            5e-2,
            &why,
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
        check_rel_l2(
            &format!("target features ({})", act.name()),
            &got_f,
            &want_f,
            2e-2,
            &why,
        );
    }
}
