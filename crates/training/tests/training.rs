//! Tests of the training crate on the embedded tiny target with a real (small) drafter:
//! the acceptance-length chain against a direct sequential implementation of docs/design.md §2.5,
//! the LR schedule, gradient clipping, non-finite steps and the resumable state.

use std::path::Path;
use std::sync::Arc;

use dflash_config::{DType, DrafterConfig, DrafterShape, Qwen3Config};
use dflash_core::Backend;
use dflash_core::Communicator;
use dflash_core::pipeline::{Features, HiddenSeq, Target};
use dflash_core::registry::{BackendOptions, create_backend};
use dflash_models::drafter::FrozenTarget;
use dflash_models::{DraftInput, Drafter, DrafterParams, Qwen3Target};
use dflash_training::eval::sequence_cycles;
use dflash_training::optimizer::{AdamWHyper, clip_factor, grad_norm};
use dflash_training::{
    AdamW, BlockSpec, DrafterReplica, LrSchedule, NonFiniteSource, PreparedSeq, TrainError,
    evaluate_tau, state,
};

const TARGET: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../assets/tiny-target");
const TINY_TRAIN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../assets/tiny-data/train");
const MASK: u32 = 256;

fn backend(attention: &str) -> Arc<dyn Backend> {
    dflash_backend_reference::link();
    dflash_attention_tiled::link();
    let opts = BackendOptions {
        attention: attention.into(),
        ..Default::default()
    };
    create_backend("reference", &opts).unwrap()
}

fn drafter_config(block_size: usize) -> DrafterConfig {
    let t = Qwen3Config::from_file(Path::new(TARGET).join("config.json")).unwrap();
    let shape = DrafterShape {
        num_layers: 1,
        block_size,
        num_target_features: 2,
        dtype: DType::Float32,
        ..DrafterShape::standard(MASK)
    };
    DrafterConfig::for_target(&t, &shape).unwrap()
}

fn drafter(b: &Arc<dyn Backend>, cfg: &DrafterConfig, std: f32, seed: u64) -> Drafter {
    let params = DrafterParams::init_random(b.as_ref(), cfg, std, seed).unwrap();
    let (_, frozen) = FrozenTarget::load(b.as_ref(), Path::new(TARGET)).unwrap();
    Drafter::new(b.clone(), cfg.clone(), params, Arc::new(frozen)).unwrap()
}

fn target(b: &Arc<dyn Backend>, cfg: &DrafterConfig) -> Qwen3Target {
    Qwen3Target::load(b.clone(), Path::new(TARGET), &cfg.target_layer_ids).unwrap()
}

/// A real sample of the embedded data.
fn data_sample(i: usize) -> (Vec<u32>, Vec<u8>) {
    let s = dflash_data::open_dataset(TINY_TRAIN)
        .unwrap()
        .get(i)
        .unwrap();
    (s.ids, s.loss_mask)
}

/// Host features (the tests below slice, poison and clone them).
fn seq(target: &Qwen3Target, id: u64, ids: Vec<u32>, loss_mask: Vec<u8>) -> HiddenSeq {
    let features = Features::Host(target.features(&ids).unwrap().to_host().unwrap());
    HiddenSeq {
        sample_id: id,
        ids,
        loss_mask,
        features,
    }
}

fn host(f: &Features) -> &[f32] {
    match f {
        Features::Host(h) => h,
        Features::Tensor(_) => panic!("these tests keep features on the host"),
    }
}

fn clone_seq(s: &HiddenSeq) -> HiddenSeq {
    HiddenSeq {
        sample_id: s.sample_id,
        ids: s.ids.clone(),
        loss_mask: s.loss_mask.clone(),
        features: Features::Host(host(&s.features).to_vec()),
    }
}

