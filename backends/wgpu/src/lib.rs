//! The wgpu backend of dflash-rs: WGSL compute kernels on any GPU wgpu reaches (Vulkan,
//! Metal, DX12, GL), and on machines without one through Mesa's software Vulkan driver
//! (lavapipe), so that CI runs the GPU code path.
//!
//! - **Adapter** ([`device`]): the first high-performance adapter by default, the N-th for a
//!   worker placed on device N (`pipeline.target_devices`, `pipeline.drafter_devices`); its name, API and the limits in force are printed when its device is
//!   opened. The device is opened with the adapter's real limits, and work that exceeds a
//!   binding limit is split into chunks; more than 65535 workgroups go to a 2-D grid. No
//!   adapter is [`dflash_core::Error::Unavailable`] naming what to install, never a panic.
//! - **Kernels**: WGSL in `src/shaders/*.wgsl`, one file per op family (plus the shared
//!   prelude `common.wgsl`), compiled once per device into cached pipelines whose bind-group
//!   layouts are shared (`pipelines.rs`).
//! - **Execution**: ops record into one pending command encoder per device; it is submitted
//!   when a value must reach the host (download, statistics) or every few hundred dispatches.
//!   A dropped tensor's buffer goes to the device's pool (`pool.rs`) and serves a later
//!   allocation of its size class once the work that used it was submitted, cleared first
//!   where the allocation promises zeros (`DFLASH_WGPU_POOL=0`: a new buffer for every tensor).
//! - **Storage** ([`WgpuStorage`], a [`DType`] tag validated in the downcast): f32 for
//!   everything a kernel writes (parameters, gradients, activations); the compute format of
//!   read-only tensors (frozen weights, features) is f16 where the adapter has `SHADER_F16`
//!   (`DFLASH_WGPU_F16=0` forces f32), read by memory moves, GEMM operands, the embedding
//!   table, attention's q/k/v and the loss head, widened to f32 on load; every other op
//!   rejects an f16 tensor by name. f32 accumulation in every kernel (WGSL has no portable
//!   f64), with the final sums of reductions (`sum_squares`, loss statistics) added up in f64
//!   on the host.
//! - **Attention**: host attention kernels run through a host round trip; the block-sparse
//!   WGSL kernel is `wgpu-tiled` (see `attention.rs` for what it supports).
//! - **Row reductions** (RMSNorm, the loss's row max / argmax / sum, sums of squares): on
//!   subgroup operations where the adapter has `SUBGROUP`, else through workgroup memory
//!   (`DFLASH_WGPU_SUBGROUPS=0` forces the latter); one WGSL interface (`reduce.wgsl`,
//!   `reduce_subgroups.wgsl`), the variant chosen when the pipeline is made.
//! - **Errors**: what wgpu reports outside a call's result (a validation error, a rejected
//!   submission) goes to the instance whose op raised it, never to another instance sharing
//!   the device; a lost device is `device lost: ...` of every op, never a panic
//!   ([`device::errors`]). Limits the kernels need are checked at start (`limits.rs`).
//! - **Debug poison**: with `DFLASH_WGPU_POISON=1` (or [`WgpuOptions::poison`]) every output
//!   buffer an op allocates is first filled with NaN, so an unwritten element shows up.

mod activation;
mod attention;
mod collective;
pub mod device;
mod embedding;
mod gemm;
mod half;
mod instance;
mod limits;
mod loss;
mod memory;
mod norm;
mod optimizer;
mod options;
mod pipelines;
mod pool;
mod profile;
mod rope;
mod storage;
mod vulkan;

use std::sync::Arc;

use dflash_core::registry::{BackendOptions, BackendRegistration};
use dflash_core::{Backend, BackendInfo, Error, Result, Shape, Tensor};

pub use attention::{TILED, WGPU_ATTENTION_KERNELS};
pub use device::NO_ADAPTER_HINT;
pub use gemm::GemmKernel;
pub use options::{AttnCoop, WgpuOptions};
pub use storage::{DType, WgpuStorage};
/// The wgpu this backend is built on, so that callers name its types without a second,
/// possibly different, version.
pub use wgpu;

use instance::Inst;
use pipelines::{Family, Kernel};

