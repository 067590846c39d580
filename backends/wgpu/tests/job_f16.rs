//! The training job (`configs/default.toml` through `dflash_pipeline::train`, as `job.rs`
//! runs it) on wgpu with the f16 compute format: the target's 2-D weights loaded by
//! `upload_frozen` into f16, the target's layers run on f16 GEMM operands, the features
//! handed to the drafter in f16, the drafter's frozen embedding and LM head in f16; against
//! the reference's all-f32 run.
//!
//! Tolerance: the f16 rounding of weights and features (2^-11 relative each) moves each
//! step's loss and grad norm by ~1e-4..1e-3 relative (the drafter-step test measures 6e-5 on
//! the loss and 1.3e-3 rel-L2 on gradients with f16 inputs alone; here the target's features
//! carry the rounding of four layers too; measured on lavapipe: losses within 2.6e-4, grad
//! norms within 1.4e-3, against 1e-6 and 4e-6 for the f32 run). Bounds: 2e-3 (loss) and 1e-2
//! (grad norm), where a misread f16 operand moves a loss by 1e-1 or more. Skips cleanly without an adapter, without
//! `SHADER_F16`, or when `DFLASH_WGPU_F16=0` is set (the job's backends read it).

mod common;
#[path = "common/job.rs"]
mod job;

use dflash_backend_wgpu::WgpuOptions;

#[test]
fn the_default_job_with_the_f16_compute_format_tracks_the_reference() {
    if common::wgpu_f16().is_none() {
        return;
    }
    if !WgpuOptions::from_env().expect("DFLASH_WGPU_* switches").f16 {
        common::skip("DFLASH_WGPU_F16=0 is set, so the job's wgpu backend keeps f32");
        return;
    }
    dflash_backend_reference::link();
    dflash_backend_wgpu::link();
    dflash_attention_tiled::link();
    let tmp = tempfile::tempdir().unwrap();
    let want = job::run("reference", "tiled", tmp.path());
    let got = job::run("wgpu", "wgpu-tiled", tmp.path());
    job::assert_tracks(&got, &want, 2e-3, 1e-2);
}
