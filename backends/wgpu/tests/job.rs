//! The training job itself on the wgpu backend: the embedded default (`configs/default.toml`)
//! for a few optimizer steps through `dflash_pipeline::train` — loader, target worker, queue,
//! drafter replica, AdamW, checkpoint — once on the reference backend and once on wgpu with
//! the WGSL attention kernel, the step losses compared.
//!
//! Tolerance: the reference accumulates in f64, wgpu in f32 (~1e-6 relative per op); four
//! AdamW steps amplify that little (measured on lavapipe: losses within 1e-6 relative, grad
//! norms within 4e-6). Bounds of 1e-4 (loss) and 1e-3 (grad norm, a sum of squares over
//! every gradient, more sensitive) leave two orders of magnitude, while a wrong kernel, a
//! stale buffer or a missed synchronisation moves a loss by 1e-2 or more. The
//! data order, anchors and initial weights come from the same seeds, so the runs see the same
//! tokens. Eval is left out (tau on a software adapter takes minutes; the closing figures are
//! in docs/PERF.md). The wgpu run keeps f32 throughout (`DFLASH_WGPU_F16=0`): these bounds
//! measure f32 kernels, and the f16 compute format has its own step test (`drafter_step`).
//! Skips cleanly without an adapter.

mod common;

use std::path::{Path, PathBuf};

use dflash_config::TrainConfig;
use serde_json::Value;

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
const STEPS: usize = 4;

fn run(backend: &str, attention: &str, runs: &Path) -> Vec<(f64, f64)> {
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

#[test]
fn the_default_job_on_wgpu_tracks_the_reference() {
    // SAFETY: set before any backend exists, in the only test of this binary (no other
    // thread reads the environment yet).
    unsafe { std::env::set_var("DFLASH_WGPU_F16", "0") };
    if common::wgpu().is_none() {
        return;
    }
    dflash_backend_reference::link();
    dflash_backend_wgpu::link();
    dflash_attention_tiled::link();
    let tmp = tempfile::tempdir().unwrap();
    let want = run("reference", "tiled", tmp.path());
    let got = run("wgpu", "wgpu-tiled", tmp.path());
    assert_eq!(want.len(), STEPS, "one record per step: {want:?}");
    assert_eq!(got.len(), want.len());
    for (i, ((gl, gg), (wl, wg))) in got.iter().zip(&want).enumerate() {
        assert!(gl.is_finite() && gg.is_finite(), "step {i}: {gl} {gg}");
        let (dl, dg) = ((gl - wl).abs() / wl.abs(), (gg - wg).abs() / wg.abs());
        println!("  step {i}: loss {gl:.6} vs {wl:.6} (rel {dl:.1e}), grad_norm rel {dg:.1e}");
        assert!(
            dl <= 1e-4,
            "step {i}: loss {gl} on wgpu vs {wl} on the reference"
        );
        assert!(dg <= 1e-3, "step {i}: grad_norm {gg} on wgpu vs {wg}");
    }
}
