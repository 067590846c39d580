//! A CUDA attention plugin: what the ABI looks like from a device kernel. It receives device
//! pointers and the host's `CUstream`, compiles its kernels (`src/kernels.cu`) with NVRTC once
//! per CUDA context (the host's current one, told apart by its id), and launches them on that
//! stream without synchronising. The mask intervals are read on the device, so their bounds are
//! the host's to have checked (the header requires them within `[0, kv_len)`).

mod check;

use std::cell::RefCell;
use std::ffi::{CString, c_char, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Mutex;

use cudarc::driver::{result, sys};
use dflash_attention_abi::{self as abi, DfAttnPlugin, Status};

use check::{Fail, checked, dims, invalid, mask};

const SOURCE: &str = include_str!("kernels.cu");
const THREADS: u32 = 128;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn guard(f: impl FnOnce() -> Result<(), Fail>) -> i32 {
    let (status, msg) = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => return Status::Ok.code(),
        Ok(Err(fail)) => fail,
        Err(_) => (Status::Panic, "cuda-attention panicked".to_string()),
    };
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
    status.code()
}

fn internal(what: &str, e: impl std::fmt::Debug) -> Fail {
    (Status::Internal, format!("{what}: {e:?}"))
}

/// The kernels of one context, whose module lives exactly as long as that context: they are
/// found by the context's id, not its handle. A device's primary context keeps its handle when
/// its last user releases it (the context, and every module loaded in it, is destroyed) and the
/// next backend retains it again, so a cache by handle would hand that backend functions of an
/// unloaded module; the id (`cuCtxGetId`) is unique to each creation of a context.
#[derive(Clone, Copy)]
struct Kernels {
    id: u64,
    ctx: usize,
    fwd: usize,
    dq: usize,
    dkdv: usize,
}

static MODULES: Mutex<Vec<Kernels>> = Mutex::new(Vec::new());

fn kernels() -> Result<Kernels, Fail> {
    // Dynamic loading: without these libraries cudarc would panic on first use.
    // SAFETY: these only try to dlopen the candidate names; no symbol is called.
    let present = unsafe {
        cudarc::driver::sys::is_culib_present() && cudarc::nvrtc::sys::is_culib_present()
    };
    if !present {
        return Err((Status::Internal, "libcuda or libnvrtc not found".into()));
    }
    result::init().map_err(|e| internal("cuInit", e))?;
    let ctx = result::ctx::get_current()
        .map_err(|e| internal("cuCtxGetCurrent", e))?
        .ok_or_else(|| {
            (
                Status::Internal,
                "no current CUDA context on this thread".into(),
            )
        })?;
    let mut id = 0u64;
    // SAFETY: `ctx` is the calling thread's current context, which the host keeps alive for
    // the call; `id` is a valid out-pointer.
    unsafe { sys::cuCtxGetId(ctx, &mut id) }
        .result()
        .map_err(|e| internal("cuCtxGetId", e))?;
    let ctx = ctx as usize;
    let mut mods = MODULES.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(k) = mods.iter().find(|k| k.id == id) {
        return Ok(*k);
    }
    // An entry under this handle belongs to a context destroyed since, and its module with it
    // (nothing to unload).
    mods.retain(|k| k.ctx != ctx);
    let ptx = cudarc::nvrtc::compile_ptx(SOURCE).map_err(|e| internal("NVRTC", e))?;
    let image = CString::new(ptx.to_src()).map_err(|e| internal("PTX", e))?;
    let module = unsafe { result::module::load_data(image.as_ptr().cast()) }
        .map_err(|e| internal("cuModuleLoadData", e))?;
    let get = |name: &str| {
        unsafe { result::module::get_function(module, CString::new(name).unwrap_or_default()) }
            .map(|f| f as usize)
            .map_err(|e| internal(name, e))
    };
    let k = Kernels {
        id,
        ctx,
        fwd: get("attn_fwd")?,
        dq: get("attn_bwd_dq")?,
        dkdv: get("attn_bwd_dkdv")?,
    };
    mods.push(k);
    Ok(k)
}