/// The drafter's greedy block of `bs` slots for anchor `a` alone, given `features` rows `0..=a`.
fn predict_len(d: &Drafter, features: &[f32], ids: &[u32], a: usize, bs: usize) -> Vec<u32> {
    let mut block_ids = vec![MASK; bs];
    block_ids[0] = ids[a];
    let positions: Vec<i32> = (0..bs).map(|j| (a + j) as i32).collect();
    let input = DraftInput {
        features: features.into(),
        anchors: &[a as i32],
        block_ids: &block_ids,
        positions: &positions,
        labels: &vec![0; bs],
        weights: &vec![0.0; bs],
        doc_starts: &[],
        ctx_positions: &[],
    };
    d.predict(&input).unwrap()
}

/// A full block (`block_size` slots) for anchor `a`.
fn predict_one(d: &Drafter, features: &[f32], ids: &[u32], a: usize) -> Vec<u32> {
    predict_len(d, features, ids, a, d.config().block_size)
}

/// docs/design.md §2.5 written out directly: one drafter call per cycle, sequentially. The drafter
/// gets only the committed context, positions `< a`, plus a garbage row at `a` (the anchor's
/// own feature is not known at inference; the mask must hide it, and garbage makes a leak
/// visible); block `[token at a, MASK...]`; accepted = matching prefix of its greedy tokens
/// with the data at `a+1..`; tau = accepted + 1; next anchor `a + accepted + 1`. At the end,
/// as the serving loop does: the block is `min(block_size, S - a)` slots and a cycle commits
/// at most the `S - 1 - a` tokens still to generate.
fn sequential_cycles(d: &Drafter, s: &HiddenSeq) -> Vec<usize> {
    let cfg = d.config();
    let (bs, kh) = (cfg.block_size, cfg.hidden_size * cfg.target_layer_ids.len());
    let n = s.ids.len();
    let Some(p0) = s.loss_mask.iter().position(|&m| m == 1) else {
        return Vec::new();
    };
    let mut cycles = Vec::new();
    let mut a = p0;
    while a + 1 < n {
        let mut features = host(&s.features)[..a * kh].to_vec();
        features.extend((0..kh).map(|i| ((i * 37 % 11) as f32 - 5.0) * 3.0));
        let len = bs.min(n - a);
        let pred = predict_len(d, &features, &s.ids, a, len);
        let mut accepted = 0;
        while accepted + 1 < len && pred[accepted + 1] == s.ids[a + accepted + 1] {
            accepted += 1;
        }
        cycles.push((accepted + 1).min(n - 1 - a));
        a += accepted + 1;
    }
    cycles
}

/// Builds a sequence on which the drafter's acceptance follows `plan`: after a real prompt
/// and first completion token, each cycle appends the drafter's own first `k` predictions
/// then a token it did not predict (or, after a full block, any bonus token). Returns the
/// sequence and the tau of each planned cycle.
fn generate(
    target: &Qwen3Target,
    d: &Drafter,
    prompt: &[u32],
    plan: &[usize],
    len: usize,
) -> (HiddenSeq, Vec<usize>) {
    let bs = d.config().block_size;
    let mut ids = prompt.to_vec();
    let mut planned = Vec::new();
    while ids.len() < len {
        let a = ids.len() - 1;
        let features = target.features(&ids).unwrap().to_host().unwrap();
        let pred = predict_one(d, &features, &ids, a);
        let k = plan[planned.len() % plan.len()].min(bs - 1);
        ids.extend_from_slice(&pred[1..=k]);
        ids.push(if k + 1 < bs {
            (pred[k + 1] + 1) % 256
        } else {
            b'#' as u32
        });
        planned.push(k + 1);
    }
    ids.truncate(len);
    let p0 = prompt.len() - 1;
    let mask = (0..len).map(|i| u8::from(i >= p0)).collect();
    (seq(target, 0, ids, mask), planned)
}

