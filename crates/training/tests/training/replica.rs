//! The drafter replica: non-finite steps skipped without trace (and a run of them stopping
//! with the source named), and the resumable state saved, snapshotted and loaded bit for bit.

use std::path::Path;
use std::sync::{Arc, Barrier, Mutex};

use dflash_config::{DType, DrafterConfig, DrafterShape, Qwen3Config};
use dflash_core::pipeline::Features;
use dflash_core::{Backend, Communicator};
use dflash_training::{
    AdamW, BlockSpec, DrafterReplica, NonFiniteSource, PreparedSeq, TrainError, state,
};

use crate::support::{
    HYPER, MASK, TARGET, backend, data_sample, drafter, drafter_config, host, seq, target,
};

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

/// A checkpoint directory loads as the drafter in a serving engine that reads every
/// `*.safetensors` file of a directory as weights (vLLM's default loader): the model is its
/// only such file. A checkpoint of the older layout, whose moments were in
/// `optimizer.safetensors`, still resumes bit for bit.
#[test]
fn the_model_is_a_checkpoints_one_safetensors_file_and_the_older_layout_resumes() {
    let b = backend("tiled");
    let cfg = drafter_config(4);
    let (good, _) = training_batches(&b, &cfg);
    let mut a = replica(&b, &cfg, 1, 10);
    step(&mut a, &good[0]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    state::save(dir.path(), &a, serde_json::Value::Null).unwrap();
    let safetensors: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".safetensors"))
        .collect();
    assert_eq!(safetensors, ["model.safetensors"]);

    std::fs::rename(
        dir.path().join(state::OPTIMIZER_STATE),
        dir.path().join(state::LEGACY_OPTIMIZER_STATE),
    )
    .unwrap();
    let mut c = replica(&b, &cfg, 99, 10);
    state::load_into(dir.path(), &mut c).unwrap();
    assert_eq!((c.step, c.optimizer.step), (1, 1));
    let (sa, sc) = (
        step(&mut a, &good[1]).unwrap(),
        step(&mut c, &good[1]).unwrap(),
    );
    assert_eq!(sa, sc);
    assert_eq!(params_of(&c), params_of(&a), "the moments were restored");

    // Neither file: the error names the current one.
    std::fs::remove_file(dir.path().join(state::LEGACY_OPTIMIZER_STATE)).unwrap();
    let e = state::load_into(dir.path(), &mut c)
        .unwrap_err()
        .to_string();
    assert!(e.contains(state::OPTIMIZER_STATE), "{e}");
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

/// A checkpoint resumes into a run whose drafter config names another storage dtype (a run
/// started from a bf16 `init_from` drafter: its checkpoints hold f32 master weights); one of
/// another architecture is refused, naming `config.json` and each field that differs.
#[test]
fn a_checkpoint_resumes_whatever_the_dtype_and_another_shape_is_refused_naming_the_field() {
    let b = backend("tiled");
    let cfg = drafter_config(4);
    let (good, _) = training_batches(&b, &cfg);
    let mut a = replica(&b, &cfg, 1, 10);
    step(&mut a, &good[0]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    state::save(dir.path(), &a, serde_json::Value::Null).unwrap();

    let bf16 = DrafterConfig {
        dtype: DType::BFloat16,
        ..cfg.clone()
    };
    let mut c = replica(&b, &bf16, 99, 10);
    state::load_into(dir.path(), &mut c).unwrap();
    assert_eq!((c.step, c.optimizer.step), (1, 1));
    assert_eq!(params_of(&c), params_of(&a));
    assert_eq!(
        c.drafter.config().dtype,
        DType::BFloat16,
        "the run's own config"
    );

    let t = Qwen3Config::from_file(Path::new(TARGET).join("config.json")).unwrap();
    let two_layers = DrafterConfig {
        dtype: DType::BFloat16,
        ..DrafterConfig::for_target(
            &t,
            &DrafterShape {
                num_layers: 2,
                block_size: 4,
                num_target_features: 2,
                intermediate_size: Some(cfg.intermediate_size / 2),
                dtype: DType::Float32,
                ..DrafterShape::standard(MASK)
            },
        )
        .unwrap()
    };
    let mut other = replica(&b, &two_layers, 1, 10);
    let before = params_of(&other);
    let e = state::load_into(dir.path(), &mut other)
        .unwrap_err()
        .to_string();
    let config_json = dir.path().join("config.json").display().to_string();
    for says in [
        config_json.as_str(),
        "num_hidden_layers is 1 in the checkpoint but 2 in this run",
        &format!(
            "intermediate_size is {} in the checkpoint but {} in this run",
            cfg.intermediate_size,
            cfg.intermediate_size / 2
        ),
    ] {
        assert!(e.contains(says), "{says:?} not in: {e}");
    }
    assert!(!e.contains("dtype"), "the dtype is no difference: {e}");
    assert_eq!(params_of(&other), before, "nothing loaded");
    assert_eq!(other.step, 0);
}

/// A group of replicas summing through host memory, one thread each.
struct Group {
    rank: usize,
    world: usize,
    shared: Arc<(Mutex<Vec<f32>>, Barrier)>,
}

impl Group {
    fn new(world: usize) -> Vec<Group> {
        let shared = Arc::new((Mutex::new(Vec::new()), Barrier::new(world)));
        (0..world)
            .map(|rank| Group {
                rank,
                world,
                shared: shared.clone(),
            })
            .collect()
    }
}

impl Communicator for Group {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world
    }
    fn all_reduce_sum(&self, data: &mut [f32]) -> Result<(), String> {
        let (acc, barrier) = &*self.shared;
        if self.rank == 0 {
            *acc.lock().unwrap() = vec![0.0; data.len()];
        }
        barrier.wait();
        for (a, x) in acc.lock().unwrap().iter_mut().zip(data.iter()) {
            *a += *x;
        }
        barrier.wait();
        data.copy_from_slice(&acc.lock().unwrap());
        barrier.wait();
        Ok(())
    }
}

