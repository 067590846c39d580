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
    if let Ok(entries) = std::fs::read_dir(&ckpts) {
        for e in entries.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if n.starts_with("step-") && n != name {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
    Ok(bytes)
}
