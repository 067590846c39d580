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
//! in docs/PERF.md). The wgpu run keeps f32 throughout (`DFLASH_WGPU_F16=0`, and
//! `DFLASH_WGPU_ATTN_COOP=0`, though the default's head dim, 32, is outside the tensor-core
//! forward's): these bounds measure f32 kernels; the f16 compute format has its own job test
//! (`job_f16.rs`).
//! Skips cleanly without an adapter.

mod common;
#[path = "common/job.rs"]
mod job;

#[test]
fn the_default_job_on_wgpu_tracks_the_reference() {
    // SAFETY: set before any backend exists, in the only test of this binary (no other
    // thread reads the environment yet).
    unsafe {
        std::env::set_var("DFLASH_WGPU_F16", "0");
        std::env::set_var("DFLASH_WGPU_ATTN_COOP", "0");
    }
    if common::wgpu().is_none() {
        return;
    }
    dflash_backend_reference::link();
    dflash_backend_wgpu::link();
    dflash_attention_tiled::link();
    let tmp = tempfile::tempdir().unwrap();
    let want = job::run("reference", "tiled", tmp.path());
    let got = job::run("wgpu", "wgpu-tiled", tmp.path());
    job::assert_tracks(&got, &want, 1e-4, 1e-3);
}
