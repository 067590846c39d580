//! The wgpu backend of dflash-rs: WGSL compute kernels on any GPU wgpu reaches (Vulkan,
//! Metal, DX12, GL), and on machines without one through Mesa's software Vulkan driver
//! (lavapipe), so that CI runs the GPU code path.
//!
//! - **Adapter** ([`device`]): the first high-performance adapter by default, another by
//!   `backend.device`; its name, API and the limits in force are printed when its device is
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
//! - **Debug poison**: with `DFLASH_WGPU_POISON=1` (or [`WgpuOptions::poison`]) every output
//!   buffer an op allocates is first filled with NaN, so an unwritten element shows up.

mod activation;
mod attention;
mod collective;
pub mod device;
mod embedding;
mod gemm;
mod half;
mod loss;
mod memory;
mod norm;
mod optimizer;
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
pub use storage::{DType, WgpuStorage};

use device::Ctx;
use pipelines::{Family, Kernel};

/// Knobs of a backend instance beyond [`BackendOptions`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WgpuOptions {
    /// Fill every output buffer with NaN before an op writes it (tests, debugging).
    pub poison: bool,
    /// Bind at most this many bytes per storage binding (below the adapter's limit), so that
    /// tests exercise the chunked paths on small tensors. `None`: the adapter's limit.
    pub max_binding_bytes: Option<u64>,
    /// Keep read-only tensors (frozen weights, features) in f16 where the device has
    /// `SHADER_F16` ([`WgpuBackend::compute_format`]); off, or without the feature, f32.
    pub f16: bool,
    /// Row reductions (RMSNorm, the loss's row max and sum, sums of squares) on subgroup
    /// operations where the device has `SUBGROUP`; off, or without it, through workgroup
    /// memory ([`WgpuBackend::subgroups`]).
    pub subgroups: bool,
    /// The GEMM kernel: [`GemmKernel::Large`] (`matmul128`) ships; each of the others is
    /// there to be tested or timed against it (`DFLASH_WGPU_GEMM=<entry point>` picks one,
    /// [`GemmKernel::entry`]). [`WgpuBackend::gemm_kernel`] says which one runs.
    /// [`GemmKernel::Coop`] (tensor cores, operands rounded to f16) also decides the device:
    /// the instance gets its adapter's cooperative-matrix device, or does not start where the
    /// adapter cannot run it.
    pub gemm: GemmKernel,
    /// Split `wgpu-tiled`'s tile loops into dispatches of at most this many list iterations
    /// (tests: the multi-pass path, which CPU adapters need, on any adapter). `None`: one
    /// pass on a GPU, as many as the adapter's loop cap needs on a CPU adapter.
    pub attn_pass_tiles: Option<usize>,
    /// Run `wgpu-tiled`'s forward on the subgroup kernel (attention_fwd_sg.wgsl) wherever the
    /// adapter's subgroups fit its tiles (BK = DP / 4 keys), not only where the tiles chosen
    /// for workgroup memory are already those: at head dim <= 32 that is 8-key tiles, which
    /// 8-lane subgroups take (tests: the subgroup forward on a CPU adapter such as lavapipe,
    /// whose subgroups are too narrow for it at head dim 128).
    pub attn_subgroup_tiles: bool,
    /// The subgroup forward's scores from query rows held in registers, the head dim split
    /// over 8 lanes (attention_fwd_sg.wgsl, `QREG`), instead of a staged query tile: ~17 KiB
    /// less workgroup memory at head dim 128 and one workgroup load per 4 vec4 FMAs instead
    /// of 5. Applies wherever the subgroup forward runs (the tiles are still chosen for the
    /// staged tile's memory). On by default (H200: forward 16.9 against 14.8 TFLOP/s,
    /// docs/PERF.md); `DFLASH_WGPU_ATTN_QREG=0` turns it off.
    pub attn_qreg: bool,
    /// The subgroup forward on key tiles twice as wide, two keys a lane (BK = DP / 2: 32 x 64
    /// tiles at head dim 128, ~45 KiB with the query rows in registers, which it implies): half
    /// the tiles per key, so half the barriers and staging rounds, where the adapter's
    /// workgroup memory holds them. On by default (H200: forward 18.0 TFLOP/s);
    /// `DFLASH_WGPU_ATTN_WIDE=0` turns it off.
    pub attn_wide_tiles: bool,
    /// The backward's dq kernel on subgroups (attention_dq_sg.wgsl): q and d_out rows held in
    /// registers for the whole key list, K and V the only tiles staged (two stagings and three
    /// barriers a key tile instead of four and five), where the adapter's subgroups take DP / 4
    /// lanes. On by default (H200: with dk/dv's, forward + backward 11.3 against 7.6 TFLOP/s);
    /// `DFLASH_WGPU_ATTN_DQ_SG=0` turns it off.
    pub attn_dq_subgroups: bool,
    /// The backward's dk/dv kernel on subgroups (attention_dkdv_sg.wgsl): k and v rows held in
    /// registers for the whole list, Q and d_out the only tiles staged (two stagings and three
    /// barriers a query tile instead of five and six). On by default;
    /// `DFLASH_WGPU_ATTN_DKDV_SG=0` turns it off.
    pub attn_dkdv_subgroups: bool,
    /// `wgpu-tiled`'s forward on cooperative matrices (attention_fwd_coop.wgsl: tensor cores
    /// on NVIDIA), at head dims 65..=128 that are a multiple of 4: q, k, v and the
    /// probabilities rounded to f16 for the two products (finer than the CUDA backend's bf16,
    /// within f16's range of 65504), f32 accumulation, softmax and output; a NaN or infinity
    /// in v reaches every row of each 128-row query tile that visits a key tile holding it.
    /// Calls at other head dims, and calls split into passes (CPU adapters), run the f32
    /// forward; the backward is f32 throughout. Off by default (a precision mode whose effect
    /// on training is measured by `validate.sh wgpu-train-d128`, docs/PERF.md);
    /// `DFLASH_WGPU_ATTN_COOP=auto` runs it where the adapter has what it needs
    /// ([`Coop::WhereSupported`]: the cooperative-matrix device, and the f32 forward elsewhere;
    /// [`WgpuBackend::coop_attention_forward`] says which), `=1` requires it (an adapter
    /// without it refuses to start, naming what it lacks), `=0` keeps the f32 forward. The
    /// kernel's subgroup shuffles are its own, so `DFLASH_WGPU_SUBGROUPS=0` leaves it.
    pub attn_coop: Coop,
}

