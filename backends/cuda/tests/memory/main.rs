//! Memory ops (upload/download, copies, gathers, adds, scales) against the reference backend.
//!
//! Skips cleanly without CUDA; inputs, poisoning and the tolerance scheme: `common`.

#[path = "../common/mod.rs"]
mod common;

mod allocation;
mod bf16_activations;
mod bf16_storage;
mod conversion;
mod ops;