fn check_tau_chain(attention: &str) {
    let b = backend(attention);
    let cfg = drafter_config(4);
    let t = target(&b, &cfg);
    // A larger init scale than training's 0.02, so predictions depend on the context.
    let d = drafter(&b, &cfg, 0.2, 11);
    let (ids, mask) = data_sample(3);
    let p0 = mask.iter().position(|&m| m == 1).unwrap();
    let prompt = &ids[p0 - 24..=p0];

    // Planned acceptance patterns, including full blocks (3 of 3) and rejections (0).
    let mut seqs = Vec::new();
    for (plan, len) in [
        (&[0usize, 3, 1, 2, 3, 0][..], 70),
        (&[2, 3, 3, 0, 1][..], 61),
    ] {
        let (s, planned) = generate(&t, &d, prompt, plan, len);
        let got = sequence_cycles(&d, &s, &[]).unwrap();
        assert_eq!(
            got,
            sequential_cycles(&d, &s),
            "{attention}: batched vs sequential"
        );
        // All but the last cycle (cut by the end of the sequence) follow the plan.
        assert!(got.len() >= 10);
        assert_eq!(
            got[..got.len() - 1],
            planned[..got.len() - 1],
            "{attention}"
        );
        assert!(got.contains(&4) && got.contains(&1));
        seqs.push((s, got));
    }

    // More anchors than one batched forward takes (256), so the chunk boundary is crossed.
    let (long, planned) = generate(&t, &d, &prompt[16..], &[3, 2, 3, 0, 3, 1, 3], 300);
    let got = sequence_cycles(&d, &long, &[]).unwrap();
    assert_eq!(
        got,
        sequential_cycles(&d, &long),
        "{attention}: long sequence"
    );
    assert_eq!(
        got[..got.len() - 1],
        planned[..got.len() - 1],
        "{attention}"
    );
    seqs.push((long, got));

    // evaluate_tau: mean over sequences of per-sequence mean tau; sequences without a
    // completion to draft (no supervised token, or only the last one) are left out.
    let (ids, _) = data_sample(7);
    let n = ids.len();
    let none = seq(&t, 2, ids.clone(), vec![0; n]);
    let last_only = seq(&t, 3, ids, (0..n).map(|i| u8::from(i + 1 == n)).collect());
    let mut all: Vec<HiddenSeq> = seqs.iter().map(|(s, _)| clone_seq(s)).collect();
    all.insert(1, none);
    all.push(last_only);
    let report = evaluate_tau(&d, &all, &[]).unwrap();
    let means: Vec<f64> = seqs
        .iter()
        .map(|(_, c)| c.iter().sum::<usize>() as f64 / c.len() as f64)
        .collect();
    assert_eq!(report.sequences, 3);
    assert_eq!(
        report.cycles,
        seqs.iter().map(|(_, c)| c.len()).sum::<usize>()
    );
    assert_eq!(report.per_sequence, means);
    assert!((report.tau - means.iter().sum::<f64>() / 3.0).abs() < 1e-12);

    // Nothing to measure (the issue's `tau=NaN sequences=0`): an error, never a NaN tau.
    for none in [&all[1..2], &all[all.len() - 1..], &[]] {
        match evaluate_tau(&d, none, &[]) {
            Err(e @ TrainError::NoEvalSequence { .. }) => {
                assert!(e.to_string().contains("tau is undefined"), "{e}")
            }
            other => panic!("expected NoEvalSequence, got {other:?}"),
        }
    }
}

#[test]
fn tau_chain_matches_sequential_definition_reference_attention() {
    check_tau_chain("reference");
}

#[test]
fn tau_chain_matches_sequential_definition_tiled_attention() {
    check_tau_chain("tiled");
}

// ---------------------------------------------------------------------------------------------
// LR schedule and clipping.
// ---------------------------------------------------------------------------------------------