/// Launches `f` over `n` threads on `stream` with `params` (each a pointer to an argument).
fn launch(f: usize, n: i64, stream: *mut c_void, params: &mut [*mut c_void]) -> Result<(), Fail> {
    if n == 0 {
        return Ok(());
    }
    let blocks = (n as u64).div_ceil(THREADS as u64) as u32;
    unsafe {
        result::launch_kernel(
            f as sys::CUfunction,
            (blocks, 1, 1),
            (THREADS, 1, 1),
            0,
            stream as sys::CUstream,
            params,
        )
    }
    .map_err(|e| internal("cuLaunchKernel", e))
}

macro_rules! params {
    ($($x:ident),*) => { [$((&mut $x) as *mut _ as *mut c_void),*] };
}

/// What this plugin declares.
pub const CAPABILITIES: abi::DfAttnCapabilities = abi::DfAttnCapabilities {
    struct_size: abi::size_of_u32::<abi::DfAttnCapabilities>(),
    device_type: abi::kDLCUDA,
    dtypes: abi::DTYPE_F32,
    head_dim_min: 1,
    head_dim_max: 1024,
    head_dim_multiple: 1,
    flags: abi::CAP_GQA | abi::CAP_DETERMINISTIC | abi::CAP_BACKWARD,
    mask_rules: abi::MASK_TWO_INTERVALS | abi::MASK_EMPTY_ROWS,
};
static CAPS: abi::DfAttnCapabilities = CAPABILITIES;

static PLUGIN: DfAttnPlugin = DfAttnPlugin {
    struct_size: abi::size_of_u32::<DfAttnPlugin>(),
    abi_major: abi::ABI_MAJOR,
    abi_minor: abi::ABI_MINOR,
    reserved: 0,
    name: c"cuda-attention".as_ptr(),
    version: c"0.1.0".as_ptr(),
    capabilities: &CAPS,
    workspace_bytes: Some(workspace_bytes),
    forward: Some(forward),
    backward: Some(backward),
    last_error: Some(last_error),
};

/// The entry point (`dflash_attention_plugin` in the header).
///
/// # Safety
/// Callable from any thread; returns NULL for a host of another ABI major.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn dflash_attention_plugin(major: u32, _minor: u32) -> *const DfAttnPlugin {
    if major == abi::ABI_MAJOR {
        &PLUGIN
    } else {
        std::ptr::null()
    }
}

unsafe extern "C" fn last_error(_: *const DfAttnPlugin) -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

unsafe extern "C" fn workspace_bytes(
    _: *const DfAttnPlugin,
    shape: *const abi::DfAttnShape,
    pass: i32,
    bytes: *mut u64,
) -> i32 {
    guard(|| {
        let s = unsafe { shape.as_ref() }.ok_or_else(|| invalid("shape is NULL"))?;
        if bytes.is_null() {
            return Err(invalid("bytes is NULL"));
        }
        // The backward's delta = rowsum(d_out * out), one f32 per (row, head).
        let n = if pass == abi::PASS_BACKWARD {
            s.q_rows.max(0) * s.q_heads.max(0) * 4
        } else {
            0
        };
        unsafe { *bytes = n as u64 };
        Ok(())
    })
}

unsafe extern "C" fn forward(_: *const DfAttnPlugin, a: *const abi::DfAttnForwardArgs) -> i32 {
    guard(|| {
        // Against the 1.0 size, not size_of: a host of any 1.x is served (see read_versioned).
        let a = unsafe { abi::read_versioned(a, abi::FORWARD_ARGS_SIZE_V1_0) }
            .ok_or_else(|| invalid("forward args NULL or struct_size too small"))?;
        let [tq, tk, hq, hkv, d] = dims(a.q, a.k)?;
        let (qs, ks) = ([tq, hq, d], [tk, hkv, d]);
        let (mut q, mut k, mut v) = (
            checked("q", a.q, &qs)?,
            checked("k", a.k, &ks)?,
            checked("v", a.v, &ks)?,
        );
        let (mut out, mut lse) = (
            checked("out", a.out, &qs)?,
            checked("lse", a.lse, &[tq, hq])?,
        );
        let [mut fs, mut fe, mut ss, mut se] = mask(a.mask, tq, tk)?;
        if !a.scale.is_finite() {
            return Err(invalid("scale is not finite"));
        }
        let kern = kernels()?;
        let (mut tq_, mut hq_, mut hkv_, mut d_, mut scale) =
            (tq as i32, hq as i32, hkv as i32, d as i32, a.scale);
        let mut p = params!(q, k, v, fs, fe, ss, se, out, lse, tq_, hq_, hkv_, d_, scale);
        launch(kern.fwd, tq * hq, a.stream, &mut p)
    })
}

