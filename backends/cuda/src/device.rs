//! Process-wide per-device state: the device's primary context and its compiled kernels,
//! created once per ordinal on first use (behind a mutex, so concurrent first uses compile
//! once) and shared by every backend instance on that device, from any thread.
//!
//! Before touching cudarc, the libraries it would load are checked for presence: cudarc
//! panics when a dynamically loaded library is missing, and absence must be a clean
//! [`CudaError::Unavailable`]. Any panic that still escapes cudarc during initialisation
//! (e.g. a symbol missing from an old driver) is caught and reported the same way.

use std::collections::HashMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, sys};

use crate::CudaError;
use crate::flash::FlashKernels;
use crate::kernels::Kernels;

pub(crate) struct Device {
    pub ctx: Arc<CudaContext>,
    pub kernels: Kernels,
    /// e.g. "NVIDIA H200"
    pub name: String,
    /// Compute capability `(major, minor)`.
    pub cc: (i32, i32),
    /// `kernels/attention.cu` (`"cuda-flash"`), loaded when a backend first selects it (its
    /// PTX compiled at device start when that backend started the device); a failure is kept
    /// (as its message) and reported on every use.
    pub(crate) flash: OnceLock<Result<FlashKernels, String>>,
}

static DEVICES: OnceLock<Mutex<HashMap<usize, Arc<Device>>>> = OnceLock::new();

/// Whether the driver, NVRTC and cuBLASLt libraries can be loaded; the reason when not.
pub fn check_libraries() -> Result<(), String> {
    // SAFETY: these only try to dlopen the candidate names; no symbol is called.
    let present = unsafe {
        [
            (
                "the CUDA driver (libcuda.so)",
                cudarc::driver::sys::is_culib_present(),
            ),
            (
                "NVRTC (libnvrtc.so)",
                cudarc::nvrtc::sys::is_culib_present(),
            ),
            (
                "cuBLASLt (libcublasLt.so)",
                cudarc::cublaslt::sys::is_culib_present(),
            ),
        ]
    };
    let missing: Vec<&str> = present
        .iter()
        .filter(|(_, ok)| !ok)
        .map(|(name, _)| *name)
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "cannot load {} (is LD_LIBRARY_PATH set to the CUDA 13 library directories?)",
            missing.join(", ")
        ))
    }
}

/// The number of CUDA devices, or why there are none usable.
pub fn device_count() -> Result<usize, CudaError> {
    check_libraries().map_err(CudaError::Unavailable)?;
    guarded("counting devices", || {
        cudarc::driver::result::init()
            .map_err(|e| CudaError::Unavailable(format!("cuInit failed: {e}")))?;
        let n = CudaContext::device_count()
            .map_err(|e| CudaError::Unavailable(format!("cannot count devices: {e}")))?;
        Ok(n.max(0) as usize)
    })
}

/// Runs `f`, turning a panic inside cudarc into [`CudaError::Unavailable`].
fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T, CudaError>) -> Result<T, CudaError> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into());
            Err(CudaError::Unavailable(format!("{what}: {msg}")))
        }
    }
}

/// The shared state of device `ordinal`, initialising it (context, kernel compilation) on
/// first use. `with_flash`: a backend will use `"cuda-flash"`, so its `attention.cu` is
/// compiled alongside the other kernels (where the device can run it) rather than after them.
pub(crate) fn get(ordinal: usize, with_flash: bool) -> Result<Arc<Device>, CudaError> {
    let count = device_count()?;
    if count == 0 {
        return Err(CudaError::Unavailable(
            "the driver reports no CUDA device".into(),
        ));
    }
    if ordinal >= count {
        return Err(CudaError::Unavailable(format!(
            "device ordinal {ordinal} requested but only {count} CUDA device(s) present"
        )));
    }
    let map = DEVICES.get_or_init(|| Mutex::new(HashMap::new()));
    let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(d) = map.get(&ordinal) {
        return Ok(d.clone());
    }
    let dev = guarded("initialising the device", || init(ordinal, with_flash))?;
    let dev = Arc::new(dev);
    map.insert(ordinal, dev.clone());
    Ok(dev)
}