#[test]
fn lr_schedule_edges() {
    // No warm-up: the first step is at the peak; cosine to the floor; clamped after the end.
    let s = LrSchedule::new(1e-3, 10, 0.0, 0.1);
    assert_eq!(s.warmup_steps, 0);
    assert_eq!(s.lr(0), 1e-3);
    assert!((s.lr(10) - 1e-4).abs() < 1e-15);
    assert_eq!(s.lr(25), s.lr(10), "past the end stays at the floor");
    assert!(
        (s.lr(5) - 5.5e-4).abs() < 1e-15,
        "half way is the mid-point of peak and floor"
    );
    for k in 0..12 {
        assert!(s.lr(k + 1) <= s.lr(k) && s.lr(k) >= 1e-4 - 1e-18);
    }
    assert!(
        s.lr(9) > 1e-4,
        "the last trained step is still above the floor"
    );

    // Half warm-up: linear from peak/W at step 0 to the peak at step W-1.
    let w = LrSchedule::new(2.0, 10, 0.5, 0.0);
    assert_eq!(w.warmup_steps, 5);
    for k in 0..5 {
        assert!((w.lr(k) - 2.0 * (k + 1) as f64 / 5.0).abs() < 1e-12);
    }
    assert_eq!(w.lr(5), 2.0);

    // Degenerate lengths stay finite.
    for total in [0, 1] {
        let d = LrSchedule::new(3e-4, total, 0.04, 0.0);
        assert_eq!(d.lr(0), 3e-4, "total {total}");
    }
    let all_warm = LrSchedule::new(1.0, 4, 1.0, 0.0);
    assert_eq!(all_warm.lr(3), 1.0);
    assert!(all_warm.lr(4).is_finite());
}

#[test]
fn grad_norm_and_clipping() {
    let b = backend("reference");
    let cfg = drafter_config(4);
    let mut grads = DrafterParams::zeros(b.as_ref(), &cfg).unwrap();
    let fc: Vec<f32> = (0..grads.fc.numel())
        .map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 1e-4)
        .collect();
    let norm_g: Vec<f32> = (0..cfg.hidden_size).map(|i| i as f32 * 0.01).collect();
    grads.fc = b
        .upload(&fc, &[cfg.hidden_size, 2 * cfg.hidden_size])
        .unwrap();
    grads.norm = b.upload(&norm_g, &[cfg.hidden_size]).unwrap();
    let expect = fc
        .iter()
        .chain(&norm_g)
        .map(|&x| (x as f64).powi(2))
        .sum::<f64>()
        .sqrt();
    let norm = grad_norm(b.as_ref(), &grads).unwrap();
    assert!((norm - expect).abs() <= 1e-9 * expect, "{norm} vs {expect}");

    // Below the limit, or clipping disabled (0): factor 1. Above: max / (norm + 1e-6)
    // (PyTorch's clip_grad_norm_).
    assert_eq!(clip_factor(norm, 2.0 * norm), 1.0);
    assert_eq!(clip_factor(norm, 0.0), 1.0);
    let max = norm / 4.0;
    let f = clip_factor(norm, max);
    assert_eq!(f, max / (norm + 1e-6));

    // The factor is applied inside AdamW's pass, without touching the gradients: the update
    // equals, bit for bit, one on gradients scaled beforehand (both round g * f to f32), and
    // the gradients scaled that way have the clipped norm.
    let snapshot = |g: &DrafterParams| -> Vec<Vec<f32>> {
        g.tensors().iter().map(|t| b.download(t).unwrap()).collect()
    };
    let before = snapshot(&grads);
    let params = |seed: u64| {
        let mut p = DrafterParams::zeros(b.as_ref(), &cfg).unwrap();
        for (i, t) in p.tensors_mut().into_iter().enumerate() {
            let n = t.numel();
            let v: Vec<f32> = (0..n)
                .map(|j| ((j * 31 + i * 17 + seed as usize) % 97) as f32 * 0.01 - 0.48)
                .collect();
            *t = b.upload(&v, t.dims()).unwrap();
        }
        p
    };
    let (mut fused, mut plain) = (params(3), params(3));
    let mut opt_fused = AdamW::new(b.as_ref(), &cfg, HYPER).unwrap();
    let mut opt_plain = AdamW::new(b.as_ref(), &cfg, HYPER).unwrap();
    opt_fused
        .update(b.as_ref(), &mut fused, &grads, 1e-2, f as f32)
        .unwrap();
    assert_eq!(snapshot(&grads), before, "grads are only read");
    let mut scaled = DrafterParams::zeros(b.as_ref(), &cfg).unwrap();
    for (s, g) in scaled.tensors_mut().into_iter().zip(grads.tensors()) {
        *s = b.copy(g).unwrap();
        b.scale_assign(s, f as f32).unwrap();
    }
    opt_plain
        .update(b.as_ref(), &mut plain, &scaled, 1e-2, 1.0)
        .unwrap();
    assert_eq!(snapshot(&fused), snapshot(&plain));
    assert_ne!(
        snapshot(&fused),
        snapshot(&params(3)),
        "the update moved something"
    );
    let after = grad_norm(b.as_ref(), &scaled).unwrap();
    assert!((after - max).abs() <= 1e-5 * max, "{after} vs {max}");
}