unsafe extern "C" fn backward(_: *const DfAttnPlugin, a: *const abi::DfAttnBackwardArgs) -> i32 {
    guard(|| {
        // Against the 1.0 size, not size_of: a host of any 1.x is served (see read_versioned).
        let a = unsafe { abi::read_versioned(a, abi::BACKWARD_ARGS_SIZE_V1_0) }
            .ok_or_else(|| invalid("backward args NULL or struct_size too small"))?;
        let [tq, tk, hq, hkv, d] = dims(a.q, a.k)?;
        let (qs, ks, ls) = ([tq, hq, d], [tk, hkv, d], [tq, hq]);
        let (mut q, mut k, mut v) = (
            checked("q", a.q, &qs)?,
            checked("k", a.k, &ks)?,
            checked("v", a.v, &ks)?,
        );
        let (mut out, mut lse, mut d_out) = (
            checked("out", a.out, &qs)?,
            checked("lse", a.lse, &ls)?,
            checked("d_out", a.d_out, &qs)?,
        );
        let (mut dq, mut dk, mut dv) = (
            checked("dq", a.dq, &qs)?,
            checked("dk", a.dk, &ks)?,
            checked("dv", a.dv, &ks)?,
        );
        let [mut fs, mut fe, mut ss, mut se] = mask(a.mask, tq, tk)?;
        if !a.scale.is_finite() {
            return Err(invalid("scale is not finite"));
        }
        let need = (tq * hq * 4) as u64;
        if a.workspace_bytes < need || (need > 0 && a.workspace.is_null()) {
            return Err(invalid(format!(
                "workspace of {} bytes, {need} needed",
                a.workspace_bytes
            )));
        }
        let mut delta = a.workspace as u64;
        let kern = kernels()?;
        let (mut tq_, mut tk_, mut hq_, mut hkv_, mut d_, mut scale) = (
            tq as i32, tk as i32, hq as i32, hkv as i32, d as i32, a.scale,
        );
        let mut p = params!(
            q, k, v, out, lse, d_out, fs, fe, ss, se, dq, delta, tq_, hq_, hkv_, d_, scale
        );
        launch(kern.dq, tq * hq, a.stream, &mut p)?;
        // Same stream: runs after attn_bwd_dq has written delta.
        let mut p = params!(
            q, k, v, lse, d_out, delta, fs, fe, ss, se, dk, dv, tq_, tk_, hq_, hkv_, d_, scale
        );
        launch(kern.dkdv, tk * hkv, a.stream, &mut p)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message() -> String {
        let p = unsafe { last_error(&PLUGIN) };
        unsafe { std::ffi::CStr::from_ptr(p) }
            .to_string_lossy()
            .into_owned()
    }

    /// The checks run before any CUDA call, so they hold on a machine without a GPU.
    #[test]
    fn host_tensors_and_null_args_are_refused_before_any_cuda_call() {
        assert_eq!(
            unsafe { forward(&PLUGIN, std::ptr::null()) },
            Status::InvalidArgument.code()
        );
        assert!(message().contains("forward args"), "{}", message());
        let mut data = [0f32; 8];
        let mut shape = [2i64, 1, 4];
        let t = abi::DLTensor {
            data: data.as_mut_ptr().cast(),
            device: abi::DLDevice::CPU,
            ndim: 3,
            dtype: abi::DLDataType::F32,
            shape: shape.as_mut_ptr(),
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        };
        assert_eq!(
            checked("q", &t, &[2, 1, 4]),
            Err((Status::Unsupported, "q: not in CUDA memory".into()))
        );
        assert!(unsafe { dflash_attention_plugin(abi::ABI_MAJOR + 1, 0) }.is_null());
    }
}
