//! The CUDA backend of dflash-rs.
//!
//! - **Loading**: cudarc with dynamic loading; the binary links only libc. The driver, NVRTC
//!   and cuBLASLt libraries are checked for presence before cudarc touches them (cudarc panics
//!   on a missing library), so a machine without CUDA gets [`dflash_core::Error::Unavailable`]
//!   from [`CudaBackend::new`], never a panic.
//! - **Kernels**: CUDA C in `kernels/*.cu` (one file per op family), compiled by NVRTC once
//!   per device for its `compute_XY` and cached process-wide ([`device`]); shape-generic and
//!   usable from any thread.
//! - **Streams**: one stream per backend instance. Every op only enqueues work; host
//!   transfers are explicit: `upload` copies synchronously from the caller's slice, `download`
//!   (and every op that returns host values: `sum_squares`, `all_finite`, the loss statistics,
//!   `linear_argmax`) synchronises the stream and reports any asynchronous error there.
//! - **Storage** ([`CudaStorage`]): device bytes plus a [`DType`] tag. **Activations** (what
//!   ops compute: GEMM / embedding / norm / rope / swiglu / add / `cuda-simple` attention
//!   outputs and the activation gradients) are written in [`CudaOptions::activations`]
//!   (`DFLASH_CUDA_ACTIVATIONS=bf16|f32`; default bf16 with bf16 GEMMs, f32 otherwise: mixed
//!   precision as PyTorch autocast does it). Every op reads f32 or bf16 for each activation
//!   input (kernels templated on the element type, f32 math, one RNE rounding on store).
//!   Always f32: statistics (rstd, lse, loss statistics), parameter gradients (`matmul_acc`
//!   keeps its accumulator's dtype, `add_assign` / `scale_assign` likewise; `zeros` makes
//!   f32), and everything made by `upload` / `zeros` / `random_normal` (parameters are their
//!   own fp32 master copies). `to_compute_format` stores read-only tensors (frozen weights,
//!   target features) in bf16 when the GEMMs are bf16. AdamW and `all_reduce_sum` take f32
//!   only (by name, with an error naming op, dtype and device). [`CudaBackend::to_dtype`]
//!   converts (RNE).
//! - **GEMM** ([`GemmPrecision`]): cuBLASLt, f32 or bf16 operands, f32 or bf16 out (bf16 D
//!   written by cuBLASLt in bf16 mode, via f32 scratch in TF32/FP32 mode), f32 accumulation.
//!   Default `Bf16` (the recipe's bf16-autocast precision): bf16 operands read in place, f32
//!   ones rounded to bf16 into scratch, bf16 tensor cores, output in the activation dtype
//!   (about 4e-3 relative error per product term, so GEMM outputs and everything downstream
//!   match the reference to ~1e-2, not ~1e-6);
//!   `DFLASH_CUDA_GEMM=tf32` selects TF32 tensor cores (~1e-3), `fp32` exact f32 (slow, for
//!   checking). Plans are cached per shape.
//! - **Attention**: `"cuda-simple"` (`kernels/attention_simple.cu`): one warp per (query row,
//!   head) with an online softmax over the row's <= 2 key intervals; an atomics-free backward
//!   (dq per query row, dk/dv per key row over a host-built key -> query-run index). Any
//!   registered *host* attention kernel name (e.g. `"reference"`, `"tiled"`) also works, via a
//!   host round trip (correct, slow: for conformance checks of CPU plugins).
//!   `"cuda-flash"` (`kernels/attention.cu`, head_dim 64/128/256): the tuned bf16 block-sparse
//!   flash attention (wgmma forward and head_dim 64/128 backward on Hopper, mma.sync
//!   elsewhere); bf16 inputs are read in place, f32 ones rounded to bf16 (errors ~3e-3
//!   relative); out/dq/dk/dv come back in the activation dtype, lse in f32 (see `flash.rs`);
//!   the file is compiled only when a backend selects it.
//! - **Debug poison**: with `DFLASH_CUDA_POISON=1` (or [`CudaOptions::poison`]) every output
//!   buffer an op allocates is first filled with NaN (f32 NaN, or the bf16 quiet NaN 0x7FC0),
//!   so an unwritten element shows up.

mod activation;
mod attention;
mod buffers;
mod collective;
pub mod device;
mod embedding;
mod flash;
mod gemm;
pub mod kernels;
mod loss;
mod memory;
mod nccl;
mod norm;
mod optimizer;
mod options;
mod peer;
mod plugin_attention;
mod rope;
mod storage;
mod tma;