// ---------------------------------------------------------------------------------------------
// Replica: non-finite steps and resumable state.
// ---------------------------------------------------------------------------------------------

struct Solo;

impl Communicator for Solo {
    fn rank(&self) -> usize {
        0
    }
    fn world_size(&self) -> usize {
        1
    }
    fn all_reduce_sum(&self, _: &mut [f32]) -> Result<(), String> {
        Ok(())
    }
}

const HYPER: AdamWHyper = AdamWHyper {
    beta1: 0.9,
    beta2: 0.999,
    eps: 1e-8,
    weight_decay: 0.0,
};

fn replica(
    b: &Arc<dyn Backend>,
    cfg: &DrafterConfig,
    seed: u64,
    max_nonfinite: u64,
) -> DrafterReplica {
    let d = drafter(b, cfg, 0.02, seed);
    let opt = AdamW::new(b.as_ref(), cfg, HYPER).unwrap();
    DrafterReplica::new(d, opt, false, 1.0, max_nonfinite).unwrap()
}

fn params_of(r: &DrafterReplica) -> Vec<Vec<u32>> {
    let b = r.drafter.backend();
    r.drafter
        .params
        .tensors()
        .iter()
        .map(|t| b.download(t).unwrap().iter().map(|x| x.to_bits()).collect())
        .collect()
}

/// Three prepared training sequences, and a copy of the first with a NaN feature row.
fn training_batches(b: &Arc<dyn Backend>, cfg: &DrafterConfig) -> (Vec<PreparedSeq>, PreparedSeq) {
    let t = target(b, cfg);
    let spec = BlockSpec {
        block_size: cfg.block_size,
        num_anchors: 8,
        gamma: 4.0,
        mask_token_id: MASK,
        seed: 3,
    };
    let mut good = Vec::new();
    for i in 0..3 {
        let (ids, mask) = data_sample(20 + i);
        let p0 = mask.iter().position(|&m| m == 1).unwrap();
        let r = p0 - 16..p0 + 32;
        let s = seq(&t, i as u64, ids[r.clone()].to_vec(), mask[r].to_vec());
        good.push(PreparedSeq::new(s, 0, &spec));
    }
    let g = &good[0];
    let kh = cfg.hidden_size * cfg.target_layer_ids.len();
    let mut features = host(&g.features).to_vec();
    features[..kh].fill(f32::NAN); // position 0: context of every anchor
    let bad = PreparedSeq {
        features: Features::Host(features),
        anchors: g.anchors.clone(),
        block_ids: g.block_ids.clone(),
        positions: g.positions.clone(),
        labels: g.labels.clone(),
        weights: g.weights.clone(),
        doc_starts: Vec::new(),
        ctx_positions: Vec::new(),
    };
    (good, bad)
}

fn step(
    r: &mut DrafterReplica,
    s: &PreparedSeq,
) -> Result<dflash_training::StepSummary, TrainError> {
    r.accumulate(&s.as_input())?;
    r.finish_step(&Solo, 1e-3)
}

