//! Resumable training state: the drafter (serving layout), AdamW moments, step counters and
//! whatever the pipeline adds (epoch, data cursor, seed). Written into a fresh directory;
//! the caller publishes it by atomically rewriting a `latest` pointer, so a crash mid-save
//! leaves the previous checkpoint intact.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;

use dflash_config::{DType, DrafterConfig};
use dflash_core::Backend;
use dflash_models::DrafterParams;
use dflash_models::checkpoint::{Fetch, load_drafter, save_drafter_via};
use dflash_models::safetensors_io::{Dtype, TensorFiles, write_atomic, write_tensors_streaming};

use crate::error::{Result, TrainError};
use crate::replica::DrafterReplica;

pub const TRAINER_STATE: &str = "trainer_state.json";
/// AdamW's moments (safetensors format, tensors `m.NAME` and `v.NAME`). Not named
/// `*.safetensors`: serving engines (vLLM's default loader) read every `*.safetensors` file
/// of a directory without an index as weights, so the checkpoint directory stays loadable as
/// the drafter itself only while `model.safetensors` is its one such file.
pub const OPTIMIZER_STATE: &str = "optimizer.st";
/// Where checkpoints written before [`OPTIMIZER_STATE`] kept the moments: still read, so
/// their runs resume.
pub const LEGACY_OPTIMIZER_STATE: &str = "optimizer.safetensors";

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct TrainerState {
    /// Next step to run (0-based).
    pub step: u64,
    /// AdamW's applied-update count (bias correction).
    pub adam_step: u64,
    pub nonfinite_run: u64,
    /// Pipeline-owned fields (epoch, seed, data cursor, ...).
    pub extra: serde_json::Value,
}

fn state_err(path: &Path, detail: impl ToString) -> TrainError {
    TrainError::State {
        path: path.to_path_buf(),
        detail: detail.to_string(),
    }
}

/// Saves `replica` into `dir` (which should be new and empty).
pub fn save(dir: &Path, replica: &DrafterReplica, extra: serde_json::Value) -> Result<()> {
    write_state(dir, &StateRef::of(replica), extra)
}

/// What [`save`] writes, borrowed: from a live replica or from a [`Snapshot`].
struct StateRef<'a> {
    backend: &'a dyn Backend,
    config: &'a DrafterConfig,
    params: &'a DrafterParams,
    m: &'a DrafterParams,
    v: &'a DrafterParams,
    counters: Counters,
    fetch: Fetch,
}

/// The replica's step counters.
#[derive(Debug, Clone, Copy)]
struct Counters {
    step: u64,
    adam_step: u64,
    nonfinite_run: u64,
}

impl<'a> StateRef<'a> {
    fn of(replica: &'a DrafterReplica) -> Self {
        StateRef {
            backend: replica.drafter.backend().as_ref(),
            config: replica.drafter.config(),
            params: &replica.drafter.params,
            m: &replica.optimizer.m,
            v: &replica.optimizer.v,
            counters: Counters {
                step: replica.step,
                adam_step: replica.optimizer.step,
                nonfinite_run: replica.nonfinite_run,
            },
            fetch: Fetch::InOrder,
        }
    }
}

fn write_state(dir: &Path, st: &StateRef<'_>, extra: serde_json::Value) -> Result<()> {
    let b = st.backend;
    // The f32 master weights, whatever dtype the served drafter is saved in.
    let master = DrafterConfig {
        dtype: DType::Float32,
        ..st.config.clone()
    };
    save_drafter_via(b, dir, &master, st.params, st.fetch)?;
    // Streamed one tensor at a time: the moments are twice the weights' size.
    let layout = DrafterParams::layout(st.config);
    let mut entries = Vec::with_capacity(2 * layout.len());
    let mut moments = Vec::with_capacity(2 * layout.len());
    for (prefix, m) in [("m", st.m), ("v", st.v)] {
        for ((name, shape), t) in layout.iter().zip(m.tensors()) {
            entries.push((format!("{prefix}.{name}"), shape.clone()));
            moments.push(t);
        }
    }
    write_tensors_streaming(
        &dir.join(OPTIMIZER_STATE),
        &entries,
        Dtype::F32,
        None,
        &|i| st.fetch.download(b, moments[i]),
    )?;
    let state = TrainerState {
        step: st.counters.step,
        adam_step: st.counters.adam_step,
        nonfinite_run: st.counters.nonfinite_run,
        extra,
    };
    let json = serde_json::to_string_pretty(&state).expect("state serialises");
    write_atomic(&dir.join(TRAINER_STATE), json.as_bytes())?;
    Ok(())
}

/// A replica's resumable state copied on its own device at one step: weights and moments
/// (three times the weights' size in device memory, for as long as it lives) and the counters.
/// [`Snapshot::save`] writes the same files as [`save`] at that step, from any thread, while
/// the replica trains on.
pub struct Snapshot {
    backend: Arc<dyn Backend>,
    config: DrafterConfig,
    params: DrafterParams,
    m: DrafterParams,
    v: DrafterParams,
    counters: Counters,
}

impl Snapshot {
    /// Copies `replica`'s state on its device (device-to-device: no host memory, no PCIe).
    pub fn take(replica: &DrafterReplica) -> Result<Self> {
        let backend = replica.drafter.backend().clone();
        let b = backend.as_ref();
        let copy = |p: &DrafterParams| -> Result<DrafterParams> {
            let ts: std::result::Result<Vec<_>, _> =
                p.tensors().into_iter().map(|t| b.copy(t)).collect();
            Ok(DrafterParams::from_tensors(ts?))
        };
        let st = StateRef::of(replica);
        Ok(Snapshot {
            params: copy(st.params)?,
            m: copy(st.m)?,
            v: copy(st.v)?,
            config: st.config.clone(),
            counters: st.counters,
            backend,
        })
    }

