//! Publishing a run's checkpoints under `checkpoints/`, and finding the latest one.

use std::path::{Path, PathBuf};

use dflash_models::safetensors_io::write_atomic;
use dflash_training::{DrafterReplica, state};

use crate::error::{PipelineError, Result};

const LATEST: &str = "latest";

/// Latest published checkpoint directory of a run, if any.
pub fn latest_checkpoint(run_dir: &Path) -> Option<PathBuf> {
    let ckpts = run_dir.join("checkpoints");
    let name = std::fs::read_to_string(ckpts.join(LATEST)).ok()?;
    Some(ckpts.join(name.trim()))
}

/// Writes `checkpoints/step-N`, then atomically points `checkpoints/latest` at it, then
/// removes older ones: at every instant a complete checkpoint is published. Returns the
/// bytes written.
pub(super) fn publish_checkpoint(
    run_dir: &Path,
    replica: &DrafterReplica,
    extra: serde_json::Value,
) -> Result<u64> {
    let ckpts = run_dir.join("checkpoints");
    let name = format!("step-{}", replica.step);
    let dir = ckpts.join(&name);
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(PipelineError::io(&dir))?;
    }
    state::save(&dir, replica, extra)?;
    let bytes = std::fs::read_dir(&dir)
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0);
    write_atomic(&ckpts.join(LATEST), name.as_bytes())?;
    dflash_models::fault::point("published");
    remove_stale(&ckpts, Some(&name), false);
    Ok(bytes)
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
