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
pub(crate) use storage::InBuf;
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
        let dev = device::get(ordinal).map_err(|e| e.into_core(&tag))?;
        let stream = dev.ctx.new_stream().map_err(|e| {
            Error::op(
                "cuda_init",
                tag.clone(),
                format!("cannot create a stream: {e}"),
            )
        })?;
        let blas = gemm::Blas::new(&stream).map_err(|e| e.into_core(&tag))?;
        let (attention, attention_name) = resolve_attention(&opts.attention)?;
        let flash = matches!(attention, AttnImpl::Flash);
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
            // Compile attention.cu now (once per device) so that a failure shows at creation.
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
        let n: usize = shape.iter().product();
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

    /// Uninitialised device memory for `n` elements (NaN-filled in poison mode: f32 NaN, or
    /// the bf16 quiet NaN 0x7FC0).
    pub(crate) fn alloc(&self, op: &'static str, n: usize, dtype: DType) -> Result<CudaSlice<u8>> {
        let bytes = (n * dtype.size()).max(16);
        // SAFETY: the memory is written before it is read by every op that allocates it
        // (the poison mode exists to test exactly that).
        let mut buf =
            unsafe { self.stream.alloc::<u8>(bytes) }.map_err(|e| self.alloc_err(op, bytes, e))?;
        if self.opts.poison && n > 0 {
            self.fill_dt(op, &mut buf, n, dtype, f32::NAN)?;
        }
        Ok(buf)
    }

    /// f32 output buffer of `n` elements.
    pub(crate) fn alloc_f32(&self, op: &'static str, n: usize) -> Result<CudaSlice<u8>> {
        self.alloc(op, n, DType::F32)
    }

    /// The activation storage type of this backend.
    pub fn activations(&self) -> DType {
        self.opts.activations
    }

    /// Zero-filled f32 buffer of `n` elements.
    pub(crate) fn zeros_f32(&self, op: &'static str, n: usize) -> Result<CudaSlice<u8>> {
        self.zeros_dt(op, n, DType::F32)
    }

    /// Zero-filled buffer of `n` elements of `dtype` (0.0 is all-zero bytes in both).
    pub(crate) fn zeros_dt(
        &self,
        op: &'static str,
        n: usize,
        dtype: DType,
    ) -> Result<CudaSlice<u8>> {
        let bytes = (n * dtype.size()).max(16);
        self.stream
            .alloc_zeros::<u8>(bytes)
            .map_err(|e| self.alloc_err(op, bytes, e))
    }

    /// A failed allocation of `bytes`: [`Error::OutOfMemory`] (with the device's free and
    /// total memory) when the device is full, else a driver error naming op and size.
    pub(crate) fn alloc_err(&self, op: &'static str, bytes: usize, e: DriverError) -> Error {
        use cudarc::driver::sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY;
        if e.0 == CUDA_ERROR_OUT_OF_MEMORY {
            let info = self
                .dev
                .ctx
                .bind_to_thread()
                .ok()
                .and_then(|_| cudarc::driver::result::mem_get_info().ok());
            return Error::OutOfMemory {
                op,
                device: self.tag.clone(),
                requested: bytes as u64,
                free: info.map(|(f, _)| f as u64),
                total: info.map(|(_, t)| t as u64),
            };
        }
        Error::op(
            op,
            self.tag.clone(),
            format!("allocating {bytes} bytes failed: {e}"),
        )
    }

    /// Fills `n` f32 elements with `v`.
    pub(crate) fn fill(
        &self,
        op: &'static str,
        buf: &mut CudaSlice<u8>,
        n: usize,
        v: f32,
    ) -> Result<()> {
        self.fill_dt(op, buf, n, DType::F32, v)
    }

    /// Fills `n` elements of `dtype` with `v` (rounded to bf16, nearest even, for bf16).
    pub(crate) fn fill_dt(
        &self,
        op: &'static str,
        buf: &mut CudaSlice<u8>,
        n: usize,
        dtype: DType,
        v: f32,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let n64 = n as i64;
        match dtype {
            DType::F32 => {
                let mut l = self.stream.launch_builder(&self.dev.kernels.fill_f32);
                l.arg(buf).arg(&n64).arg(&v);
                self.launch(op, l, grid1d(n))
            }
            DType::Bf16 => {
                let bits = storage::bf16_bits(v) as u32;
                let mut l = self.stream.launch_builder(&self.dev.kernels.fill_u16);
                l.arg(buf).arg(&n64).arg(&bits);
                self.launch(op, l, grid1d(n))
            }
        }
    }

    /// Converts `n` elements from the raw device address `src` into the raw address `dst`
    /// as `to` (the other dtype at `src`). The caller holds both pointers' guards.
    pub(crate) fn convert_ptr(
        &self,
        op: &'static str,
        dst: u64,
        src: u64,
        n: usize,
        to: DType,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let n64 = n as i64;
        let mut l = self.stream.launch_builder(self.convert_kernel(to));
        l.arg(&dst).arg(&src).arg(&n64);
        self.launch(op, l, grid_vec8(n))
    }

    /// The activation inputs of one kernel in one dtype: their own when they all agree
    /// (borrowed), else f32, with the bf16 ones widened (exactly) into scratch. Kernels with
    /// several activation inputs are instantiated per (output, input) type pair rather than
    /// per combination; mixed inputs are rare (the models never mix them there) and widening
    /// changes no value.
    pub(crate) fn uniform<'a, const N: usize>(
        &self,
        op: &'static str,
        xs: [&'a CudaStorage; N],
    ) -> Result<(DType, [InBuf<'a>; N])> {
        let d0 = xs.first().map_or(DType::F32, |s| s.dtype);
        if xs.iter().all(|s| s.dtype == d0) {
            return Ok((d0, xs.map(|s| InBuf::Borrowed(&s.buf))));
        }
        let mut out = Vec::with_capacity(N);
        for s in xs {
            out.push(self.widen(op, s)?);
        }
        let arr: [InBuf<'a>; N] = match out.try_into() {
            Ok(a) => a,
            Err(_) => unreachable!("N buffers were pushed"),
        };
        Ok((DType::F32, arr))
    }

    /// `s` as f32: borrowed when it is f32, else an exact widened copy.
    pub(crate) fn widen<'a>(&self, op: &'static str, s: &'a CudaStorage) -> Result<InBuf<'a>> {
        if s.dtype == DType::F32 {
            return Ok(InBuf::Borrowed(&s.buf));
        }
        Ok(InBuf::Owned(self.converted(
            op,
            &s.buf,
            s.len,
            DType::F32,
        )?))
    }

    /// Uploads host i32 data (indices, positions, mask intervals) to a fresh device buffer.
    pub(crate) fn upload_i32(&self, op: &'static str, data: &[i32]) -> Result<CudaSlice<u8>> {
        let mut buf = self.alloc(op, data.len(), DType::F32)?; // 4-byte elements
        if !data.is_empty() {
            self.stream
                .memcpy_htod(storage::i32_bytes(data), &mut buf)
                .map_err(|e| self.drv(op, e))?;
        }
        Ok(buf)
    }

    /// As [`Self::upload_i32`], for arrays that recur: rotary positions and mask intervals
    /// are the same in every layer of a forward and its backward (and, at equal lengths, in
    /// every sequence of a target batch). The last [`UPLOAD_CACHE_ENTRIES`] arrays stay on the
    /// device and an identical array (compared in full, not by hash) reuses its buffer: no
    /// host-to-device copy of pageable memory, which may wait for the stream, per layer.
    pub(crate) fn upload_i32_cached(
        &self,
        op: &'static str,
        data: &[i32],
    ) -> Result<Arc<CudaSlice<u8>>> {
        let mut cache = self.uploads.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = cache.iter().position(|(d, _)| d.as_slice() == data) {
            let hit = cache.remove(i).expect("index from position");
            let buf = hit.1.clone();
            cache.push_front(hit);
            return Ok(buf);
        }
        let buf = Arc::new(self.upload_i32(op, data)?);
        cache.push_front((data.to_vec(), buf.clone()));
        cache.truncate(UPLOAD_CACHE_ENTRIES);
        Ok(buf)
    }

    /// Uploads the mask's four i32 interval arrays (first start/end, second start/end).
    /// Through the upload cache: a forward and its backward, and every layer with the same
    /// mask, share one copy.
    pub(crate) fn upload_mask(
        &self,
        op: &'static str,
        mask: &dflash_core::mask::BlockMask,
    ) -> Result<[Arc<CudaSlice<u8>>; 4]> {
        let [f0, f1, s0, s1] = mask.to_i32_arrays();
        Ok([
            self.upload_i32_cached(op, &f0)?,
            self.upload_i32_cached(op, &f1)?,
            self.upload_i32_cached(op, &s0)?,
            self.upload_i32_cached(op, &s1)?,
        ])
    }

    /// Downloads `n` plain values of type `T` (synchronises the stream).
    pub(crate) fn download_pod<T: Copy + Default>(
        &self,
        op: &'static str,
        buf: &CudaSlice<u8>,
        n: usize,
    ) -> Result<Vec<T>> {
        let mut out = vec![T::default(); n];
        if n > 0 {
            let bytes = n * std::mem::size_of::<T>();
            // SAFETY: `out` owns `bytes` bytes; T is a plain value type (f32/f64/i32/u64) for
            // which every bit pattern is valid.
            let dst = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr() as *mut u8, bytes) };
            self.stream
                .memcpy_dtoh(&buf.slice(0..bytes), dst)
                .map_err(|e| self.drv(op, e))?;
        }
        self.stream.synchronize().map_err(|e| self.drv(op, e))?;
        self.dev.ctx.check_err().map_err(|e| self.drv(op, e))?;
        Ok(out)
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

/// Index arrays [`CudaBackend::upload_i32_cached`] keeps (a layer's positions and mask
/// intervals, for queries and context, with room for the backward's).
const UPLOAD_CACHE_ENTRIES: usize = 16;

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