/// The wgpu backend: one adapter's device and queue (shared with every other instance on it),
/// and this instance's errors ([`device::errors`]).
pub struct WgpuBackend {
    ctx: Inst,
    opts: WgpuOptions,
    /// Whether `wgpu-tiled`'s forward runs on cooperative matrices where the call allows
    /// ([`WgpuOptions::attn_coop`] resolved against the adapter).
    coop_attention: bool,
    attention: attention::AttnImpl,
    attention_name: String,
    rope_tables: rope::TableCache,
    attn_meta: attention::MetaCache,
}

impl WgpuBackend {
    /// Whether `DFLASH_WGPU_PROFILE` is timing this device's kernels (set, and the adapter
    /// writes timestamps).
    pub fn profiling(&self) -> bool {
        self.ctx.profiling()
    }

    /// `DFLASH_WGPU_PROFILE`'s report: device time per kernel since the last report, largest
    /// first (`None` when not profiling or nothing ran). Also printed when a backend drops.
    pub fn take_profile(&self) -> Option<String> {
        self.ctx.take_profile()
    }
}

/// `DFLASH_WGPU_PROFILE`: the device time per kernel since the last report (`profile.rs`).
impl Drop for WgpuBackend {
    fn drop(&mut self) {
        if let Some(report) = self.ctx.take_profile() {
            let (hits, misses, held) = self.ctx.pool.stats();
            eprintln!(
                "{report}wgpu buffer pool: {hits} allocations reused a freed buffer, {misses} \
                 created one; {:.1} MiB held",
                held as f64 / (1u64 << 20) as f64
            );
        }
    }
}

impl WgpuBackend {
    /// The backend on adapter `opts.device` with [`WgpuOptions::from_env`] (whose error, an
    /// unknown switch value, it returns). [`Error::Unavailable`] (never a panic) where this
    /// machine has no adapter.
    pub fn new(opts: &BackendOptions) -> Result<Self> {
        Self::with_options(opts, WgpuOptions::from_env()?)
    }

    /// The backend on adapter `opts.device` with `wopts`. [`GemmKernel::Coop`] and the
    /// tensor-core attention forward ([`WgpuOptions::attn_coop`] where it runs) take the
    /// adapter's cooperative-matrix device ([`device::get`]). Where one is required and the
    /// adapter lacks what it needs, the error names the adapter and each thing it lacks
    /// ([`device::cooperative_matrix_support`]): never the f32 kernel under its name.
    pub fn with_options(opts: &BackendOptions, wopts: WgpuOptions) -> Result<Self> {
        let coop_attention = coop_attention_at_start(opts, wopts.attn_coop)?;
        let ctx = device::get(
            opts.device,
            wopts.gemm == GemmKernel::Coop || coop_attention,
        )?;
        // device::get refused an adapter without cooperative matrices; what is left to
        // require is the forward's workgroup memory.
        if wopts.attn_coop == AttnCoop::Required
            && let Some(lack) =
                device::coop_attention_memory_lack(ctx.limits.max_compute_workgroup_storage_size)
        {
            return Err(Error::op(
                "wgpu_init",
                ctx.tag.clone(),
                format!(
                    "the tensor-core attention forward (DFLASH_WGPU_ATTN_COOP=1) cannot run on \
                     {}: it lacks {lack}",
                    ctx.info.name
                ),
            ));
        }
        let attention = attention::resolve(&opts.attention)?;
        let lacks = limits::check(&ctx.limits, opts.attention == attention::TILED);
        if !lacks.is_empty() {
            return Err(Error::op(
                "wgpu_init",
                ctx.tag.clone(),
                format!(
                    "{} cannot run this backend: {}",
                    ctx.info.name,
                    lacks.join("; ")
                ),
            ));
        }
        let gemm = limits::gemm_for(wopts.gemm, ctx.limits.max_compute_workgroup_storage_size);
        if gemm != wopts.gemm {
            say_once(&format!(
                "GEMM {} instead of {}: the adapter's {} bytes of workgroup memory do not hold \
                 {}'s {}",
                gemm.entry(),
                wopts.gemm.entry(),
                ctx.limits.max_compute_workgroup_storage_size,
                wopts.gemm.entry(),
                wopts.gemm.workgroup_bytes()
            ));
        }
        Ok(WgpuBackend {
            ctx: Inst::new(ctx),
            opts: wopts,
            // Host attention kernels never run the tiled forward.
            coop_attention: coop_attention && opts.attention == attention::TILED,
            attention,
            attention_name: opts.attention.clone(),
            rope_tables: Default::default(),
            attn_meta: Default::default(),
        })
    }

