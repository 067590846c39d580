//! A whole drafter step (loss, weight sum, counts, greedy predictions and every parameter
//! gradient) on any backend against the same step on the reference backend, on seeded
//! problems ([`StepProblem`]): the tiny drafter of the models tests, a small one with
//! head_dim 64 and a sliding layer, the small one on a packed micro-batch of three documents
//! (the job's path: document masks, per-document anchors, one forward/backward for all
//! blocks), and the small one at head_dim 128. Written once over `Arc<dyn Backend>`, so
//! every backend (and every attention kernel behind one) gets it by calling
//! [`drafter_step_matches_reference`].

use std::sync::Arc;

use dflash_config::{DrafterConfig, DrafterShape, LayerType, Qwen3Config, default_gamma};
use dflash_core::Backend;
use dflash_core::pipeline::{Features, FeaturesRef, HiddenBatch, SeqMeta};
use dflash_data::block_targets;
use dflash_models::drafter::{FrozenTarget, normal_vec};
use dflash_models::{DraftInput, Drafter, DrafterParams};
use dflash_training::{BlockSpec, PreparedBatch};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::reference_with;
use crate::tolerance::{AtolUnit, RelL2, Tolerance, assert_close, assert_rel_l2};

/// Which drafter problem a step runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepProblem {
    /// The tiny drafter of the models tests: H 16, 2 layers, 4/2 heads of 8, V 40, block 4,
    /// S 11, anchors [2, 3, 9, -1].
    Tiny,
    /// H 128, heads 4/2 of 64, 3 layers (the middle one sliding, window 24), V 500, block 16,
    /// S 160, 10 blocks (overlapping, past the end, padding).
    Small,
    /// The `Small` drafter on three documents of 60, 23 and 77 tokens packed into one
    /// micro-batch by `PreparedBatch::packed`, 6 anchors sampled per document.
    Packed,
    /// The `Small` problem with head_dim 128 (4/2 heads: q 512 wide over hidden 128), the
    /// head dim of most real targets and of kernels that exist only there (the wgpu backend's
    /// tensor-core forward).
    Head128,
}

/// The problems every backend runs.
pub const ALL_PROBLEMS: [StepProblem; 3] =
    [StepProblem::Tiny, StepProblem::Small, StepProblem::Packed];

/// The head_dim 128 problem, for backends with kernels of their own there.
pub const HEAD_DIM_128: [StepProblem; 1] = [StepProblem::Head128];

/// The bounds of one whole-step comparison.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepTolerance {
    /// Per gradient element (`atol` in units of the tensor's `max |want|`).
    pub grad: Tolerance,
    /// Per gradient tensor relative L2 (the precision check where per-element bounds are
    /// loose).
    pub grad_rel_l2: Option<RelL2>,
    /// `sum(w * CE)`, through the step and through the loss-only path.
    pub loss: Tolerance,
    /// `correct` may differ by `1 + counted / correct_slack_div`.
    pub correct_slack_div: u64,
    /// Percentage of equal greedy predictions required.
    pub same_pct: usize,
}

impl StepTolerance {
    /// f32 kernels everywhere (exact-f32 GEMMs, an f32 attention kernel) against the
    /// reference's f64 reductions.
    pub const F32: StepTolerance = StepTolerance {
        grad: Tolerance {
            atol: 1e-4,
            rtol: 1e-3,
            atol_unit: AtolUnit::MaxWant,
            why: "f32 kernels vs f64 reference reductions",
        },
        grad_rel_l2: None,
        loss: Tolerance {
            atol: 0.0,
            rtol: 1e-5,
            atol_unit: AtolUnit::Absolute,
            why: "f32 kernels vs f64 reference reductions",
        },
        correct_slack_div: u64::MAX,
        same_pct: 95,
    };

    /// f32 kernels with some operands rounded to f16 once (<= 2^-11 relative an element,
    /// ~2.8e-4 rms), for the reason `why`: the loss and each gradient tensor move by ~1e-3
    /// relative. Bounds: rel-L2 3e-3 per gradient tensor, per element 3e-3 of the tensor's
    /// max plus 3e-2 relative (single elements near zero carry the absolute error), loss 1e-3
    /// relative; greedy predictions may flip on near ties.
    pub const fn f16_rounded(why: &'static str) -> StepTolerance {
        StepTolerance {
            grad: Tolerance {
                atol: 3e-3,
                rtol: 3e-2,
                atol_unit: AtolUnit::MaxWant,
                why,
            },
            grad_rel_l2: Some(RelL2 { max: 3e-3, why }),
            loss: Tolerance {
                atol: 0.0,
                rtol: 1e-3,
                atol_unit: AtolUnit::Absolute,
                why,
            },
            correct_slack_div: 20,
            same_pct: 95,
        }
    }