use std::sync::{Arc, Mutex};

pub use cudarc;
use cudarc::driver::{CudaSlice, CudaStream, DriverError, LaunchConfig, PushKernelArg};
use dflash_core::registry::{BackendOptions, BackendRegistration, create_attention};
use dflash_core::{AttentionKernel, DeviceAttentionKernel, DeviceKind};
use dflash_core::{Backend, BackendInfo, Error, HostAttentionKernel, Result, Tensor};

pub use attention::{DEVICE_ATTENTION_KERNELS, key_query_runs};
pub use flash::FLASH_HEAD_DIMS;
pub use gemm::GemmPrecision;
pub use options::{CudaOptions, parse_activations};
pub use storage::{CudaStorage, DType};

use device::Device;

/// Errors of the CUDA layer itself (library loading, compilation, driver and cuBLASLt
/// failures). Ops report them as [`dflash_core::Error`] naming op and device.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error("{0}")]
    Unavailable(String),
    #[error("NVRTC failed to compile {file} for {arch}:\n{log}")]
    Compile {
        file: String,
        arch: String,
        log: String,
    },
    #[error("CUDA driver error while {what}: {source}")]
    Driver {
        what: String,
        #[source]
        source: DriverError,
    },
    #[error("cuBLASLt error while {what}: {detail}")]
    Blas { what: String, detail: String },
}

impl CudaError {
    fn into_core(self, device: &str) -> Error {
        match self {
            CudaError::Unavailable(reason) => Error::Unavailable {
                name: "cuda".into(),
                reason,
            },
            other => Error::op("cuda_init", device, other.to_string()),
        }
    }
}

enum AttnImpl {
    /// `kernels/attention_simple.cu`.
    Simple,
    /// `kernels/attention.cu` (bf16 flash attention, head_dim 64/128/256), see [`flash`].
    Flash,
    /// A host kernel from the registry, run through a host round trip.
    Host(Box<dyn HostAttentionKernel>),
    /// A device kernel from outside the backend (a CUDA plugin), see [`plugin_attention`].
    Device(Box<dyn DeviceAttentionKernel>),
}

/// The CUDA backend: one device, one stream.
pub struct CudaBackend {
    dev: Arc<Device>,
    stream: Arc<CudaStream>,
    ordinal: usize,
    /// "cuda:N", the device in every error message.
    tag: String,
    blas: gemm::Blas,
    opts: CudaOptions,
    attention: AttnImpl,
    attention_name: String,
    /// Reusable workspace of the fused loss (grown on demand).
    loss_ws: Mutex<Option<CudaSlice<u8>>>,
    /// Recently uploaded index arrays, see [`CudaBackend::upload_i32_cached`].
    uploads: Mutex<std::collections::VecDeque<CachedUpload>>,
    /// The side stream and pinned staging of [`dflash_core::MemoryOps::download_detached`],
    /// made on first use.
    transfers: Mutex<Option<memory::SideTransfers>>,
}

impl CudaBackend {
    /// Builds the backend on device `opts.device`, with [`CudaOptions::from_env`]. Returns
    /// [`Error::Unavailable`] (never panics) when the CUDA libraries or the device are absent.
    pub fn new(opts: &BackendOptions) -> Result<Self> {
        Self::with_options(opts, CudaOptions::from_env()?)
    }

    pub fn with_options(opts: &BackendOptions, copts: CudaOptions) -> Result<Self> {
        let ordinal = opts.device;
        let tag = format!("cuda:{ordinal}");
        let (attention, attention_name) = resolve_attention(&opts.attention)?;
        let flash = matches!(attention, AttnImpl::Flash);
        let dev = device::get(ordinal, flash).map_err(|e| e.into_core(&tag))?;
        let stream = dev.ctx.new_stream().map_err(|e| {
            Error::op(
                "cuda_init",
                tag.clone(),
                format!("cannot create a stream: {e}"),
            )
        })?;
        let blas = gemm::Blas::new(&stream).map_err(|e| e.into_core(&tag))?;
        let backend = CudaBackend {
            dev,
            stream,
            ordinal,
            tag,
            blas,
            opts: copts,
            attention,
            attention_name,
            loss_ws: Mutex::new(None),
            uploads: Mutex::new(std::collections::VecDeque::new()),
            transfers: Mutex::new(None),
        };
        if flash {
            // Load attention.cu now (its PTX compiled with the device's other kernels) so that a
            // failure shows at creation.
            backend.flash("cuda_init")?;
        }
        Ok(backend)
    }