    pub fn options(&self) -> WgpuOptions {
        self.opts
    }

    /// Whether `wgpu-tiled`'s forward runs on cooperative matrices at the head dims that have
    /// that kernel ([`WgpuOptions::attn_coop`], resolved against the adapter at start).
    pub fn coop_attention_forward(&self) -> bool {
        self.coop_attention
    }

    /// The adapter, API and limits in force, as printed at start.
    pub fn summary(&self) -> String {
        self.ctx.summary()
    }

    /// The device's buffer pool: `(hits, misses, bytes held)`, where a hit is an allocation
    /// served by a freed buffer and a miss one that created a buffer (`DFLASH_WGPU_POOL=0`: no
    /// pool, nothing counted).
    pub fn buffer_pool_stats(&self) -> (u64, u64, u64) {
        self.ctx.pool.stats()
    }

    /// The adapter's largest device-local heap, less what this process's devices on it hold
    /// (live tensors and pooled buffers), capped by the driver's budget where wgpu enabled
    /// `VK_EXT_memory_budget` (`vulkan::memory`): what a job's memory plan is checked against
    /// on a discrete GPU (`memory_capacity`; CPU adapters and integrated GPUs use host
    /// memory). `None` on an API other than Vulkan, which has no such query.
    pub fn device_memory(&self) -> Option<dflash_core::MemoryCapacity> {
        let heap = vulkan::memory::device_local(&self.ctx.device)?;
        Some(heap.capacity(device::held_on_adapter(self.ctx.ordinal)))
    }

    /// Whether this instance's row reductions run on subgroup operations: the device has
    /// `SUBGROUP` and [`WgpuOptions::subgroups`] is on.
    pub fn subgroups(&self) -> bool {
        self.opts.subgroups && self.ctx.features.contains(wgpu::Features::SUBGROUP)
    }

    /// The adapter's subgroup sizes, smallest and largest (0, 0 without `SUBGROUP`).
    pub fn subgroup_sizes(&self) -> (u32, u32) {
        if !self.ctx.features.contains(wgpu::Features::SUBGROUP) {
            return (0, 0);
        }
        (
            self.ctx.info.subgroup_min_size,
            self.ctx.info.subgroup_max_size,
        )
    }

