//! A whole drafter step (loss, counts, predictions and every parameter gradient) on the wgpu
//! backend against the reference backend, through `dflash_tests::drafter_step` (written once
//! over any backend): the tiny, small (head_dim 64, a sliding layer) and packed problems,
//! with and without recomputation. Attention is the host `reference` kernel through a host
//! round trip, so every other op of the step (GEMMs, norms, RoPE, SwiGLU, embedding, the
//! fused loss, copies) runs in WGSL; f32 storage and accumulation: `StepTolerance::F32`.
//!
//! The same step with the WGSL attention kernel `wgpu-tiled`: the whole step on the device.
//!
//! Skips cleanly without an adapter.

mod common;

use std::sync::Arc;

use common::*;
use dflash_tests::drafter_step::{ALL_PROBLEMS, StepTolerance, drafter_step_matches_reference};

#[test]
fn drafter_step_matches_reference_with_host_attention() {
    let Some(be) = wgpu() else { return };
    drafter_step_matches_reference(
        Arc::new(be),
        "wgpu, host reference attention",
        &ALL_PROBLEMS,
        &StepTolerance::F32,
    );
}

/// Every op of the step in WGSL, attention included (`wgpu-tiled`, an f32 online softmax):
/// still f32 kernels throughout, so `StepTolerance::F32`.
#[test]
fn drafter_step_matches_reference_with_tiled_attention() {
    let Some(be) = wgpu_with("wgpu-tiled", None) else {
        return;
    };
    drafter_step_matches_reference(
        Arc::new(be),
        "wgpu, wgpu-tiled attention",
        &ALL_PROBLEMS,
        &StepTolerance::F32,
    );
}
