//! Publishing a run's checkpoints under `checkpoints/`, and finding the latest one.

use std::path::{Path, PathBuf};
use std::time::Instant;

use dflash_models::safetensors_io::{sync_dir, write_atomic};
use dflash_training::state::{self, Snapshot};
use dflash_training::{DrafterReplica, TrainError};

use crate::error::{PipelineError, Result};

const LATEST: &str = "latest";

/// Latest published checkpoint directory of a run, if any.
pub fn latest_checkpoint(run_dir: &Path) -> Option<PathBuf> {
    let ckpts = run_dir.join("checkpoints");
    let name = std::fs::read_to_string(ckpts.join(LATEST)).ok()?;
    Some(ckpts.join(name.trim()))
}

/// Writes `checkpoints/step-N` with `save`, then atomically points `checkpoints/latest` at it,
/// then removes older ones: at every instant a complete checkpoint is published, on disk as
/// well as in the page cache. Returns the bytes written.
fn publish(run_dir: &Path, step: u64, save: impl FnOnce(&Path) -> Result<()>) -> Result<u64> {
    publish_synced(run_dir, step, save, &|d: &Path| Ok(sync_dir(d)?))
}

/// [`publish`], syncing directories with `sync` (the tests record the calls).
fn publish_synced(
    run_dir: &Path,
    step: u64,
    save: impl FnOnce(&Path) -> Result<()>,
    sync: &dyn Fn(&Path) -> Result<()>,
) -> Result<u64> {
    let ckpts = run_dir.join("checkpoints");
    let name = format!("step-{step}");
    let dir = ckpts.join(&name);
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(PipelineError::io(&dir))?;
    }
    save(&dir)?;
    let bytes = std::fs::read_dir(&dir)
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0);
    // A power loss must not leave `latest` naming a directory whose entry never reached the
    // disk (nor `checkpoints/` itself missing, on the first one): both synced before `latest`
    // is rewritten.
    sync(&ckpts)?;
    sync(run_dir)?;
    write_atomic(&ckpts.join(LATEST), name.as_bytes())?;
    // `latest` on disk before the checkpoint it named is removed (the write syncs its
    // directory too; said here, where the order is the contract).
    sync(&ckpts)?;
    dflash_models::fault::point("published");
    remove_stale(&ckpts, Some(&name), false);
    Ok(bytes)
}

/// The smallest checkpoint written in the background: ~1 s at a disk's speed. Below it the
/// write costs the drafter less than a snapshot's memory is worth, and a kill right after a
/// checkpoint finds it published (the crash suite's tiny runs rely on that).
pub(super) const BACKGROUND_MIN_BYTES: u64 = 1 << 30;

/// Bytes of a replica's checkpoint: f32 weights and both AdamW moments.
fn state_bytes(replica: &DrafterReplica) -> u64 {
    let n: usize = replica
        .drafter
        .params
        .tensors()
        .iter()
        .map(|t| t.numel())
        .sum();
    3 * 4 * n as u64
}

/// A finished checkpoint write.
#[derive(Debug, Clone, Copy)]
pub(super) struct Written {
    pub step: u64,
    pub bytes: u64,
    /// Seconds from the start of the write to its publication.
    pub write_secs: f64,
    /// Seconds the drafter waited for it: the snapshot, or the whole write when it was
    /// written in place.
    pub stall_secs: f64,
}

/// Checkpoints written in the background: the replica's state is copied on its device
/// ([`Snapshot`]) and a thread writes and publishes it while training goes on, so a step waits
/// only for the copy. At most one write is in flight: the next checkpoint, and the end of the
/// run, wait for it first. A device without room for the copy writes in place instead.
pub(super) struct CheckpointWriter {
    run_dir: PathBuf,
    /// `false`: every checkpoint written in place (the memory plan found no room for a
    /// snapshot, or the state is too small for a background write to pay).
    background: bool,
    /// States smaller than this are written in place ([`BACKGROUND_MIN_BYTES`]; the tests
    /// lower it to run the background path on a tiny drafter).
    min_background_bytes: u64,
    pending: Option<(std::thread::JoinHandle<Result<u64>>, u64, Instant, f64)>,
}