    /// `k` (of a family that reduces rows) in this instance's reduction variant.
    pub(crate) fn reducing<'a>(&self, k: &Kernel<'a>) -> Kernel<'a> {
        k.with_subgroups(self.subgroups())
    }

    /// The limits the device was opened with.
    pub fn limits(&self) -> &wgpu::Limits {
        &self.ctx.limits
    }

    /// The adapter this instance's device was opened on: name, API, device type, driver.
    pub fn adapter_info(&self) -> &wgpu::AdapterInfo {
        &self.ctx.info
    }

    pub(crate) fn tag(&self) -> &str {
        &self.ctx.tag
    }

    /// Wraps a buffer as a tensor of `shape`.
    pub(crate) fn tensor(&self, s: WgpuStorage, shape: impl Into<Shape>) -> Tensor {
        Tensor::from_storage(Box::new(s), shape)
    }

    /// An output buffer of `n` f32 elements that the op writes in full before anything reads
    /// it: one from the pool holds old values (not cleared: that would be a second pass over
    /// the output's bytes), and in poison mode NaN, so a kernel that leaves an element
    /// unwritten fails the poisoned conformance suites.
    pub(crate) fn out(&self, op: &'static str, n: usize) -> Result<WgpuStorage> {
        let s = self.ctx.alloc_for_writes(op, n, DType::F32)?;
        if self.opts.poison && n > 0 {
            self.fill(op, &s, 0, n, f32::NAN)?;
        }
        Ok(s)
    }

    /// Bytes one storage binding may cover: the adapter's limit (or the test cap), rounded
    /// down to the offset alignment so that chunk boundaries are valid binding offsets.
    pub(crate) fn max_binding_bytes(&self) -> u64 {
        let limit = self.ctx.limits.max_storage_buffer_binding_size;
        let cap = self.opts.max_binding_bytes.map_or(limit, |c| c.min(limit));
        let align = self.ctx.limits.min_storage_buffer_offset_alignment.max(4) as u64;
        // At least two alignments, so that a span (shifted by < one alignment) always fits.
        (cap / align * align).max(2 * align)
    }

    /// Elements one binding may cover (a multiple of the offset alignment in elements).
    pub(crate) fn max_binding_elems(&self) -> usize {
        (self.max_binding_bytes() / 4) as usize
    }

    /// Elements `[start, start + len)` of `s` bound from the aligned offset at or below
    /// `start`: the binding, and the element shift of `start` inside it. `len` must be at most
    /// [`Self::span_elems_of`] the storage's dtype.
    pub(crate) fn span<'a>(
        &self,
        s: &'a WgpuStorage,
        start: usize,
        len: usize,
    ) -> (pipelines::Bind<'a>, u32) {
        let align = self.ctx.align_of(s.dtype);
        let base = start / align * align;
        (
            s.bind_elems(base, len + (start - base)),
            (start - base) as u32,
        )
    }

    /// The longest span [`Self::span`] binds (room left for the alignment shift).
    pub(crate) fn span_elems(&self) -> usize {
        self.max_binding_elems() - self.ctx.align_elems()
    }

    /// The longest span of `dtype` elements [`Self::span`] binds: an f16 element is half an
    /// f32 word, so twice [`Self::span_elems`] (bytes and alignment shift both halve).
    pub(crate) fn span_elems_of(&self, dtype: storage::DType) -> usize {
        self.span_elems() * (4 / dtype.size())
    }

    /// `[0, n)` in `(start, len)` chunks that each fit one binding.
    pub(crate) fn chunks(&self, n: usize) -> impl Iterator<Item = (usize, usize)> + use<> {
        let c = self.max_binding_elems();
        (0..n).step_by(c.max(1)).map(move |s| (s, c.min(n - s)))
    }

    /// A typed error of `op` on this device.
    pub(crate) fn err(&self, op: &'static str, detail: impl Into<String>) -> Error {
        Error::op(op, self.ctx.tag.clone(), detail)
    }

    /// A shape error of `op` on this device.
    pub(crate) fn shape_err(&self, op: &'static str, detail: impl Into<String>) -> Error {
        Error::shape(op, self.ctx.tag.clone(), detail)
    }

    /// Fills f32 elements `[start, start + n)` of `s` with `v` (chunked over bindings).
    pub(crate) fn fill(
        &self,
        op: &'static str,
        s: &WgpuStorage,
        start: usize,
        n: usize,
        v: f32,
    ) -> Result<()> {
        self.fill_words(op, &s.buf, start, n, v.to_bits())
    }

    /// Fills 32-bit words `[start, start + n)` of `buf` with `bits` (chunked over bindings).
    pub(crate) fn fill_words(
        &self,
        op: &'static str,
        buf: &wgpu::Buffer,
        start: usize,
        n: usize,
        bits: u32,
    ) -> Result<()> {
        const FILL: Kernel<'static> = Kernel::new(Family::Memory, "fill");
        let align = self.ctx.align_elems();
        let (base, shift) = (start / align * align, start % align);
        for (c0, len) in self.chunks(n + shift) {
            let lo = c0.max(shift);
            let count = len - (lo - c0);
            let params = [(lo - c0) as u32, count as u32, bits];
            let bind = pipelines::Bind {
                buf,
                offset: 4 * (base + c0) as u64,
                size: 4 * len.max(1) as u64,
            };
            self.ctx
                .dispatch(op, &FILL, &params, &[], &[bind], groups(count, 256))?;
        }
        Ok(())
    }
}

/// Workgroups of `per` threads (or items) covering `n`.
pub(crate) fn groups(n: usize, per: usize) -> u64 {
    n.div_ceil(per) as u64
}