/// A non-finite step is skipped (weights, moments and AdamW's count untouched) and leaves no
/// trace: the next finite step gives exactly the weights of a replica that never saw it.
/// `max_nonfinite_steps` consecutive ones are an error.
#[test]
fn non_finite_step_is_skipped_without_trace_and_a_run_of_them_stops() {
    let b = backend("tiled");
    let cfg = drafter_config(4);
    let (good, bad) = training_batches(&b, &cfg);

    let mut r = replica(&b, &cfg, 1, 2);
    let mut clean = replica(&b, &cfg, 1, 2);
    assert!(step(&mut r, &good[0]).unwrap().applied);
    assert!(step(&mut clean, &good[0]).unwrap().applied);

    let before = params_of(&r);
    let s = step(&mut r, &bad).unwrap();
    assert!(!s.applied);
    assert!(!s.stats.loss().is_finite() || !s.grad_norm.is_finite());
    assert_eq!(
        params_of(&r),
        before,
        "a skipped step does not touch the weights"
    );
    assert_eq!((r.nonfinite_run, r.optimizer.step, r.step), (1, 1, 2));

    let s = step(&mut r, &good[1]).unwrap();
    assert!(s.applied && s.grad_norm.is_finite());
    assert_eq!((r.nonfinite_run, r.optimizer.step), (0, 2));
    step(&mut clean, &good[1]).unwrap();
    assert_eq!(
        params_of(&r),
        params_of(&clean),
        "no gradient left over from the skipped step"
    );

    assert!(!step(&mut r, &bad).unwrap().applied);
    match step(&mut r, &bad) {
        // The features were NaN (the target's side), and the error says so.
        Err(
            e @ TrainError::NonFinite {
                count: 2,
                limit: 2,
                step: 4,
                origin: NonFiniteSource::TargetFeatures,
            },
        ) => assert!(
            e.to_string()
                .contains("target's features were already non-finite")
        ),
        other => panic!("expected NonFinite after 2 consecutive steps, got {other:?}"),
    }
}

/// With finite features, a non-finite loss is the drafter's own (here a NaN in its `fc`
/// weight, set on the device past every load check): the error names the drafter, not the
/// target.
#[test]
fn a_non_finite_loss_from_finite_features_names_the_drafter() {
    let b = backend("tiled");
    let cfg = drafter_config(4);
    let (good, _) = training_batches(&b, &cfg);
    let mut r = replica(&b, &cfg, 1, 1);
    let fc = &mut r.drafter.params.fc;
    let mut w = b.download(fc).unwrap();
    w[7] = f32::NAN;
    let dims = fc.dims().to_vec();
    *fc = b.upload(&w, &dims).unwrap();
    match step(&mut r, &good[0]) {
        Err(
            e @ TrainError::NonFinite {
                count: 1,
                limit: 1,
                step: 0,
                origin: NonFiniteSource::Drafter,
            },
        ) => assert!(
            e.to_string()
                .contains("features were finite, so the drafter's forward produced it"),
            "{e}"
        ),
        other => panic!("expected NonFinite from the drafter, got {other:?}"),
    }
}