/// A copy of `s` with the features of its last position NaN: no block attends that context
/// row (every anchor lies before it), so the loss stays finite, but the `fc` gradient sums
/// `0 * NaN` over it: a step with a finite loss and a non-finite gradient.
fn nan_unattended_row(s: &PreparedSeq, cfg: &DrafterConfig) -> PreparedSeq {
    let kh = cfg.hidden_size * cfg.target_layer_ids.len();
    let mut features = host(&s.features).to_vec();
    let n = features.len() / kh;
    assert!(s.anchors.iter().all(|&a| a < n as i32 - 1));
    features[(n - 1) * kh..].fill(f32::NAN);
    PreparedSeq {
        features: Features::Host(features),
        anchors: s.anchors.clone(),
        block_ids: s.block_ids.clone(),
        positions: s.positions.clone(),
        labels: s.labels.clone(),
        weights: s.weights.clone(),
        doc_starts: s.doc_starts.clone(),
        ctx_positions: s.ctx_positions.clone(),
    }
}

/// A skipped step names its cause on every replica: of two replicas, only one trained on NaN
/// features, and both blame the target.
#[test]
fn every_replica_names_the_cause_of_the_step_it_skipped() {
    let b = backend("tiled");
    let cfg = drafter_config(4);
    let (good, bad) = training_batches(&b, &cfg);
    let mut pair = [replica(&b, &cfg, 1, 1), replica(&b, &cfg, 1, 1)];
    let batches = [&bad, &good[1]];
    let origins: Vec<_> = std::thread::scope(|scope| {
        let handles: Vec<_> = pair
            .iter_mut()
            .zip(Group::new(2))
            .zip(batches)
            .map(|((r, comm), s)| {
                scope.spawn(move || {
                    r.accumulate(&s.as_input()).unwrap();
                    match r.finish_step(&comm, 1e-3) {
                        Err(TrainError::NonFinite { origin, .. }) => origin,
                        other => panic!("expected NonFinite, got {other:?}"),
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(origins, [NonFiniteSource::TargetFeatures; 2]);
}

/// The cause is the step's own: a gradient-only NaN after a step with NaN features is the
/// gradient's, not the target's.
#[test]
fn a_gradient_only_nan_after_nan_features_names_the_gradient() {
    let b = backend("tiled");
    let cfg = drafter_config(4);
    let (good, bad) = training_batches(&b, &cfg);
    let gradient_only = nan_unattended_row(&good[0], &cfg);
    let mut r = replica(&b, &cfg, 1, 2);
    let s = step(&mut r, &gradient_only).unwrap();
    assert!(s.stats.loss().is_finite() && !s.grad_norm.is_finite() && !s.applied);
    let mut r = replica(&b, &cfg, 1, 2);
    assert!(!step(&mut r, &bad).unwrap().applied);
    match step(&mut r, &gradient_only) {
        Err(TrainError::NonFinite {
            count: 2,
            step: 1,
            origin,
            ..
        }) => assert_eq!(origin, NonFiniteSource::Gradient),
        other => panic!("expected NonFinite at step 1, got {other:?}"),
    }
}
