//! The training job through `dflash_pipeline::train` on a backend: the embedded default
//! (`configs/default.toml`) without eval, for [`STEPS`] optimizer steps, and the comparison of
//! two runs' step losses and grad norms. Shared by `job.rs` (f32) and `job_f16.rs`.

use std::path::{Path, PathBuf};

use dflash_config::TrainConfig;
use serde_json::Value;

pub const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
pub const STEPS: usize = 4;

/// `(loss, grad_norm)` of every step of the default job on `backend` with `attention`.
pub fn run(backend: &str, attention: &str, runs: &Path) -> Vec<(f64, f64)> {
    let text = std::fs::read_to_string(Path::new(ROOT).join("configs/default.toml")).unwrap();
    let text: String = text
        .lines()
        .filter(|l| !l.starts_with("eval = "))
        .map(|l| format!("{l}\n"))
        .collect();
    let ov: Vec<(String, String)> = [
        ("backend.name", format!("{backend:?}")),
        ("backend.attention", format!("{attention:?}")),
        ("backend.threads", "2".into()),
        ("train.max_steps", STEPS.to_string()),
        ("train.log_every", "1".into()),
        ("run.dir", format!("{:?}", runs.display().to_string())),
        ("run.name", format!("{backend:?}")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let cfg = TrainConfig::load_toml_str(&text, "default.toml", Path::new(ROOT), &ov).unwrap();
    let out = dflash_pipeline::train(&cfg, None)
        .unwrap_or_else(|e| panic!("the job on {backend} failed: {e}"));
    assert_eq!(out.steps, STEPS as u64, "{backend}");
    let dir: PathBuf = out.run_dir;
    assert!(
        dir.join("model.safetensors").is_file(),
        "{backend}: no drafter saved"
    );
    std::fs::read_to_string(dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|m| m.get("loss").is_some() && m.get("step").is_some())
        .map(|m| {
            (
                m["loss"].as_f64().unwrap(),
                m["grad_norm"].as_f64().unwrap(),
            )
        })
        .collect()
}

/// Asserts that every step's loss and grad norm of `got` are within `loss_tol` and `grad_tol`
/// (relative) of `want`'s, printing each.
pub fn assert_tracks(got: &[(f64, f64)], want: &[(f64, f64)], loss_tol: f64, grad_tol: f64) {
    assert_eq!(want.len(), STEPS, "one record per step: {want:?}");
    assert_eq!(got.len(), want.len());
    for (i, ((gl, gg), (wl, wg))) in got.iter().zip(want).enumerate() {
        assert!(gl.is_finite() && gg.is_finite(), "step {i}: {gl} {gg}");
        let (dl, dg) = ((gl - wl).abs() / wl.abs(), (gg - wg).abs() / wg.abs());
        println!("  step {i}: loss {gl:.6} vs {wl:.6} (rel {dl:.1e}), grad_norm rel {dg:.1e}");
        assert!(
            dl <= loss_tol,
            "step {i}: loss {gl} on wgpu vs {wl} on the reference"
        );
        assert!(dg <= grad_tol, "step {i}: grad_norm {gg} on wgpu vs {wg}");
    }
}