/// Whether a kernel that has a cooperative-matrix version runs it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Coop {
    /// Never: the f32 kernel.
    #[default]
    Off,
    /// Where the adapter has what it needs (`device::cooperative_matrix_support` and the
    /// kernel's workgroup memory); the f32 kernel elsewhere, said once at start.
    WhereSupported,
    /// Always: an adapter without it refuses to start, naming what it lacks.
    Required,
}

impl Coop {
    /// The switch's reading: unset keeps `default`, `0` is [`Coop::Off`], `1`
    /// [`Coop::Required`], `auto` [`Coop::WhereSupported`].
    fn from_switch(value: Option<&str>, default: Coop) -> Option<Coop> {
        match value {
            None => Some(default),
            Some("0") => Some(Coop::Off),
            Some("1") => Some(Coop::Required),
            Some("auto") => Some(Coop::WhereSupported),
            Some(_) => None,
        }
    }
}

impl WgpuOptions {
    /// What the backend runs with when nothing is set: f16 storage and subgroup reductions
    /// where the device has them, the 128 x 128 GEMM tile ([`GemmKernel::Large`]), and
    /// `wgpu-tiled` on its subgroup kernels (query registers, two keys a lane, dq and dk/dv on
    /// subgroups) wherever the adapter's subgroups and workgroup memory take them, its
    /// forward in f32 ([`WgpuOptions::attn_coop`]). Tests start from it so they cover what
    /// ships.
    pub fn shipped() -> Self {
        WgpuOptions {
            poison: false,
            max_binding_bytes: None,
            f16: true,
            subgroups: true,
            gemm: GemmKernel::Large,
            attn_pass_tiles: None,
            attn_subgroup_tiles: false,
            attn_qreg: true,
            attn_wide_tiles: true,
            attn_dq_subgroups: true,
            attn_dkdv_subgroups: true,
            attn_coop: Coop::Off,
        }
    }