impl CheckpointWriter {
    pub fn new(run_dir: &Path, background: bool) -> Self {
        CheckpointWriter {
            run_dir: run_dir.to_path_buf(),
            background,
            min_background_bytes: BACKGROUND_MIN_BYTES,
            pending: None,
        }
    }

    /// Starts the checkpoint of `replica` at its current step; returns the previous write if
    /// this call had to wait for it, or this one when it was written in place.
    pub fn start(
        &mut self,
        replica: &DrafterReplica,
        extra: serde_json::Value,
    ) -> Result<Vec<Written>> {
        let mut done: Vec<Written> = self.wait()?.into_iter().collect();
        let t0 = Instant::now();
        let step = replica.step;
        // No room for the copy (planned, or found at run time), or a state small enough to
        // write in less time than a step: written in place.
        let snapshot = match self.background && state_bytes(replica) >= self.min_background_bytes {
            false => None,
            true => match Snapshot::take(replica) {
                Ok(s) => Some(s),
                Err(TrainError::Backend(dflash_core::Error::OutOfMemory { .. })) => None,
                Err(e) => return Err(e.into()),
            },
        };
        match snapshot {
            Some(snap) => {
                let stall = t0.elapsed().as_secs_f64();
                let run_dir = self.run_dir.clone();
                let handle = std::thread::Builder::new()
                    .name("checkpoint".into())
                    .spawn(move || publish(&run_dir, step, |dir| Ok(snap.save(dir, extra)?)))
                    .map_err(|e| {
                        PipelineError::Job(format!("cannot start the checkpoint thread: {e}"))
                    })?;
                self.pending = Some((handle, step, t0, stall));
            }
            None => {
                let bytes = publish(&self.run_dir, step, |dir| {
                    Ok(state::save(dir, replica, extra)?)
                })?;
                let secs = t0.elapsed().as_secs_f64();
                done.push(Written {
                    step,
                    bytes,
                    write_secs: secs,
                    stall_secs: secs,
                });
            }
        }
        Ok(done)
    }

    /// Waits for the write in flight, if any.
    pub fn wait(&mut self) -> Result<Option<Written>> {
        let Some((handle, step, t0, stall)) = self.pending.take() else {
            return Ok(None);
        };
        let bytes = handle.join().map_err(|_| {
            PipelineError::Job(format!(
                "the thread writing checkpoint step-{step} panicked"
            ))
        })??;
        Ok(Some(Written {
            step,
            bytes,
            write_secs: t0.elapsed().as_secs_f64(),
            stall_secs: stall,
        }))
    }
}

impl Drop for CheckpointWriter {
    /// A run that stops on an error still lets the write in flight finish (or fail) rather
    /// than leaving it to the process's exit.
    fn drop(&mut self) {
        let _ = self.wait();
    }
}

/// Tidies a run directory before it is resumed: removes the checkpoints other than the
/// published one (older ones a kill spared, one it left half written) and the temp files of
/// writes killed before their rename. Best effort: what is left takes only space.
pub(super) fn tidy(run_dir: &Path) {
    let ckpts = run_dir.join("checkpoints");
    let latest = latest_checkpoint(run_dir);
    let keep = latest
        .as_deref()
        .and_then(Path::file_name)
        .and_then(|n| n.to_str());
    remove_stale(&ckpts, keep, true);
    remove_stale(run_dir, None, true);
}

/// Removes from `dir` the `step-N` directories other than `keep` (none without it) and, with
/// `temp_files`, the temp files of unfinished writes.
fn remove_stale(dir: &Path, keep: Option<&str>, temp_files: bool) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        if keep.is_some_and(|k| n.starts_with("step-") && n != k) {
            let _ = std::fs::remove_dir_all(e.path());
        } else if temp_files && dflash_models::safetensors_io::is_temp_file(&n) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// The run's figures so far, carried in each checkpoint (`extra.figures`) so that a resumed