    /// A step whose attention forward takes its products on f16-rounded q, k, v and P
    /// (wgpu's tensor-core forward, and its CPU twin [`crate::f16_products`]), f32 kernels
    /// otherwise: [`Self::f16_rounded`]. The attention output moves by ~5e-4 relative; the
    /// f32 backward recomputes P from the f32 q and k against that forward's lse and output,
    /// so the gradients move by about as much. Measured with the twin (head_dim 128 and the
    /// shared problems): gradient rel-L2 at most 1.8e-3, loss 2.2e-5 relative.
    pub const F16_PRODUCTS_ATTENTION: StepTolerance = Self::f16_rounded(
        "the attention forward's products on f16-rounded q, k, v and probabilities (2^-11 \
         relative each), f32 accumulation; f32 kernels otherwise",
    );
}

/// The weight sum is the same f32 weights summed in f64 on both sides.
const WEIGHT_SUM: Tolerance = Tolerance {
    atol: 0.0,
    rtol: 1e-12,
    atol_unit: AtolUnit::Absolute,
    why: "same weights",
};

struct Problem {
    /// The packed micro-batch (`StepProblem::Packed`); else the blocks come from `ids`,
    /// `loss_mask`, `anchors` and `features` below.
    packed: Option<PreparedBatch>,
    cfg: DrafterConfig,
    host_params: Vec<(String, Vec<usize>, Vec<f32>)>,
    embed: Vec<f32>,
    lm_head: Vec<f32>,
    v: usize,
    h: usize,
    features: Vec<f32>,
    anchors: Vec<i32>,
    ids: Vec<u32>,
    loss_mask: Vec<u8>,
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

/// The drafter config of `which`.
pub fn problem_config(which: StepProblem) -> DrafterConfig {
    let small = which != StepProblem::Tiny;
    let hd = if which == StepProblem::Head128 {
        128
    } else {
        64
    };
    let (h, v, bs, layers, hd) = if small {
        (128, 500, 16, 3, hd)
    } else {
        (16, 40, 4, 2, 8)
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
    DrafterConfig::for_target(&target_cfg(v, h), &shape).expect("drafter config")
}

fn problem(which: StepProblem, seed: u64) -> Problem {
    let small = which != StepProblem::Tiny;
    let (h, v, s) = if small { (128, 500, 160) } else { (16, 40, 11) };
    let cfg = problem_config(which);
    let mask_id = cfg.mask_token_id;
    let rf = reference_with("reference");
    let params = DrafterParams::init_random(rf.as_ref(), &cfg, 0.2, seed).unwrap();
    let mut r = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed);
    let host_params = DrafterParams::layout(&cfg)
        .into_iter()
        .zip(params.tensors())
        .map(|((name, shape), t)| {
            let mut w = rf.download(t).expect("download");
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
    let packed = (which == StepProblem::Packed).then(|| {
        let seqs: Vec<SeqMeta> = [60usize, 23, 77]
            .iter()
            .enumerate()
            .map(|(k, &n)| SeqMeta {
                sample_id: k as u64,
                ids: (0..n).map(|_| r.random_range(0..mask_id)).collect(),
                // A prompt of 5 tokens, one unsupervised token inside the response.
                loss_mask: (0..n).map(|i| u8::from(i >= 5 && i != 12)).collect(),
            })
            .collect();
        let rows: usize = seqs.iter().map(|s| s.ids.len()).sum();
        let batch = HiddenBatch {
            epoch: 0,
            step: 0,
            micro: 0,
            seqs,
            features: Some(Features::Host(normal_vec(&mut r, rows * 2 * h, 1.0))),
        };
        let spec = BlockSpec {
            block_size: cfg.block_size,
            num_anchors: 6,
            gamma: default_gamma(cfg.block_size) as f32,
            mask_token_id: mask_id,
            seed,
        };
        PreparedBatch::packed(batch, &spec).expect("a micro-batch of three documents")
    });
    Problem {
        packed,
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

struct Run {
    loss: f64,
    weight_sum: f64,
    correct: u64,
    counted: u64,
    loss_only: f64,
    predict: Vec<u32>,
    grads: Vec<(String, Vec<f32>)>,
}

/// With `compute_format`, the frozen embedding, the LM head and the features are handed to
/// the drafter in `b`'s `to_compute_format`, as a job's loader and target worker do.
fn run(b: Arc<dyn Backend>, p: &Problem, recompute: bool, compute_format: bool) -> Run {
    let params = DrafterParams::from_tensors(
        p.host_params
            .iter()
            .map(|(_, shape, w)| b.upload(w, shape).unwrap())
            .collect(),
    );
    let frozen_up = |w: &[f32]| {
        let t = b.upload(w, &[p.v, p.h]).unwrap();
        if compute_format {
            b.to_compute_format(t).unwrap()
        } else {
            t
        }
    };
    let frozen = Arc::new(FrozenTarget::new(
        frozen_up(&p.embed),
        frozen_up(&p.lm_head),
    ));
    let bs = p.cfg.block_size;
    let bt = block_targets(
        &p.ids,
        &p.loss_mask,
        &p.anchors,
        bs,
        default_gamma(bs) as f32,
        p.cfg.mask_token_id,
    );
    let feats;
    let mut inp = match &p.packed {
        Some(batch) => batch.as_input(),
        None => DraftInput {
            features: (&p.features).into(),
            anchors: &p.anchors,
            block_ids: &bt.block_ids,
            positions: &bt.positions,
            labels: &bt.labels,
            weights: &bt.weights,
            doc_starts: &[],
            ctx_positions: &[],
        },
    };
    if compute_format {
        let host = match inp.features {
            FeaturesRef::Host(h) => h.to_vec(),
            FeaturesRef::Tensor(t) => t.storage().read_host(t.numel()).unwrap(),
        };
        let rows = host.len() / (2 * p.h);
        feats = b
            .to_compute_format(b.upload(&host, &[rows, 2 * p.h]).unwrap())
            .unwrap();
        inp.features = FeaturesRef::Tensor(&feats);
    }
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

/// Checks one whole drafter step against the reference's: loss (through the step and the
/// loss-only path), weight sum, counts, greedy predictions and every parameter gradient.
fn check_step(got: &Run, want: &Run, t: &StepTolerance) {
    assert_close("  loss sum(w*CE)", &[got.loss], &[want.loss], &t.loss);
    assert_close(
        "  loss only (grad_scale 0)",
        &[got.loss_only],
        &[want.loss],
        &t.loss,
    );
    assert_close(
        "  weight_sum",
        &[got.weight_sum],
        &[want.weight_sum],
        &WEIGHT_SUM,
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
        if let Some(l2) = &t.grad_rel_l2 {
            assert_rel_l2(&format!("  d {name}"), g, w, l2);
        }
        assert_close(&format!("  d {name}"), g, w, &t.grad);
    }
}

/// Runs a whole drafter step on `backend` for each of `problems` (seed 11), with and without
/// recomputation, and asserts it matches the same step on the reference backend (reference
/// attention, no recomputation) within `tol`. `label` is printed before each step.
pub fn drafter_step_matches_reference(
    backend: Arc<dyn Backend>,
    label: &str,
    problems: &[StepProblem],
    tol: &StepTolerance,
) {
    step_matches_reference(backend, label, problems, tol, false);
}

/// As [`drafter_step_matches_reference`], with the frozen embedding, the LM head and the
/// features in `backend`'s compute format (`MemoryOps::to_compute_format`, as in a job); the
/// reference keeps them in f32, so `tol` covers their rounding.
pub fn drafter_step_in_compute_format_matches_reference(
    backend: Arc<dyn Backend>,
    label: &str,
    problems: &[StepProblem],
    tol: &StepTolerance,
) {
    step_matches_reference(backend, label, problems, tol, true);
}

fn step_matches_reference(
    backend: Arc<dyn Backend>,
    label: &str,
    problems: &[StepProblem],
    tol: &StepTolerance,
    compute_format: bool,
) {
    let reference = reference_with("reference");
    for &which in problems {
        let p = problem(which, 11);
        let want = run(reference.clone(), &p, false, false);
        assert!(want.counted > 0 && want.loss > 0.0);
        for recompute in [false, true] {
            let got = run(backend.clone(), &p, recompute, compute_format);
            println!("{which:?} drafter, {label}, recompute={recompute}");
            check_step(&got, &want, tol);
        }
    }
}