impl BackendInfo for WgpuBackend {
    fn name(&self) -> &'static str {
        "wgpu"
    }
    fn device(&self) -> String {
        format!(
            "{} ({}, {:?})",
            self.ctx.tag, self.ctx.info.name, self.ctx.info.backend
        )
    }
    fn attention_kernel(&self) -> &str {
        &self.attention_name
    }
    fn synchronize(&self) -> Result<()> {
        self.ctx.wait("synchronize")
    }
    fn memory_stats(&self) -> Option<dflash_core::MemoryStats> {
        let (in_use, peak) = self.ctx.mem.get();
        Some(dflash_core::MemoryStats {
            in_use_bytes: in_use,
            peak_bytes: peak,
        })
    }
    fn allocation_rounding(&self) -> dflash_core::AllocationRounding {
        // A tensor whose class would pass the buffer limit keeps its own size, which the
        // plan's rounding overstates by less than a class: on the safe side.
        self.ctx.pool.rounding()
    }
    fn reset_peak_memory(&self) {
        self.ctx.mem.reset_peak();
    }
    fn release_cached_memory(&self) {
        // Submitted and finished first, so what queued work freed is in the pool to let go.
        let _ = self.synchronize();
        self.ctx.pool.drain();
    }
    fn element_bytes(&self) -> dflash_core::ElementBytes {
        dflash_core::ElementBytes {
            activation: 4,
            compute: self.compute_format().size() as u64,
        }
    }
    fn memory_capacity(&self) -> Option<dflash_core::MemoryCapacity> {
        // A CPU adapter's buffers are host memory, which the plan then asks the host for; the
        // heap it reports is the driver's placeholder (lavapipe in Mesa 22: 2 GiB on any
        // machine). An integrated GPU's are host memory too, and its device-local heap can be
        // a small carve-out beside the system memory it also allocates from: planned against
        // the heap, a job that fits would be refused.
        match self.ctx.info.device_type {
            wgpu::DeviceType::Cpu | wgpu::DeviceType::IntegratedGpu => None,
            _ => self.device_memory(),
        }
    }
}

fn create(opts: &BackendOptions) -> Result<Arc<dyn Backend>> {
    Ok(Arc::new(WgpuBackend::new(opts)?))
}

inventory::submit! {
    BackendRegistration {
        name: "wgpu",
        description: "any GPU through wgpu (Vulkan, Metal, DX12, GL; lavapipe on CPU-only machines): WGSL kernels",
        create,
        device_count: device::adapter_count,
        preferred_attention: attention::TILED,
    }
}

/// Referencing this from a binary keeps the crate (and its `inventory` registrations) linked.
pub fn link() {}

/// Whether an instance with `opts` and `mode` opens the cooperative-matrix device for the
/// tensor-core attention forward: required (`=1`), or where supported (shipped, `=auto`) on
/// `wgpu-tiled` where the adapter has what it needs (said once at start either way).
fn coop_attention_at_start(opts: &BackendOptions, mode: AttnCoop) -> Result<bool> {
    Ok(match mode {
        AttnCoop::Off => false,
        AttnCoop::Required => true,
        AttnCoop::WhereSupported if opts.attention != attention::TILED => false,
        AttnCoop::WhereSupported => {
            let lacks = device::coop_attention_lacks(opts.device)?;
            say_once(&match lacks.is_empty() {
                true => "attention forward on cooperative matrices (tensor cores) at head dims \
                         65..=128 that are a multiple of 4: f16 products, f32 accumulation \
                         (DFLASH_WGPU_ATTN_COOP=0: the f32 forward)"
                    .to_string(),
                false => format!(
                    "attention forward in f32: the tensor-core one needs what this adapter \
                     lacks: {}",
                    lacks.join("; ")
                ),
            });
            lacks.is_empty()
        }
    })
}

/// Prints `dflash-backend-wgpu: {line}` the first time this process says `line` (a choice
/// made per backend instance, which a job makes several of).
fn say_once(line: &str) {
    static SAID: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    let mut said = SAID.lock().unwrap_or_else(|p| p.into_inner());
    if !said.iter().any(|s| s == line) {
        eprintln!("dflash-backend-wgpu: {line}");
        said.push(line.to_string());
    }
}