    /// [`Self::shipped`] with the environment's switches: `DFLASH_WGPU_POISON=1` turns poison
    /// on; `DFLASH_WGPU_F16=0` forces f32 on an adapter with `SHADER_F16` (so both paths run
    /// on one machine), `DFLASH_WGPU_SUBGROUPS=0` the workgroup-memory reductions,
    /// `DFLASH_WGPU_GEMM=<entry point>` the GEMM kernel (`matmul`, `matmul128`, `matmul128_db`,
    /// `matmul128_w`, `matmul128_n` or `matmul_coop`: [`GemmKernel`]), and
    /// `DFLASH_WGPU_ATTN_QREG`, `_WIDE`, `_DQ_SG`, `_DKDV_SG` `=0` each attention variant off
    /// (`=1` on), `DFLASH_WGPU_ATTN_COOP=auto` the tensor-core forward where the adapter has it
    /// (`=1` required, `=0` off). An unknown
    /// `DFLASH_WGPU_GEMM` is an error naming the values it takes, never a silent fallback, and
    /// so is any of the switches it replaced (`DFLASH_WGPU_GEMM_TILE`, `_DB`, `_WIDE`): set,
    /// each would otherwise time the shipped kernel under another's name. Each on/off switch
    /// takes `0` or `1`, and any other value is an error naming it (`=true` would otherwise
    /// run the default).
    pub fn from_env() -> Result<Self> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// [`Self::from_env`] over any lookup of the variables (`var(name)`: its value if set).
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let err = |detail: String| Error::op("wgpu_init", "wgpu", detail);
        for (old, entry) in [
            ("DFLASH_WGPU_GEMM_TILE", "matmul"),
            ("DFLASH_WGPU_GEMM_DB", "matmul128_db"),
            ("DFLASH_WGPU_GEMM_WIDE", "matmul128_w"),
        ] {
            if var(old).is_some() {
                return Err(err(format!(
                    "{old} is no longer read: DFLASH_WGPU_GEMM={entry} picks that kernel"
                )));
            }
        }
        let flag = |name: &str, default: bool| match var(name).as_deref() {
            None => Ok(default),
            Some("0") => Ok(false),
            Some("1") => Ok(true),
            Some(v) => Err(err(format!("{name}={v:?}: expected 0 (off) or 1 (on)"))),
        };
        let s = Self::shipped();
        let gemm = match var("DFLASH_WGPU_GEMM") {
            Some(v) => GemmKernel::from_entry(&v).ok_or_else(|| {
                let names: Vec<&str> = GemmKernel::ALL.iter().map(|k| k.entry()).collect();
                err(format!(
                    "DFLASH_WGPU_GEMM={v:?}: expected one of {}",
                    names.join(", ")
                ))
            })?,
            None => s.gemm,
        };
        Ok(WgpuOptions {
            poison: flag("DFLASH_WGPU_POISON", s.poison)?,
            f16: flag("DFLASH_WGPU_F16", s.f16)?,
            subgroups: flag("DFLASH_WGPU_SUBGROUPS", s.subgroups)?,
            gemm,
            attn_qreg: flag("DFLASH_WGPU_ATTN_QREG", s.attn_qreg)?,
            attn_wide_tiles: flag("DFLASH_WGPU_ATTN_WIDE", s.attn_wide_tiles)?,
            attn_dq_subgroups: flag("DFLASH_WGPU_ATTN_DQ_SG", s.attn_dq_subgroups)?,
            attn_dkdv_subgroups: flag("DFLASH_WGPU_ATTN_DKDV_SG", s.attn_dkdv_subgroups)?,
            attn_coop: Coop::from_switch(var("DFLASH_WGPU_ATTN_COOP").as_deref(), s.attn_coop)
                .ok_or_else(|| {
                    err(format!(
                        "DFLASH_WGPU_ATTN_COOP={:?}: expected 0 (the f32 forward), 1 (the \
                         tensor-core forward, required) or auto (where the adapter has it)",
                        var("DFLASH_WGPU_ATTN_COOP").unwrap_or_default()
                    ))
                })?,
            ..s
        })
    }
}

