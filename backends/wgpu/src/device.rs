//! Adapters, devices and queues: which adapter a backend instance runs on, the limits it runs
//! under, and the process-wide cache that gives every backend instance on one adapter the
//! same device (so tensors are local across instances, and WGSL is compiled once per device).
//!
//! Adapter order ([`adapters::select`]): wgpu's enumeration, stably sorted so that discrete
//! GPUs come first, then integrated, virtual, CPU (lavapipe / llvmpipe) and other adapters, and
//! within a kind the native APIs (Vulkan, Metal, DX12) before GL. CPU adapters are dropped when
//! any other adapter exists (Mesa's lavapipe sits next to the GPU's driver on many GPU
//! machines, and counted, round-robin placement would put a worker on it); GL adapters are
//! dropped when a native one is left: GL is then a second view of the same hardware (lavapipe
//! and llvmpipe, or a GPU through both drivers), and counting it would place a job's workers on
//! "two" devices that are one. A worker placed on device N (`pipeline.target_devices`,
//! `pipeline.drafter_devices`) takes the N-th; the default, 0, is the first high-performance
//! adapter. wgpu's `WGPU_BACKEND` variable (e.g. `vulkan`, `gl`) restricts which APIs are
//! searched (`gl` to use GL where a native API exists); `WGPU_ADAPTER_NAME` (as wgpu's
//! `initialize_adapter_from_env` reads it: a case-insensitive part of the name) keeps only the
//! adapters it names, before those rules (`WGPU_ADAPTER_NAME=llvmpipe`: lavapipe on a machine
//! with a GPU).
//!
//! Errors wgpu raises outside a call's result, and the device's loss, are kept per device and
//! reported to the instance that raised them ([`errors`]).
//!
//! An instance whose GEMM is the cooperative-matrix kernel (`GemmKernel::Coop`) gets a second
//! device on its adapter, opened with `EXPERIMENTAL_COOPERATIVE_MATRIX` (wgpu's experimental
//! features enabled) and tagged `wgpu:N/coop`, shared by every such instance; every other
//! instance's device never has the experimental feature. Where the adapter cannot run the
//! kernel ([`cooperative_matrix_support`]) the instance does not start.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use dflash_core::{Error, Result};

use crate::pipelines::Pipelines;

mod adapters;
pub(crate) mod errors;

use adapters::adapters;

/// What is missing when no adapter exists, in every "unavailable" error.
pub const NO_ADAPTER_HINT: &str = "no GPU adapter was found through Vulkan, Metal, DX12 or GL \
     (on Linux without a GPU, install Mesa's software Vulkan driver lavapipe: \
     `apt-get install mesa-vulkan-drivers`)";

/// Number of compute-capable adapters here (0 without any).
pub fn adapter_count() -> usize {
    adapters().list.len()
}

/// `"name (API, kind)"` of every adapter, in selection order.
pub fn adapter_names() -> Vec<String> {
    adapters()
        .list
        .iter()
        .map(|a| describe(&a.get_info()))
        .collect()
}

fn describe(info: &wgpu::AdapterInfo) -> String {
    format!("{} ({:?}, {:?})", info.name, info.backend, info.device_type)
}

/// Bytes of a device's live tensors (each its buffer's size: padded to 16 bytes and rounded
/// up to its size class), and their high-water mark.
#[derive(Debug, Default)]
pub(crate) struct MemCounter {
    in_use: AtomicU64,
    peak: AtomicU64,
}