    /// The step the snapshot resumes at.
    pub fn step(&self) -> u64 {
        self.counters.step
    }

    /// Writes the snapshot into `dir` (new and empty), as [`save`] would have at its step.
    pub fn save(&self, dir: &Path, extra: serde_json::Value) -> Result<()> {
        let st = StateRef {
            backend: self.backend.as_ref(),
            config: &self.config,
            params: &self.params,
            m: &self.m,
            v: &self.v,
            counters: self.counters,
            // Nothing queued writes the copies: the reads need not wait for the training.
            fetch: Fetch::Detached,
        };
        write_state(dir, &st, extra)
    }
}

/// Restores weights, moments and counters saved by [`save`] into `replica`, whose drafter
/// must be the checkpoint's (every field of its config but the storage dtype; an error names
/// the fields that differ). Returns the pipeline's extra fields.
pub fn load_into(dir: &Path, replica: &mut DrafterReplica) -> Result<TrainerState> {
    let b = replica.drafter.backend().clone();
    let b = b.as_ref();
    let config_path = dir.join("config.json");
    // Checked before any weight is uploaded: a mismatched checkpoint costs no device memory.
    let saved = DrafterConfig::from_file(&config_path).map_err(dflash_models::ModelError::from)?;
    let differing = config_differences(&saved, replica.drafter.config());
    if !differing.is_empty() {
        return Err(state_err(
            &config_path,
            format!(
                "this checkpoint's drafter differs from this run's: {}",
                differing.join("; ")
            ),
        ));
    }
    let (cfg, params) = load_drafter(b, dir)?;
    replica.drafter.params = params;
    let files = TensorFiles::open_file(&optimizer_state_path(dir))?;
    let layout = DrafterParams::layout(&cfg);
    for (prefix, moments) in [
        ("m", &mut replica.optimizer.m),
        ("v", &mut replica.optimizer.v),
    ] {
        for ((name, shape), t) in layout.iter().zip(moments.tensors_mut()) {
            *t = b.upload(&files.read_f32(&format!("{prefix}.{name}"), shape)?, shape)?;
        }
    }
    let state = read_state(dir)?;
    replica.step = state.step;
    replica.optimizer.step = state.adam_step;
    replica.nonfinite_run = state.nonfinite_run;
    Ok(state)
}

/// The moments' file of checkpoint `dir`: [`OPTIMIZER_STATE`], or [`LEGACY_OPTIMIZER_STATE`]
/// in a checkpoint of the older layout (when neither exists, the current name, which the
/// error then names).
pub fn optimizer_state_path(dir: &Path) -> std::path::PathBuf {
    let path = dir.join(OPTIMIZER_STATE);
    let legacy = dir.join(LEGACY_OPTIMIZER_STATE);
    if !path.exists() && legacy.exists() {
        legacy
    } else {
        path
    }
}

/// The fields (as `config.json` names them) in which a checkpoint's drafter config `saved`
/// differs from the run's `run`, each with both values; empty when they describe the same
/// drafter. The storage dtype is left out: a checkpoint holds f32 master weights whatever
/// dtype the run's config names (an `init_from` drafter's, bf16 for the released ones).
fn config_differences(saved: &DrafterConfig, run: &DrafterConfig) -> Vec<String> {
    let fields = |c: &DrafterConfig| {
        let json = DrafterConfig {
            dtype: DType::Float32,
            ..c.clone()
        }
        .to_json();
        let mut flat = BTreeMap::new();
        flatten("", json, &mut flat);
        flat
    };
    let (a, b) = (fields(saved), fields(run));
    let missing = serde_json::Value::Null;
    let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    keys.into_iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .map(|k| {
            format!(
                "{k} is {} in the checkpoint but {} in this run",
                a.get(k).unwrap_or(&missing),
                b.get(k).unwrap_or(&missing)
            )
        })
        .collect()
}

/// `value`'s leaves into `out`, nested objects' keys joined with dots (`dflash_config.*`).
fn flatten(prefix: &str, value: serde_json::Value, out: &mut BTreeMap<String, serde_json::Value>) {
    match value {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                let key = match prefix {
                    "" => k,
                    p => format!("{p}.{k}"),
                };
                flatten(&key, v, out);
            }
        }
        v => {
            out.insert(prefix.to_string(), v);
        }
    }
}

/// Reads `dir/trainer_state.json`, cross-checked against itself and its directory: the
/// counters must add up (each step applied an update, was skipped as non-finite, or had
/// nothing to train on) and the step must be the one in the directory's `step-N` name.
pub fn read_state(dir: &Path) -> Result<TrainerState> {
    let path = dir.join(TRAINER_STATE);
    let text = std::fs::read_to_string(&path).map_err(|e| state_err(&path, e))?;
    let state: TrainerState = serde_json::from_str(&text).map_err(|e| state_err(&path, e))?;
    // Saturating: counters near u64::MAX (an edited file) are an error, not an overflow.
    if state.adam_step.saturating_add(state.nonfinite_run) > state.step {
        return Err(state_err(
            &path,
            format!(
                "adam_step {} + nonfinite_run {} exceed step {}: the counters disagree \
                 (edited, or from another run)",
                state.adam_step, state.nonfinite_run, state.step
            ),
        ));
    }
    if let Some(n) = dir
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix("step-"))
        .and_then(|n| n.parse::<u64>().ok())
        && n != state.step
    {
        return Err(state_err(
            &path,
            format!(
                "step {} but the checkpoint directory is step-{n}",
                state.step
            ),
        ));
    }
    Ok(state)
}
