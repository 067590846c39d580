//! RMSNorm, RoPE, SwiGLU, embedding and AdamW against the reference backend, through the
//! shared op suite (`dflash_tests::ops`): the element-wise ops in both activation modes (f32
//! activations; bf16 activations with every input in f32 and in bf16, mixed included, outputs
//! stored in bf16 and checked with one bf16 rounding added), bf16 tensors in the compute format.
//!
//! Skips cleanly without CUDA; inputs, poisoning and the tolerance scheme: `common`.

mod common;

use common::*;
use dflash_backend_cuda::{DType, GemmPrecision};
use dflash_tests::ops::{elementwise, storage};

#[test]
fn norm_ops_match_reference() {
    for p in CudaPath::activation_modes() {
        elementwise::rms_norm(&p);
    }
}

/// Positions and masks are uploaded through a small content-keyed cache.
#[test]
fn rope_positions_cache_never_serves_stale_values() {
    if let Some(cu) = cuda() {
        elementwise::rope_cache(&CudaPath::new("f32 activations", cu, DType::F32));
    }
}

#[test]
fn rope_ops_match_reference() {
    for p in CudaPath::activation_modes() {
        elementwise::rope(&p);
    }
}

#[test]
fn activation_ops_match_reference() {
    for p in CudaPath::activation_modes() {
        elementwise::swiglu(&p);
    }
}

/// A gather, so bit-exact in both modes: f32 activations copy an f32 table; bf16 activations
/// copy a bf16 table and round an f32 one once.
#[test]
fn embedding_ops_match_reference() {
    for p in CudaPath::activation_modes() {
        elementwise::embedding(&p);
    }
}

#[test]
fn optimizer_ops_match_reference() {
    if let Some(cu) = cuda() {
        elementwise::adamw(&CudaPath::new("f32 activations", cu, DType::F32));
    }
}

/// bf16 tensors from `to_compute_format` (bf16 GEMMs): the embedding gathers them exactly;
/// ops with no bf16 variant (AdamW: parameters, moments and gradients are f32 by design; the
/// statistics input `rstd` of `rms_norm_backward`) refuse them by op, dtype and device.
#[test]
fn bf16_tensors_read_exactly_or_refused() {
    if let Some(cu) = cuda_with(GemmPrecision::Bf16) {
        let p = CudaPath::new("bf16 GEMMs, f32 activations", cu, DType::F32);
        storage::compute_format(&p);
    }
}