impl MemCounter {
    pub(crate) fn add(&self, bytes: u64) {
        let now = self.in_use.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak.fetch_max(now, Ordering::Relaxed);
    }
    pub(crate) fn sub(&self, bytes: u64) {
        self.in_use.fetch_sub(bytes, Ordering::Relaxed);
    }
    pub(crate) fn get(&self) -> (u64, u64) {
        (
            self.in_use.load(Ordering::Relaxed),
            self.peak.load(Ordering::Relaxed),
        )
    }
    pub(crate) fn reset_peak(&self) {
        self.peak
            .store(self.in_use.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}

/// The optional features requested where the adapter offers them: `SHADER_F16` (f16 storage
/// buffers, the compute format of read-only tensors) and `SUBGROUP` (subgroup reductions).
pub const OPTIONAL_FEATURES: wgpu::Features =
    wgpu::Features::SHADER_F16.union(wgpu::Features::SUBGROUP);

/// The feature of the cooperative-matrix device (tensor cores: VK_KHR_cooperative_matrix on
/// Vulkan, simdgroup matrices on Metal), requested only for the kernels that use it
/// (`matmul_coop`, the tensor-core attention forward; [`get`]).
pub const COOP_FEATURE: wgpu::Features = wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX;

/// One adapter's device, queue and everything built on them once.
pub struct Ctx {
    pub ordinal: usize,
    /// `"wgpu:N"` (`"wgpu:N/coop"` for the cooperative-matrix device), the device in every
    /// error message.
    pub tag: String,
    pub info: wgpu::AdapterInfo,
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    /// The limits in force: the adapter's own, requested in full.
    pub limits: wgpu::Limits,
    /// The optional features in force: those of [`OPTIONAL_FEATURES`] the adapter offers, and
    /// [`COOP_FEATURE`] on the cooperative-matrix device.
    pub features: wgpu::Features,
    /// Whether the device was opened without robust buffer access (`DFLASH_WGPU_ROBUSTNESS=off`,
    /// a measurement switch: nothing checks buffer accesses then).
    pub unrobust: bool,
    /// Whether each new pipeline's compiled statistics are reported
    /// (`DFLASH_WGPU_PIPELINE_STATS`, where the driver offers them).
    pub(crate) pipeline_stats: bool,
    pub(crate) pipelines: Pipelines,
    /// Errors wgpu raised outside an error scope, and the device's loss ([`errors`]).
    pub(crate) errors: Arc<errors::ErrorLog>,
    pub(crate) mem: MemCounter,
    /// Freed tensor buffers kept for reuse (`DFLASH_WGPU_POOL=0`: none kept).
    pub(crate) pool: crate::pool::BufferPool,
    pub(crate) pending: Mutex<crate::pipelines::Pending>,
}

impl Ctx {
    /// Takes the errors wgpu raised for the instance running on this thread
    /// ([`errors::current`]) since its last check, as an error of `op`; `device lost` where
    /// the device is.
    pub(crate) fn check(&self, op: &'static str) -> Result<()> {
        self.alive(op)?;
        let me = errors::current().map(|o| o.instance);
        let errs = self.errors.take_for(me, &self.tag);
        if errs.is_empty() {
            return Ok(());
        }
        Err(Error::op(
            op,
            self.tag.clone(),
            format!("wgpu error: {}", errs.join("; ")),
        ))
    }

    /// `Err` of `op`, `device lost: <reason>`, where the device was lost (destroyed, or lost
    /// by the driver): every op of every instance on it fails then.
    pub(crate) fn alive(&self, op: &'static str) -> Result<()> {
        match self.errors.lost() {
            None => Ok(()),
            Some(reason) => Err(self.lost_error(op, &reason)),
        }
    }

    fn lost_error(&self, op: &'static str, reason: &str) -> Error {
        Error::op(
            op,
            self.tag.clone(),
            format!(
                "device lost: {reason} ({}; its tensors are gone, a new backend instance \
                 opens the adapter again)",
                self.info.name
            ),
        )
    }

    /// Waits until the device is idle (what was submitted has run); a failed wait, or wgpu's
    /// panic on a device error met while waiting, is `device lost` of `op`.
    pub(crate) fn wait_idle(&self, op: &'static str) -> Result<()> {
        match errors::wait_idle(&self.device) {
            errors::Waited::Idle => {}
            errors::Waited::Failed(e) => {
                // A loss can surface as a failed wait; say so where the callback has run.
                self.alive(op)?;
                return Err(Error::op(
                    op,
                    self.tag.clone(),
                    format!("waiting for the device: {e}"),
                ));
            }
            errors::Waited::Lost(why) => self.errors.lose(why),
        }
        // Also where the wait itself went well: the device-lost callback runs inside it.
        self.alive(op)
    }

    /// Whether the device has f16 storage buffers (`SHADER_F16`).
    pub fn has_f16(&self) -> bool {
        self.features.contains(wgpu::Features::SHADER_F16)
    }

    /// One line for the start-up log: adapter, API, driver, the limits and optional features
    /// in force.
    pub fn summary(&self) -> String {
        let l = &self.limits;
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        let feature = |f: wgpu::Features, name: &str| {
            let on = if self.features.contains(f) {
                "yes"
            } else {
                "no"
            };
            format!("{name} {on}")
        };
        format!(
            "{}: {} ({:?} {:?}, driver {} {}); limits in force: storage binding {:.0} MiB, \
             buffer {:.0} MiB, workgroup storage {} KiB, {} invocations per workgroup, \
             {} workgroups per dimension, offset alignment {} B; features: {}, {} \
             (subgroups of {}..={} lanes){}{}",
            self.tag,
            self.info.name,
            self.info.backend,
            self.info.device_type,
            self.info.driver,
            self.info.driver_info,
            mib(l.max_storage_buffer_binding_size),
            mib(l.max_buffer_size),
            l.max_compute_workgroup_storage_size / 1024,
            l.max_compute_invocations_per_workgroup,
            l.max_compute_workgroups_per_dimension,
            l.min_storage_buffer_offset_alignment,
            feature(wgpu::Features::SHADER_F16, "SHADER_F16"),
            feature(wgpu::Features::SUBGROUP, "SUBGROUP"),
            self.info.subgroup_min_size,
            self.info.subgroup_max_size,
            if self.features.contains(COOP_FEATURE) {
                ", EXPERIMENTAL_COOPERATIVE_MATRIX (for matmul_coop and attn_fwd_coop)"
            } else {
                ""
            },
            if self.unrobust {
                "; robust buffer access off (DFLASH_WGPU_ROBUSTNESS=off)"
            } else {
                ""
            },
        )
    }
}

/// The device of adapter `ordinal` (with `coop`, the one opened for the cooperative-matrix
/// kernels), made on first use (and again after the device was lost) and shared process-wide. Prints the adapter, its API and the
/// limits in force when the device is made.
pub fn get(ordinal: usize, coop: bool) -> Result<Arc<Ctx>> {
    let mut devices = devices();
    // A lost device stays lost: a new instance opens the adapter again (the old device's
    // instances keep failing with `device lost`).
    if let Some(ctx) = devices.get(&(ordinal, coop))
        && ctx.errors.lost().is_none()
    {
        return Ok(ctx.clone());
    }
    let ctx = Arc::new(open(ordinal, coop)?);
    eprintln!("dflash-backend-wgpu: {}", ctx.summary());
    devices.insert((ordinal, coop), ctx.clone());
    Ok(ctx)
}

/// The devices this process opened, by adapter and whether it is the cooperative-matrix one.
type Devices = HashMap<(usize, bool), Arc<Ctx>>;

fn devices() -> std::sync::MutexGuard<'static, Devices> {
    static DEVICES: OnceLock<Mutex<Devices>> = OnceLock::new();
    DEVICES
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// Bytes the devices this process opened on adapter `ordinal` hold, live tensors and pooled
/// buffers: the plain device and the cooperative-matrix one allocate from the same memory.
pub(crate) fn held_on_adapter(ordinal: usize) -> u64 {
    devices()
        .iter()
        .filter(|((o, _), _)| *o == ordinal)
        .map(|(_, ctx)| ctx.mem.get().0 + ctx.pool.stats().2)
        .sum()
}

/// What adapter `ordinal` lacks for the cooperative-matrix kernels (`GemmKernel::Coop`,
/// `DFLASH_WGPU_GEMM=matmul_coop`, and the tensor-core attention forward, whose larger
/// workgroup memory `WgpuBackend::with_options` checks on the device), naming the adapter:
/// `EXPERIMENTAL_COOPERATIVE_MATRIX` with a 16 x 16 x 16 f16 x f16 -> f32 subgroup
/// configuration among `Adapter::cooperative_matrix_properties`, subgroups of exactly 32 lanes
/// (each kernel splits its 256 threads into 8 subgroups), `SHADER_F16`, `SUBGROUP` (their
/// subgroup builtins) and the GEMM's 20 KiB of workgroup memory. `Ok` where it has
/// everything; an `Unavailable` error where this machine has no adapter at all.
pub fn cooperative_matrix_support(ordinal: usize) -> Result<()> {
    let tag = format!("wgpu:{ordinal}");
    let adapter = choose_adapter(ordinal, &tag)?;
    let lacks = coop_lacks(adapter);
    if lacks.is_empty() {
        return Ok(());
    }
    Err(Error::op(
        "wgpu_init",
        tag,
        format!(
            "the cooperative-matrix kernels (DFLASH_WGPU_GEMM=matmul_coop, \
             DFLASH_WGPU_ATTN_COOP=1) cannot run on {}: it lacks {}",
            describe(&adapter.get_info()),
            lacks.join("; ")
        ),
    ))
}

/// What adapter `ordinal` lacks for the tensor-core attention forward: what
/// [`cooperative_matrix_support`] checks, and the forward's workgroup memory (empty: nothing,
/// so the shipped setting, `AttnCoop::WhereSupported`, runs it there). An `Unavailable` error
/// where this machine has no adapter at all.
pub fn coop_attention_lacks(ordinal: usize) -> Result<Vec<String>> {
    let adapter = choose_adapter(ordinal, &format!("wgpu:{ordinal}"))?;
    let mut lacks = coop_lacks(adapter);
    lacks.extend(coop_attention_memory_lack(
        adapter.limits().max_compute_workgroup_storage_size,
    ));
    Ok(lacks)
}

/// The tensor-core attention forward's workgroup memory, where `have` bytes fall short of it.
pub(crate) fn coop_attention_memory_lack(have: u32) -> Option<String> {
    let need = crate::attention::AttnCfg::coop_forward_bytes();
    (have < need).then(|| {
        format!("the attention forward's {need} bytes of workgroup memory (it has {have})")
    })
}

/// What [`cooperative_matrix_support`] finds missing on `adapter` (empty: nothing).
fn coop_lacks(adapter: &wgpu::Adapter) -> Vec<String> {
    use wgpu::CooperativeScalarType::{F16, F32};
    let (features, info) = (adapter.features(), adapter.get_info());
    let mut lacks = Vec::new();
    let has = |f| features.contains(f);
    if !has(COOP_FEATURE) {
        lacks.push("the feature EXPERIMENTAL_COOPERATIVE_MATRIX".to_string());
    }
    let configs = adapter.cooperative_matrix_properties();
    let fits = |p: &wgpu::CooperativeMatrixProperties| {
        (p.m_size, p.n_size, p.k_size, p.ab_type, p.cr_type) == (16, 16, 16, F16, F32)
    };
    if !configs.iter().any(fits) {
        let list: Vec<String> = configs
            .iter()
            .map(|p| {
                let (m, n, k) = (p.m_size, p.n_size, p.k_size);
                format!("{m}x{n}x{k} {:?} -> {:?}", p.ab_type, p.cr_type)
            })
            .collect();
        lacks.push(format!(
            "a 16x16x16 F16 -> F32 subgroup cooperative matrix configuration (it lists [{}])",
            list.join(", ")
        ));
    }
    let (lo, hi) = (info.subgroup_min_size, info.subgroup_max_size);
    if (lo, hi) != (32, 32) {
        lacks.push(format!(
            "subgroups of exactly 32 lanes (it has {lo}..={hi})"
        ));
    }
    for (f, name) in [
        (wgpu::Features::SHADER_F16, "SHADER_F16"),
        (wgpu::Features::SUBGROUP, "SUBGROUP"),
    ] {
        if !has(f) {
            lacks.push(format!("the feature {name}"));
        }
    }
    let wg = adapter.limits().max_compute_workgroup_storage_size;
    let need = crate::gemm::COOP_WORKGROUP_BYTES;
    if wg < need {
        lacks.push(format!("{need} bytes of workgroup memory (it has {wg})"));
    }
    lacks
}

/// The device of adapter `ordinal`: opened with the adapter's limits and the optional features
/// it offers (with `coop`, [`COOP_FEATURE`] too, where [`cooperative_matrix_support`] finds
/// everything the kernel needs, else an error), its uncaptured errors collected for
/// [`Ctx::check`], its caches empty. Not cached: [`get`] is the process's one device of an
/// adapter.
pub(crate) fn open(ordinal: usize, coop: bool) -> Result<Ctx> {
    if coop {
        cooperative_matrix_support(ordinal)?;
    }
    let tag = match coop {
        true => format!("wgpu:{ordinal}/coop"),
        false => format!("wgpu:{ordinal}"),
    };
    let adapter = choose_adapter(ordinal, &tag)?;
    let info = adapter.get_info();
    let desc = device_descriptor(adapter, coop);
    let OpenedDevice {
        device,
        queue,
        unrobust,
        pipeline_stats,
    } = request_device(adapter, &desc, &info, &tag)?;
    let errors = errors::install(&device);
    let limits = device.limits();
    let features = device.features() & (OPTIONAL_FEATURES | COOP_FEATURE);
    let pipelines = Pipelines::new(&device);
    Ok(Ctx {
        ordinal,
        tag,
        info,
        device,
        queue,
        limits,
        features,
        unrobust,
        pipeline_stats,
        pipelines,
        errors,
        mem: MemCounter::default(),
        pool: crate::pool::BufferPool::new(pool_wanted(), POOL_CAP),
        pending: Mutex::new(Default::default()),
    })
}

/// The most bytes of freed buffers a device keeps for reuse ([`crate::pool`]).
const POOL_CAP: u64 = 4 << 30;

/// Whether devices keep freed buffers for reuse: yes unless `DFLASH_WGPU_POOL=0` (a
/// measurement switch: every tensor a new buffer, as wgpu allocates it).
fn pool_wanted() -> bool {
    std::env::var("DFLASH_WGPU_POOL").map_or(true, |v| v != "0")
}

/// Adapter `ordinal` of [`adapters`]; `Unavailable` where there is none at all, and an error
/// of `tag` listing the adapters where `ordinal` is past their end.
fn choose_adapter(ordinal: usize, tag: &str) -> Result<&'static wgpu::Adapter> {
    let list = &adapters().list;
    if list.is_empty() {
        return Err(Error::Unavailable {
            name: "wgpu".into(),
            reason: adapters()
                .unmatched
                .clone()
                .unwrap_or_else(|| NO_ADAPTER_HINT.into()),
        });
    }
    list.get(ordinal).ok_or_else(|| {
        Error::op(
            "wgpu_init",
            tag.to_string(),
            format!(
                "device {ordinal} was asked for (pipeline.target_devices / \
                 pipeline.drafter_devices, or the placement's round robin), but this machine has \
                 {} adapter(s): {}",
                list.len(),
                adapter_names()
                    .iter()
                    .enumerate()
                    .map(|(i, n)| format!("{i}: {n}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )
    })
}

/// What `adapter`'s device is requested with: the adapter's own limits in full, and those of
/// [`OPTIONAL_FEATURES`] it offers (with `TIMESTAMP_QUERY` under `DFLASH_WGPU_PROFILE`), and
/// with `coop` [`COOP_FEATURE`] with wgpu's experimental features enabled. The hand-opened
/// Vulkan device (`vulkan::open`) is made from the same descriptor through the same wgpu-hal
/// calls (`required_device_extensions` adds VK_KHR_cooperative_matrix for the feature,
/// `physical_device_features` enables it and the Vulkan memory model, `device_from_raw` lets
/// naga's SPIR-V declare it), so the measurement switches keep the kernel.
fn device_descriptor(adapter: &wgpu::Adapter, coop: bool) -> wgpu::DeviceDescriptor<'static> {
    // The adapter's real limits, not WebGPU's small defaults (128 MiB bindings, 16 KiB of
    // workgroup memory): large tensors and attention tiles need them.
    let limits = adapter.limits();
    let mut wanted = OPTIONAL_FEATURES;
    if crate::profile::wanted() {
        wanted |= wgpu::Features::TIMESTAMP_QUERY;
    }
    let mut features = adapter.features() & wanted;
    let mut experimental = wgpu::ExperimentalFeatures::disabled();
    if coop {
        features |= COOP_FEATURE;
        // SAFETY: wgpu's contract for its experimental features is to accept that their
        // implementation may still have bugs; the only one requested is the cooperative-matrix
        // feature, whose kernels' cooperative loads and stores are proven in bounds
        // (gemm_coop.wgsl's and attention_fwd_coop.wgsl's headers) and which the conformance
        // suite checks where an adapter has it.
        experimental = unsafe { wgpu::ExperimentalFeatures::enabled() };
    }
    wgpu::DeviceDescriptor {
        label: Some("dflash"),
        required_features: features,
        required_limits: limits.clone(),
        experimental_features: experimental,
        memory_hints: wgpu::MemoryHints::Performance,
        trace: wgpu::Trace::Off,
    }
}

/// A device and queue as [`request_device`] opened them, and the switches in force on them.
struct OpenedDevice {
    device: wgpu::Device,
    queue: wgpu::Queue,
    /// Opened without robust buffer access ([`Ctx::unrobust`]).
    unrobust: bool,
    /// Each new pipeline's statistics are reported ([`Ctx::pipeline_stats`]).
    pipeline_stats: bool,
}

/// Opens `adapter` (described by `info`) for `desc`: through wgpu's `request_device`, or by
/// hand where the process's switches ([`crate::vulkan::HandOpen`]) ask for what wgpu does
/// not do, warning of each switch that is on or cannot be honoured. A failure is an error of
/// `tag` naming the adapter.
fn request_device(
    adapter: &wgpu::Adapter,
    desc: &wgpu::DeviceDescriptor<'_>,
    info: &wgpu::AdapterInfo,
    tag: &str,
) -> Result<OpenedDevice> {
    let how = crate::vulkan::HandOpen::from_env();
    if how.unrobust {
        eprintln!(
            "dflash-backend-wgpu: warning: {}",
            crate::vulkan::open::WARNING
        );
    }
    let opened = if how.needed() {
        crate::vulkan::open::open_by_hand(adapter, desc, how)
            .map(|o| (o.device, o.queue, o.executable_properties))
    } else {
        pollster::block_on(adapter.request_device(desc))
            .map(|(d, q)| (d, q, false))
            .map_err(|e| e.to_string())
    };
    let (device, queue, pipeline_stats) = opened.map_err(|e| {
        Error::op(
            "wgpu_init",
            tag.to_string(),
            format!("{}: cannot open the device: {e}", describe(info)),
        )
    })?;
    if how.executable_properties && !pipeline_stats {
        eprintln!(
            "dflash-backend-wgpu: DFLASH_WGPU_PIPELINE_STATS: the driver does not offer \
             VK_KHR_pipeline_executable_properties; no statistics"
        );
    }
    Ok(OpenedDevice {
        device,
        queue,
        unrobust: how.unrobust,
        pipeline_stats,
    })
}