    pub fn ordinal(&self) -> usize {
        self.ordinal
    }
    pub fn options(&self) -> CudaOptions {
        self.opts
    }
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }
    /// Compute capability `(major, minor)`.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.dev.cc
    }

    /// Waits for all work enqueued on this backend's stream; reports asynchronous errors.
    pub fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(|e| self.drv("synchronize", e))?;
        self.dev
            .ctx
            .check_err()
            .map_err(|e| self.drv("synchronize", e))
    }

    /// An uninitialised tensor of `dtype` (in poison mode: every element NaN, f32 NaN or the
    /// bf16 quiet NaN 0x7FC0). For tests and diagnostics of the poison mode.
    pub fn uninit(&self, shape: &[usize], dtype: DType) -> Result<Tensor> {
        let n = dflash_core::tensor::checked_numel("uninit", &self.tag, shape)?;
        Ok(self.tensor(self.alloc("uninit", n, dtype)?, dtype, shape))
    }

    /// Converts a tensor to `dtype` (f32 <-> bf16, round to nearest even), a new tensor.
    pub fn to_dtype(&self, t: &Tensor, dtype: DType) -> Result<Tensor> {
        let op = "to_dtype";
        let s = self.any(op, t)?;
        if s.dtype == dtype {
            return memory::copy_any(self, op, t);
        }
        let out = self.converted(op, &s.buf, s.len, dtype)?;
        Ok(self.tensor(out, dtype, t.shape().clone()))
    }

    /// The kernel converting into `to` from the other dtype: `f32_to_bf16` (round to nearest
    /// even) or `bf16_to_f32` (exact); `(out, x, long long n)`, grid-stride, 8 per thread.
    fn convert_kernel(&self, to: DType) -> &cudarc::driver::CudaFunction {
        match to {
            DType::Bf16 => &self.dev.kernels.f32_to_bf16,
            DType::F32 => &self.dev.kernels.bf16_to_f32,
        }
    }

    /// A new buffer with the first `n` elements of `src` (the other dtype) converted to `to`.
    pub(crate) fn converted(
        &self,
        op: &'static str,
        src: &CudaSlice<u8>,
        n: usize,
        to: DType,
    ) -> Result<CudaSlice<u8>> {
        let mut out = self.alloc(op, n, to)?;
        if n > 0 {
            let n64 = n as i64;
            let mut l = self.stream.launch_builder(self.convert_kernel(to));
            l.arg(&mut out).arg(src).arg(&n64);
            self.launch(op, l, grid_vec8(n))?;
        }
        Ok(out)
    }

    /// Converts `n` elements at the raw device address `src` (of the other dtype) into `out`
    /// as `to` (f32 -> bf16 rounds to nearest even, bf16 -> f32 is exact). For library
    /// operands (GEMM views at offsets): the caller holds `src`'s device-pointer guard.
    pub(crate) fn convert_raw(
        &self,
        op: &'static str,
        out: &mut CudaSlice<u8>,
        src: u64,
        n: usize,
        to: DType,
    ) -> Result<()> {
        use cudarc::driver::DevicePtrMut;
        let (dst, _guard) = out.device_ptr_mut(&self.stream);
        self.convert_ptr(op, dst, src, n, to)
    }

    // ---- helpers shared by the op files ----

    pub(crate) fn k(&self) -> &kernels::Kernels {
        &self.dev.kernels
    }

    pub(crate) fn drv(&self, op: &'static str, e: DriverError) -> Error {
        Error::op(op, self.tag.clone(), format!("CUDA driver error: {e}"))
    }

    pub(crate) fn launch(
        &self,
        op: &'static str,
        mut l: cudarc::driver::LaunchArgs<'_>,
        cfg: LaunchConfig,
    ) -> Result<()> {
        // SAFETY: every kernel's argument list is built next to its launch, matching the
        // kernel's signature in kernels/*.cu; buffer sizes are checked by the calling op.
        unsafe { l.launch(cfg) }
            .map(|_| ())
            .map_err(|e| Error::op(op, self.tag.clone(), format!("kernel launch failed: {e}")))
    }
}

/// A host index array and its device copy.
type CachedUpload = (Vec<i32>, Arc<CudaSlice<u8>>);