/// The wgpu backend: one adapter's device and queue (shared with every other instance on it).
pub struct WgpuBackend {
    ctx: Arc<Ctx>,
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
        let need = attention::AttnCfg::coop_forward_bytes();
        let coop_attention = match wopts.attn_coop {
            Coop::Off => false,
            // device::get refuses an adapter without cooperative matrices; the workgroup
            // memory is checked on the device below.
            Coop::Required => true,
            Coop::WhereSupported => {
                let lacks = device::coop_attention_lacks(opts.device, need)?;
                say_once(&match lacks.is_empty() {
                    true => "attention forward on cooperative matrices (tensor cores) at head \
                             dims 65..=128 (DFLASH_WGPU_ATTN_COOP=auto): f16 products, f32 \
                             accumulation"
                        .to_string(),
                    false => format!(
                        "attention forward in f32 (DFLASH_WGPU_ATTN_COOP=auto): the adapter \
                         lacks {}",
                        lacks.join("; ")
                    ),
                });
                lacks.is_empty()
            }
        };
        let coop = wopts.gemm == GemmKernel::Coop || coop_attention;
        let ctx = device::get(opts.device, coop)?;
        if coop_attention {
            let have = ctx.limits.max_compute_workgroup_storage_size;
            if have < need {
                return Err(Error::op(
                    "wgpu_init",
                    ctx.tag.clone(),
                    format!(
                        "the tensor-core attention forward (DFLASH_WGPU_ATTN_COOP=1) cannot \
                         run on {}: it needs {need} bytes of workgroup memory, the adapter \
                         has {have}",
                        ctx.info.name
                    ),
                ));
            }
        }
        let attention = attention::resolve(&opts.attention)?;
        Ok(WgpuBackend {
            ctx,
            opts: wopts,
            coop_attention,
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
    fn reset_peak_memory(&self) {
        self.ctx.mem.reset_peak();
    }
    fn element_bytes(&self) -> dflash_core::ElementBytes {
        dflash_core::ElementBytes {
            activation: 4,
            compute: self.compute_format().size() as u64,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(set: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let set: Vec<(String, String)> = set
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| set.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
    }

    /// No switch set: the shipped options; each switch at `0` or `1` moves its own field.
    #[test]
    fn switches_read_zero_and_one() {
        assert_eq!(
            WgpuOptions::from_vars(vars(&[])).unwrap(),
            WgpuOptions::shipped()
        );
        let on = WgpuOptions::from_vars(vars(&[
            ("DFLASH_WGPU_ATTN_COOP", "1"),
            ("DFLASH_WGPU_F16", "0"),
        ]))
        .unwrap();
        assert!(on.attn_coop == Coop::Required && !on.f16);
        assert_eq!(
            on,
            WgpuOptions {
                attn_coop: Coop::Required,
                f16: false,
                ..WgpuOptions::shipped()
            }
        );
        // The attention forward's third value: where the adapter has the tensor-core one.
        for (value, coop) in [("0", Coop::Off), ("auto", Coop::WhereSupported)] {
            let o = WgpuOptions::from_vars(vars(&[("DFLASH_WGPU_ATTN_COOP", value)])).unwrap();
            assert_eq!(o.attn_coop, coop, "DFLASH_WGPU_ATTN_COOP={value}");
        }
    }

    /// Any other value is an error that names the switch and the value, never the default.
    #[test]
    fn a_switch_at_another_value_is_an_error_naming_it() {
        for (name, value) in [
            ("DFLASH_WGPU_ATTN_COOP", "true"),
            ("DFLASH_WGPU_SUBGROUPS", "off"),
            ("DFLASH_WGPU_POISON", ""),
        ] {
            let e = WgpuOptions::from_vars(vars(&[(name, value)])).unwrap_err();
            let msg = e.to_string();
            assert!(
                msg.contains(name) && msg.contains(&format!("{value:?}")),
                "{msg}"
            );
        }
        let e = WgpuOptions::from_vars(vars(&[("DFLASH_WGPU_GEMM", "matmul256")])).unwrap_err();
        assert!(e.to_string().contains("matmul128"), "{e}");
    }
}
