//! Core seams of dflash-rs. Nothing here names a concrete backend or links GPU code.
//!
//! - [`Tensor`]: a backend buffer plus a contiguous row-major shape.
//! - [`Backend`]: the sum of small op-family traits ([`ops`]), one file per family. Model code
//!   is written once against `&dyn Backend`.
//! - [`HostAttentionKernel`] and [`DeviceAttentionKernel`]: the attention plugin seams (host
//!   memory, and a device backend's own memory and stream), shaped like the C ABI.
//! - [`registry`]: backends and attention kernels register at startup (`inventory`).
//! - [`pipeline`]: the target and feature seams of the training pipeline.

pub mod device_kernel;
pub mod error;
pub mod ops;
pub mod pipeline;
pub mod registry;
pub mod tensor;

pub use device_kernel::{
    AttentionKernel, DeviceAttentionKernel, DeviceAttnBackward, DeviceAttnForward, DeviceCall,
    DeviceKind,
};
pub use dflash_mask as mask;
pub use error::{Error, Result};
pub use ops::attention::{
    AttnBackward, AttnDims, AttnForward, AttnInputs, HostAttentionKernel, HostAttnLens,
};
pub use ops::*;
pub use tensor::{Shape, Storage, Tensor};

/// A backend: the sum of its op families. Implement each family trait and this follows.
pub trait Backend:
    ops::BackendInfo
    + ops::MemoryOps
    + ops::GemmOps
    + ops::NormOps
    + ops::RopeOps
    + ops::ActivationOps
    + ops::EmbeddingOps
    + ops::AttentionOps
    + ops::LossOps
    + ops::OptimizerOps
    + ops::CollectiveOps
{
}

impl<T> Backend for T where
    T: ops::BackendInfo
        + ops::MemoryOps
        + ops::GemmOps
        + ops::NormOps
        + ops::RopeOps
        + ops::ActivationOps
        + ops::EmbeddingOps
        + ops::AttentionOps
        + ops::LossOps
        + ops::OptimizerOps
        + ops::CollectiveOps
{
}
