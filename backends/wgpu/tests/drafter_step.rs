//! A whole drafter step (loss, counts, predictions and every parameter gradient) on the wgpu
//! backend against the reference backend, through `dflash_tests::drafter_step` (written once
//! over any backend): the tiny, small (head_dim 64, a sliding layer) and packed problems,
//! with and without recomputation. Attention is the host `reference` kernel through a host
//! round trip, so every other op of the step (GEMMs, norms, RoPE, SwiGLU, embedding, the
//! fused loss, copies) runs in WGSL; f32 storage and accumulation: `StepTolerance::F32`.
//!
//! The same step with the WGSL attention kernel `wgpu-tiled`: the whole step on the device,
//! with its f32 forward, on those problems and at head_dim 128.
//!
//! The same step as shipped (`AttnCoop::WhereSupported`) on an adapter with cooperative
//! matrices (`drafter_step_with_the_tensor_core_forward_*`): `wgpu-tiled`'s forward on tensor
//! cores at head_dim 128, f16 products (`StepTolerance::F16_PRODUCTS_ATTENTION`).
//!
//! The same step with the frozen embedding, the LM head and the features in the f16 compute
//! format (`drafter_step_f16_*`, on adapters with `SHADER_F16`): the f16 GEMM operands, the
//! f16 embedding gather and the f16 loss head on the job's path.
//!
//! Skips cleanly without an adapter (and the f16 step without `SHADER_F16`).

mod common;

use std::sync::Arc;

use common::*;
use dflash_tests::drafter_step::{
    ALL_PROBLEMS, HEAD_DIM_128, StepTolerance, drafter_step_in_compute_format_matches_reference,
    drafter_step_matches_reference,
};

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
        &[ALL_PROBLEMS.as_slice(), &HEAD_DIM_128].concat(),
        &StepTolerance::F32,
    );
}

/// The whole step as shipped (`AttnCoop::WhereSupported`) on an adapter with cooperative
/// matrices: `wgpu-tiled`'s forward on tensor cores at head dim 128 (the other problems' head
/// dims run the f32 forward).
#[test]
fn drafter_step_with_the_tensor_core_forward_matches_reference() {
    let Some(be) = wgpu_coop_attention_where_supported() else {
        return;
    };
    drafter_step_matches_reference(
        Arc::new(be),
        "wgpu, tensor-core attention forward where supported",
        &[HEAD_DIM_128.as_slice(), &ALL_PROBLEMS].concat(),
        &StepTolerance::F16_PRODUCTS_ATTENTION,
    );
}

/// The f16 inputs' rounding reaches every output through f32 kernels
/// (`StepTolerance::f16_rounded`). Measured on lavapipe (all three problems, with and without
/// recomputation): loss within 6.3e-5 relative, gradient rel-L2 at most 1.3e-3, per element
/// at most 0.36 of the bound, every prediction equal.
const STEP_F16: StepTolerance = StepTolerance::f16_rounded(
    "embedding, LM head and features rounded to f16 (2^-11 relative each) against the \
     reference's f32 values; f32 kernels otherwise",
);

/// The whole step on the device (`wgpu-tiled`) with its read-only inputs in f16.
#[test]
fn drafter_step_f16_matches_reference_with_tiled_attention() {
    let Some(be) = wgpu_f16_with("wgpu-tiled", None) else {
        return;
    };
    drafter_step_in_compute_format_matches_reference(
        Arc::new(be),
        "wgpu f16 compute format, wgpu-tiled attention",
        &ALL_PROBLEMS,
        &STEP_F16,
    );
}
