//! The dense CPU reference backend: the definition of "correct" for dflash-rs.
//!
//! Plain `f32` storage ([`HostStorage`]), `f64` accumulation wherever rounding could matter
//! (norm statistics, softmax sums, the loss, attention dot products), readable loops in the
//! llm.c style with the shape of every buffer written next to it. GEMMs go through
//! `matrixmultiply::sgemm` (f32 accumulation, strided, so transposes are free).
//!
//! One file per op family, mirroring `dflash_core::ops`. Every op is deterministic: rayon
//! splits work only where each output element is produced by exactly one task in a fixed
//! order, so results are bit-identical between runs whatever the thread scheduling.
//!
//! Registration: the backend registers as `"reference"` and the plain attention kernel
//! ([`ReferenceAttention`]) as attention kernel `"reference"`; `attention = "plugin:PATH"`
//! loads a foreign kernel through the C ABI (`dflash-attention-loader`).

mod activation;
mod attention;
mod collective;
mod embedding;
mod gemm;
mod loss;
mod memory;
mod norm;
mod optimizer;
mod rope;
mod storage;

use std::sync::Arc;

use dflash_core::registry::{
    AttentionKernelRegistration, BackendOptions, BackendRegistration, create_host_attention,
};
use dflash_core::{Backend, BackendInfo, HostAttentionKernel, Result};

pub use attention::ReferenceAttention;
pub use storage::{HostStorage, host_slice, host_slice_mut, host_tensor};

/// The device string used in every error message of this backend.
pub(crate) const DEVICE: &str = "cpu";

/// The reference backend. Construct with [`ReferenceBackend::new`] or through the registry
/// (`dflash_core::registry::create_backend("reference", &opts)`).
pub struct ReferenceBackend {
    /// Worker threads requested (0 = rayon's global pool, i.e. all cores).
    threads: usize,
    /// A private pool when `threads > 0`; ops run inside it.
    pool: Option<rayon::ThreadPool>,
    attention: Box<dyn HostAttentionKernel>,
    attention_name: String,
}

impl ReferenceBackend {
    /// Builds the backend, resolving `opts.attention` through the attention-kernel registry
    /// (an unknown name is an error listing the registered kernels).
    pub fn new(opts: &BackendOptions) -> Result<Self> {
        let attention = create_host_attention(&opts.attention)?;
        Self::build(opts, attention, opts.attention.clone())
    }

    /// Builds the backend around `attention`, a kernel that need not be registered (tests: a
    /// CPU twin of a device kernel's numerics), under the kernel's own name; `opts.attention`
    /// is ignored.
    pub fn with_attention_kernel(
        opts: &BackendOptions,
        attention: Box<dyn HostAttentionKernel>,
    ) -> Result<Self> {
        let name = attention.name().to_string();
        Self::build(opts, attention, name)
    }

    fn build(
        opts: &BackendOptions,
        attention: Box<dyn HostAttentionKernel>,
        attention_name: String,
    ) -> Result<Self> {
        let pool = if opts.threads > 0 {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(opts.threads)
                .build()
                .map_err(|e| dflash_core::Error::Unavailable {
                    name: "reference".into(),
                    reason: format!("cannot build a pool of {} threads: {e}", opts.threads),
                })?;
            Some(pool)
        } else {
            None
        };
        Ok(ReferenceBackend {
            threads: opts.threads,
            pool,
            attention,
            attention_name,
        })
    }

    /// Runs `f` inside this backend's thread pool (or rayon's global one).
    pub(crate) fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        match &self.pool {
            Some(pool) => pool.install(f),
            None => f(),
        }
    }

    /// Number of worker threads the ops use.
    pub fn threads(&self) -> usize {
        match &self.pool {
            Some(pool) => pool.current_num_threads(),
            None => rayon::current_num_threads(),
        }
    }
}

impl BackendInfo for ReferenceBackend {
    fn name(&self) -> &'static str {
        "reference"
    }
    fn device(&self) -> String {
        let n = self.threads();
        let how = if self.threads == 0 { ", all cores" } else { "" };
        format!("{DEVICE} ({n} threads{how})")
    }
    fn attention_kernel(&self) -> &str {
        &self.attention_name
    }
}

fn create(opts: &BackendOptions) -> Result<Arc<dyn Backend>> {
    Ok(Arc::new(ReferenceBackend::new(opts)?))
}

inventory::submit! {
    BackendRegistration {
        name: "reference",
        description: "dense CPU reference (f32 storage, f64 accumulation); defines correctness",
        create,
        device_count: || 1,
        preferred_attention: "reference",
    }
}

fn create_reference_attention() -> Box<dyn HostAttentionKernel> {
    Box::new(ReferenceAttention)
}

inventory::submit! {
    AttentionKernelRegistration {
        name: "reference",
        description: "plain per-row interval walk, f64 scores; the attention oracle",
        create: create_reference_attention,
    }
}

/// Referencing this from a binary keeps the crate (and its `inventory` registrations) linked,
/// with the `plugin:PATH` kernel source.
pub fn link() {
    dflash_attention_loader::link();
}