/// A 1-D launch of `grid` blocks of `block` threads with `smem` bytes of dynamic shared memory.
pub(crate) fn launch_1d(grid: u32, block: u32, smem: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (grid, 1, 1),
        block_dim: (block, 1, 1),
        shared_mem_bytes: smem,
    }
}

/// A grid-stride 1-D launch of 256-thread blocks over `n` elements.
pub(crate) fn grid1d(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(256).clamp(1, 1 << 16) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// The launch of the vectorised elementwise kernels (f32 <-> bf16 conversions, add,
/// add_assign, scale, SwiGLU, embedding): one thread per 8 elements (their 16-byte path;
/// grid-stride, so correct for any `n`).
pub(crate) fn grid_vec8(n: usize) -> LaunchConfig {
    grid1d(n.div_ceil(8))
}

/// One warp per item, 4 warps per block.
pub(crate) fn warp_items(items: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (items.div_ceil(4) as u32, 1, 1),
        block_dim: (128, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn resolve_attention(name: &str) -> Result<(AttnImpl, String)> {
    match name {
        attention::SIMPLE => return Ok((AttnImpl::Simple, name.to_string())),
        attention::FLASH => return Ok((AttnImpl::Flash, name.to_string())),
        _ => debug_assert!(!DEVICE_ATTENTION_KERNELS.contains(&name)),
    }
    match create_attention(name) {
        Ok(AttentionKernel::Host(k)) => Ok((AttnImpl::Host(k), name.to_string())),
        Ok(AttentionKernel::Device(k)) => match k.device() {
            DeviceKind::Cuda => Ok((AttnImpl::Device(k), name.to_string())),
        },
        Err(Error::UnknownName { available, .. }) => {
            let mut all: Vec<String> = DEVICE_ATTENTION_KERNELS
                .iter()
                .map(|s| s.to_string())
                .collect();
            all.extend(
                available
                    .into_iter()
                    .map(|h| format!("{h} (host round trip)")),
            );
            Err(Error::UnknownName {
                kind: "attention kernel",
                name: name.to_string(),
                available: all,
            })
        }
        Err(e) => Err(e),
    }
}

impl BackendInfo for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }
    fn device(&self) -> String {
        format!(
            "{} ({}, sm_{}{})",
            self.tag, self.dev.name, self.dev.cc.0, self.dev.cc.1
        )
    }
    fn attention_kernel(&self) -> &str {
        &self.attention_name
    }
    fn synchronize(&self) -> Result<()> {
        CudaBackend::synchronize(self)
    }
    fn memory_stats(&self) -> Option<dflash_core::MemoryStats> {
        let (in_use, peak) = device::pool_usage(&self.dev.ctx, false)?;
        Some(dflash_core::MemoryStats {
            in_use_bytes: in_use,
            peak_bytes: peak,
        })
    }
    fn reset_peak_memory(&self) {
        let _ = self.synchronize();
        let _ = device::pool_usage(&self.dev.ctx, true);
    }
    fn element_bytes(&self) -> dflash_core::ElementBytes {
        dflash_core::ElementBytes {
            activation: self.opts.activations.size() as u64,
            compute: self.compute_format().size() as u64,
        }
    }
    fn release_cached_memory(&self) {
        // This instance's own caches first (regrown on demand; their frees are stream-ordered).
        *self.loss_ws.lock().unwrap_or_else(|p| p.into_inner()) = None;
        self.uploads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
        // Frees still in flight count as outstanding until the host has seen them complete,
        // on any stream of the context (other instances on this device share the pool).
        let _ = self.dev.ctx.synchronize();
        device::trim_pool(&self.dev.ctx);
    }
    fn memory_capacity(&self) -> Option<dflash_core::MemoryCapacity> {
        self.dev.ctx.bind_to_thread().ok()?;
        let (free, total) = cudarc::driver::result::mem_get_info().ok()?;
        Some(dflash_core::MemoryCapacity {
            free: free as u64,
            total: total as u64,
        })
    }
}

fn create(opts: &BackendOptions) -> Result<Arc<dyn Backend>> {
    Ok(Arc::new(CudaBackend::new(opts)?))
}

inventory::submit! {
    BackendRegistration {
        name: "cuda",
        description: "NVIDIA GPUs through CUDA (cudarc, dynamic loading; NVRTC kernels, cuBLASLt GEMMs)",
        create,
        device_count: || device::device_count().unwrap_or(0),
        preferred_attention: attention::FLASH,
    }
}

/// Referencing this from a binary keeps the crate (and its `inventory` registration) linked.
pub fn link() {}