/// run reports the run's first loss and tau before training, and a run resumed at its end
/// its last loss, not this invocation's (none). Kept as strings: serde_json's default float
/// parsing is off by an ulp for some values, Rust's is exact, and NaN survives.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Figures {
    pub first_loss: f64,
    /// Loss and accuracy of the last step.
    pub last: (f64, f64),
    pub tau_before: Option<f64>,
}

impl Default for Figures {
    fn default() -> Self {
        Figures {
            first_loss: f64::NAN,
            last: (f64::NAN, f64::NAN),
            tau_before: None,
        }
    }
}

impl Figures {
    pub fn to_json(self) -> serde_json::Value {
        let s = |x: f64| format!("{x:?}");
        serde_json::json!({
            "first_loss": s(self.first_loss),
            "last_loss": s(self.last.0),
            "last_accuracy": s(self.last.1),
            "tau_before": self.tau_before.map(s),
        })
    }

    /// The figures in a checkpoint's `extra`; a field that is missing or unreadable (a
    /// checkpoint written before they were kept) is NaN, or `None` for tau.
    pub fn from_extra(extra: &serde_json::Value) -> Self {
        let v = &extra["figures"];
        let f = |k: &str| v[k].as_str().and_then(|s| s.parse::<f64>().ok());
        Figures {
            first_loss: f("first_loss").unwrap_or(f64::NAN),
            last: (
                f("last_loss").unwrap_or(f64::NAN),
                f("last_accuracy").unwrap_or(f64::NAN),
            ),
            tau_before: f("tau_before"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;

    use dflash_config::{DType, DrafterConfig, DrafterShape, Qwen3Config};
    use dflash_core::Backend;
    use dflash_models::drafter::FrozenTarget;
    use dflash_models::{Drafter, DrafterParams};
    use dflash_training::optimizer::AdamWHyper;
    use dflash_training::{AdamW, DrafterReplica};

    use super::*;

    const TARGET: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../assets/tiny-target");

    /// A 1-layer drafter for the embedded target with random weights and random (not zero)
    /// AdamW moments, at step `step`.
    fn replica(step: u64) -> DrafterReplica {
        dflash_backend_reference::link();
        let b: Arc<dyn Backend> =
            dflash_core::registry::create_backend("reference", &Default::default()).unwrap();
        let t = Qwen3Config::from_file(Path::new(TARGET).join("config.json")).unwrap();
        let shape = DrafterShape {
            num_layers: 1,
            num_target_features: 2,
            dtype: DType::Float32,
            ..DrafterShape::standard(t.vocab_size as u32 - 1)
        };
        let cfg = DrafterConfig::for_target(&t, &shape).unwrap();
        let params = DrafterParams::init_random(b.as_ref(), &cfg, 0.02, 1).unwrap();
        let (_, frozen) = FrozenTarget::load(b.as_ref(), Path::new(TARGET)).unwrap();
        let drafter = Drafter::new(b.clone(), cfg.clone(), params, Arc::new(frozen)).unwrap();
        let hyper = AdamWHyper {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
        };
        let mut opt = AdamW::new(b.as_ref(), &cfg, hyper).unwrap();
        opt.m = DrafterParams::init_random(b.as_ref(), &cfg, 0.1, 2).unwrap();
        opt.v = DrafterParams::init_random(b.as_ref(), &cfg, 0.1, 3).unwrap();
        opt.step = step;
        let mut r = DrafterReplica::new(drafter, opt, false, 1.0, 10).unwrap();
        r.step = step;
        r
    }

    /// Every file of a checkpoint directory, by name.
    fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
        let mut v: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.file_name().into_string().unwrap(),
                    std::fs::read(e.path()).unwrap(),
                )
            })
            .collect();
        v.sort();
        v
    }

    /// Publishing syncs `checkpoints/` (the new `step-N` entry) and the run directory before
    /// `latest` is rewritten, and `checkpoints/` again after, before the old checkpoint is
    /// removed: at each sync the directories hold what a power loss must not lose.
    #[test]
    fn publishing_syncs_the_directories_before_removing_the_old_checkpoint() {
        let tmp = tempfile::tempdir().unwrap();
        let run = tmp.path().join("run");
        let ckpts = run.join("checkpoints");
        let save = |dir: &Path| Ok(write_atomic(&dir.join("state"), b"s")?);
        publish_synced(&run, 1, save, &|_| Ok(())).unwrap();
        let seen = std::sync::Mutex::new(Vec::new());
        let record = |d: &Path| {
            let latest = std::fs::read_to_string(ckpts.join(LATEST)).unwrap();
            seen.lock().unwrap().push((
                d.to_path_buf(),
                latest,
                ckpts.join("step-1").exists(),
                ckpts.join("step-2/state").exists(),
            ));
            Ok(())
        };
        publish_synced(&run, 2, save, &record).unwrap();
        let at = |d: &Path, latest: &str| (d.to_path_buf(), latest.to_string(), true, true);
        assert_eq!(
            seen.into_inner().unwrap(),
            vec![
                at(&ckpts, "step-1"),
                at(&run, "step-1"),
                at(&ckpts, "step-2"),
            ]
        );
        assert!(
            !ckpts.join("step-1").exists(),
            "the old one is removed after"
        );
        assert_eq!(latest_checkpoint(&run), Some(ckpts.join("step-2")));
        // And with the real sync on a real filesystem, nothing fails.
        assert!(publish(&run, 3, save).unwrap() > 0);
    }

    /// The background writer publishes what the replica held when the checkpoint started,
    /// byte for byte what an in-place write of that state publishes, although training
    /// changes the weights while it writes; a checkpoint started while one is in flight waits
    /// for it.
    #[test]
    fn a_background_checkpoint_is_the_state_at_its_start() {
        let tmp = tempfile::tempdir().unwrap();
        let run = |name: &str| tmp.path().join(name);
        let mut r = replica(3);
        let extra = serde_json::json!({ "note": "test" });

        let mut in_place = CheckpointWriter::new(&run("a"), true);
        let done = in_place.start(&r, extra.clone()).unwrap();
        assert_eq!(done.len(), 1, "a tiny state is written in place");
        assert_eq!(done[0].step, 3);

        let mut bg = CheckpointWriter::new(&run("b"), true);
        bg.min_background_bytes = 0;
        assert!(
            bg.start(&r, extra.clone()).unwrap().is_empty(),
            "in the background"
        );
        // Training goes on while the thread writes: the weights change.
        let b = r.drafter.backend().clone();
        for t in r.drafter.params.tensors_mut() {
            b.scale_assign(t, 2.0).unwrap();
        }
        let first = bg.wait().unwrap().expect("step 3 was in flight");
        assert_eq!((first.step, first.bytes > 0), (3, true));
        let step3 = files(&run("a").join("checkpoints/step-3"));
        assert!(
            step3.len() >= 2,
            "{:?}",
            step3.iter().map(|f| &f.0).collect::<Vec<_>>()
        );
        assert_eq!(files(&run("b").join("checkpoints/step-3")), step3);

        r.step = 4;
        assert!(bg.start(&r, extra.clone()).unwrap().is_empty());
        r.step = 5;
        let done = bg.start(&r, extra.clone()).unwrap();
        assert_eq!(done.len(), 1, "step 5 waited for step 4");
        assert_eq!(done[0].step, 4);
        assert_eq!(bg.wait().unwrap().map(|w| w.step), Some(5));
        let latest = latest_checkpoint(&run("b")).unwrap();
        assert_eq!(latest.file_name().unwrap(), "step-5");
        let mut c = CheckpointWriter::new(&run("c"), false);
        c.start(&r, extra).unwrap();
        assert_eq!(files(&latest), files(&run("c").join("checkpoints/step-5")));
        // The weights file alone (the step in trainer_state differs anyway): doubled weights.
        let model = |fs: &[(String, Vec<u8>)]| {
            fs.iter()
                .find(|(n, _)| n == "model.safetensors")
                .map(|(_, b)| b.clone())
                .expect("a model file")
        };
        assert_ne!(
            model(&files(&latest)),
            model(&step3),
            "the doubled weights were saved"
        );
    }
}