fn init(ordinal: usize, with_flash: bool) -> Result<Device, CudaError> {
    let drv = |what: &str| {
        let what = what.to_string();
        move |e| CudaError::Driver { what, source: e }
    };
    let ctx = CudaContext::new(ordinal).map_err(|e| {
        CudaError::Unavailable(format!("cannot create a context on cuda:{ordinal}: {e}"))
    })?;
    let name = ctx.name().map_err(drv("reading the device name"))?;
    let cc = ctx
        .compute_capability()
        .map_err(drv("reading the compute capability"))?;
    keep_pool_memory(&ctx);
    let arch = format!("compute_{}{}", cc.0, cc.1);
    let kernels = std::thread::scope(|s| {
        // Only the PTX, kept by `compile_once` for `FlashKernels::load`, which reports a
        // failure (compiling again then); a panic here must not fail the other kernels.
        let flash = (with_flash && cc.0 >= 8).then(|| {
            s.spawn(move || {
                let (file, src) = crate::kernels::flash_source();
                let _ = crate::kernels::compile_once(file, &src, &crate::flash::flash_arch(cc));
            })
        });
        let kernels = Kernels::load(&ctx, &arch);
        if let Some(f) = flash {
            let _ = f.join();
        }
        kernels
    })?;
    Ok(Device {
        ctx,
        kernels,
        name,
        cc,
        flash: OnceLock::new(),
    })
}

/// The device's default memory pool, which every stream-ordered allocation of the backend
/// comes from; `None` where the device has no memory pools.
fn default_pool(ctx: &Arc<CudaContext>) -> Option<sys::CUmemoryPool> {
    if !ctx.has_async_alloc() {
        return None;
    }
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: `pool` is written by the driver before it is read.
    let rc = unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) };
    (rc == sys::cudaError_enum::CUDA_SUCCESS).then_some(pool)
}

/// Stream-ordered allocations come from the device's default pool; by default it returns
/// freed memory to the OS at every synchronisation. Keep it instead (a training step frees
/// and reallocates the same sizes every time). Best effort: failure changes only speed.
fn keep_pool_memory(ctx: &Arc<CudaContext>) {
    let Some(pool) = default_pool(ctx) else {
        return;
    };
    let threshold: u64 = u64::MAX;
    // SAFETY: the attribute value is a u64 as the driver documents for
    // CU_MEMPOOL_ATTR_RELEASE_THRESHOLD.
    unsafe {
        let _ = sys::cuMemPoolSetAttribute(
            pool,
            sys::CUmemPool_attribute_enum::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            &threshold as *const u64 as *mut std::ffi::c_void,
        );
    }
}

/// Releases the default pool's unused memory to the device ([`keep_pool_memory`] keeps it
/// otherwise), so the device's free memory counts it again. Best effort, like keeping it.
pub(crate) fn trim_pool(ctx: &Arc<CudaContext>) {
    if ctx.bind_to_thread().is_err() {
        return;
    }
    let Some(pool) = default_pool(ctx) else {
        return;
    };
    // SAFETY: a valid pool; trimming releases only memory no allocation holds.
    unsafe {
        let _ = sys::cuMemPoolTrimTo(pool, 0);
    }
}

/// Reads (or, with `reset`, zeroes) the default pool's high-water mark and current use, in
/// bytes: every stream-ordered allocation of this backend comes from that pool, so its
/// `USED_MEM_HIGH` is the peak of live tensors plus workspaces. `None` where the device has
/// no memory pools.
pub(crate) fn pool_usage(ctx: &Arc<CudaContext>, reset: bool) -> Option<(u64, u64)> {
    let pool = default_pool(ctx)?;
    let (mut used, mut high): (u64, u64) = (0, 0);
    // SAFETY: a valid pool; both attributes are u64 values as the driver documents
    // (CU_MEMPOOL_ATTR_USED_MEM_CURRENT / _HIGH); resetting HIGH takes 0.
    unsafe {
        if reset {
            let zero: u64 = 0;
            let _ = sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute_enum::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
                &zero as *const u64 as *mut std::ffi::c_void,
            );
        }
        let ok_used = sys::cuMemPoolGetAttribute(
            pool,
            sys::CUmemPool_attribute_enum::CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
            &mut used as *mut u64 as *mut std::ffi::c_void,
        );
        let ok_high = sys::cuMemPoolGetAttribute(
            pool,
            sys::CUmemPool_attribute_enum::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
            &mut high as *mut u64 as *mut std::ffi::c_void,
        );
        if ok_used != sys::cudaError_enum::CUDA_SUCCESS
            || ok_high != sys::cudaError_enum::CUDA_SUCCESS
        {
            return None;
        }
    }
    Some((used, high))
}