/// Saving after a step and loading into a fresh replica (other initial weights) continues
/// bit for bit.
#[test]
fn state_round_trip_continues_bit_for_bit() {
    let b = backend("tiled");
    let cfg = drafter_config(4);
    let (good, _) = training_batches(&b, &cfg);
    let mut a = replica(&b, &cfg, 1, 10);
    step(&mut a, &good[0]).unwrap();
    step(&mut a, &good[1]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let extra = serde_json::json!({ "epoch": 0, "cursor": 17 });
    state::save(dir.path(), &a, extra.clone()).unwrap();

    let mut c = replica(&b, &cfg, 99, 10);
    let st = state::load_into(dir.path(), &mut c).unwrap();
    assert_eq!(st.extra, extra);
    assert_eq!((c.step, c.optimizer.step, c.nonfinite_run), (2, 2, 0));
    assert_eq!(params_of(&c), params_of(&a));
    let (sa, sc) = (
        step(&mut a, &good[2]).unwrap(),
        step(&mut c, &good[2]).unwrap(),
    );
    assert_eq!(sa, sc);
    assert_eq!(params_of(&c), params_of(&a));

    // A checkpoint of another drafter shape is refused, naming the directory.
    let mut other = replica(&b, &drafter_config(8), 1, 10);
    let e = state::load_into(dir.path(), &mut other)
        .unwrap_err()
        .to_string();
    assert!(e.contains(&dir.path().display().to_string()), "{e}");
}

/// A snapshot writes the files `save` would have written at its step, byte for byte, even
/// after the replica has trained on (the background checkpoint's contract).
#[test]
fn snapshot_saves_the_state_of_its_step_after_training_goes_on() {
    let b = backend("tiled");
    let cfg = drafter_config(4);
    let (good, _) = training_batches(&b, &cfg);
    let mut a = replica(&b, &cfg, 1, 10);
    step(&mut a, &good[0]).unwrap();
    let extra = serde_json::json!({ "epoch": 0 });
    let now = tempfile::tempdir().unwrap();
    state::save(now.path(), &a, extra.clone()).unwrap();
    let snap = state::Snapshot::take(&a).unwrap();
    assert_eq!(snap.step(), a.step);
    step(&mut a, &good[1]).unwrap();
    let later = tempfile::tempdir().unwrap();
    // Written from another thread, as the pipeline's checkpoint thread does.
    let (dir, ex) = (later.path().to_path_buf(), extra.clone());
    std::thread::spawn(move || snap.save(&dir, ex).unwrap())
        .join()
        .unwrap();
    let mut files: Vec<_> = std::fs::read_dir(now.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    files.sort();
    assert_eq!(files.len(), 4, "{files:?}");
    for f in &files {
        let (x, y) = (
            std::fs::read(now.path().join(f)).unwrap(),
            std::fs::read(later.path().join(f)).unwrap(),
        );
        assert!(x == y, "{f:?} differs between save and the snapshot's save");
    }
    // And the replica did move on: its own state is not the snapshot's.
    let moved = tempfile::tempdir().unwrap();
    state::save(moved.path(), &a, extra).unwrap();
    let w = "model.safetensors";
    assert_ne!(
        std::fs::read(now.path().join(w)).unwrap(),
        std::fs::read(moved.path().join(w)).unwrap()
    );
}

/// The serving loop commits exactly the completion: summed over cycles, the committed
/// tokens equal the tokens to generate (no bonus token past the end is counted), and a stop
/// token ends generation right after it is committed.
#[test]
fn cycles_commit_exactly_the_completion_and_stop_at_eos() {
    let b = backend("tiled");
    let cfg = drafter_config(4);
    let t = target(&b, &cfg);
    // Large init: predictions vary, so both full and partial acceptance occur over many seeds.
    for seed in 0..4 {
        let d = drafter(&b, &cfg, 0.2, seed);
        let (ids, mask) = data_sample(seed as usize);
        let p0 = mask.iter().position(|&m| m == 1).unwrap();
        let s = seq(&t, 0, ids.clone(), mask);
        let n = ids.len();
        let cycles = sequence_cycles(&d, &s, &[]).unwrap();
        assert_eq!(
            cycles.iter().sum::<usize>(),
            n - 1 - p0,
            "seed {seed}: whole completion"
        );
        assert!(cycles.iter().all(|&c| (1..=cfg.block_size).contains(&c)));

        // Stop at the first occurrence of some completion token: generation ends there.
        let eos_at = p0 + 1 + (n - p0 - 1) / 2;
        let eos = ids[eos_at];
        let first = p0 + ids[p0..].iter().position(|&x| x == eos).unwrap();
        let cut = sequence_cycles(&d, &s, &[eos]).unwrap();
        let expect = first.saturating_sub(p0);
        assert_eq!(
            cut.iter().sum::<usize>(),
            expect,
            "seed {seed}: stop token at {first}"
        );
    }
}

/// A packed micro-batch is the same computation as its sequences one by one: the target's
/// packed forward (document mask, per-document positions) gives each sequence's features, and
/// one drafter forward/backward over all blocks (per-document DFlash masks) gives the same
/// loss statistics and gradients as accumulating the sequences separately. Tolerance: the
/// reference backend accumulates in f64 and stores f32, so the two paths differ only by f32
/// rounding of intermediates summed in another order: 1e-5 absolute + 1e-4 relative.
#[test]
fn packed_micro_batch_matches_sequence_by_sequence() {
    use dflash_core::pipeline::{HiddenBatch, SeqMeta};
    use dflash_training::PreparedBatch;
    let close = |what: &str, got: &[f32], want: &[f32]| {
        assert_eq!(got.len(), want.len(), "{what}: length");
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-5 + 1e-4 * w.abs(),
                "{what}[{i}]: packed {g} vs one by one {w}"
            );
        }
    };
    for attention in ["reference", "tiled"] {
        let b = backend(attention);
        let cfg = drafter_config(4);
        let t = target(&b, &cfg);
        // Three real samples of different lengths, one of them short.
        let samples: Vec<(Vec<u32>, Vec<u8>)> = [(0, 160), (1, 37), (2, 120)]
            .iter()
            .map(|&(i, len)| {
                let (ids, mask) = data_sample(i);
                let n = len.min(ids.len());
                (ids[..n].to_vec(), mask[..n].to_vec())
            })
            .collect();
        let docs: Vec<&[u32]> = samples.iter().map(|(ids, _)| ids.as_slice()).collect();
        let packed = t.features_packed(&docs).unwrap();
        let one_by_one: Vec<f32> = docs
            .iter()
            .flat_map(|ids| t.features(ids).unwrap().to_host().unwrap())
            .collect();
        close(
            &format!("{attention}: features"),
            &packed.to_host().unwrap(),
            &one_by_one,
        );

        let spec = BlockSpec {
            block_size: cfg.block_size,
            num_anchors: 12,
            gamma: 4.0,
            mask_token_id: MASK,
            seed: 5,
        };
        let d = drafter(&b, &cfg, 0.05, 3);
        let mut g_seq = DrafterParams::zeros(b.as_ref(), &cfg).unwrap();
        let mut stats_seq = dflash_core::LossStats::default();
        let mut anchors_seq = Vec::new();
        let mut start = 0;
        for (k, (ids, mask)) in samples.iter().enumerate() {
            let s = seq(&t, 40 + k as u64, ids.clone(), mask.clone());
            let p = PreparedSeq::new(s, 2, &spec);
            anchors_seq.extend(p.anchors.iter().map(|a| a + start));
            start += ids.len() as i32;
            if p.anchors.is_empty() {
                continue; // a prompt-only document: no blocks (the replica skips it too)
            }
            let st = d
                .forward_backward(&p.as_input(), 1.0, &mut g_seq, false)
                .unwrap();
            stats_seq.merge(&st);
        }
        let batch = HiddenBatch {
            epoch: 2,
            step: 0,
            micro: 0,
            seqs: samples
                .iter()
                .enumerate()
                .map(|(k, (ids, mask))| SeqMeta {
                    sample_id: 40 + k as u64,
                    ids: ids.clone(),
                    loss_mask: mask.clone(),
                })
                .collect(),
            features: Some(packed),
        };
        let p = PreparedBatch::packed(batch, &spec).unwrap();
        assert_eq!(
            p.anchors, anchors_seq,
            "{attention}: the same anchors, shifted to packed rows"
        );
        let mut g_packed = DrafterParams::zeros(b.as_ref(), &cfg).unwrap();
        let stats = d
            .forward_backward(&p.as_input(), 1.0, &mut g_packed, false)
            .unwrap();
        assert!(stats.weight_sum > 0.0);
        assert_eq!(
            stats.weight_sum, stats_seq.weight_sum,
            "{attention}: same weights"
        );
        assert_eq!(
            (stats.counted, stats.correct),
            (stats_seq.counted, stats_seq.correct)
        );
        let rel = (stats.weighted_loss - stats_seq.weighted_loss).abs() / stats_seq.weighted_loss;
        assert!(
            rel < 1e-5,
            "{attention}: loss {} vs {}",
            stats.weighted_loss,
            stats_seq.weighted_loss
        );
        let names = DrafterParams::layout(&cfg);
        for ((name, _), (a, w)) in names
            .iter()
            .zip(g_packed.tensors().iter().zip(g_seq.tensors()))
        {
            let (a, w) = (b.download(a).unwrap(), b.download(w).unwrap());
            assert!(w.iter().any(|&x| x != 0.0), "{name}: gradient is zero");
            close(&format!("{attention}: d {name}"), &a, &w);
        }
    }
}
