//! The in-tree `tiled` kernel ([`dflash_attention_tiled::TiledAttention`]) as a foreign plugin:
//! a cdylib exporting `dflash_attention_plugin` per `dflash_attention.h`. What a Rust plugin
//! author copies: the static table, per-thread `last_error`, and every exported function
//! behind [`guard`] so a panic becomes `DF_ATTN_ERR_PANIC`, never an unwind into C.
//!
//! The calls are checked (tensors, mask) and rebuilt as the host-side [`AttnForward`] /
//! [`AttnBackward`], whose constructors check every length against the dims, so the kernel
//! code is exactly the in-tree one.

mod args;

use std::cell::RefCell;
use std::ffi::{CString, c_char};
use std::panic::{AssertUnwindSafe, catch_unwind};

use dflash_attention_abi::{self as abi, DfAttnPlugin, Status};
use dflash_attention_tiled::TiledAttention;
use dflash_core::mask::BlockMask;
use dflash_core::{AttnBackward, AttnDims, AttnForward, HostAttentionKernel};

use args::{Checked, Fail, check, mask};

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// Runs `f`, turning an `Err` into its status and a panic into `DF_ATTN_ERR_PANIC`, both with
/// the message in `last_error`.
pub fn guard(f: impl FnOnce() -> Result<(), Fail>) -> i32 {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => Status::Ok.code(),
        Ok(Err((status, msg))) => {
            set_last_error(&msg);
            status.code()
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "(no message)".into());
            set_last_error(&format!("rust-tiled panicked: {what}"));
            Status::Panic.code()
        }
    }
}

/// This crate's shared library as cargo builds it for a test of a crate that depends on it:
/// in the test binary's `deps/` directory or the one above (cdylib file names carry no hash).
/// `None` where neither holds it.
pub fn library_beside(test_exe: &std::path::Path) -> Option<std::path::PathBuf> {
    let name = format!(
        "{}dflash_plugin_rust_tiled{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    let deps = test_exe.parent()?;
    [deps.join(&name), deps.join("..").join(&name)]
        .into_iter()
        .find(|p| p.exists())
}

/// What this plugin declares.
pub const CAPABILITIES: abi::DfAttnCapabilities = abi::DfAttnCapabilities {
    struct_size: abi::size_of_u32::<abi::DfAttnCapabilities>(),
    device_type: abi::kDLCPU,
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
    name: c"rust-tiled".as_ptr(),
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
    // The CString lives in the thread's slot until this thread's next failing call.
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

unsafe extern "C" fn workspace_bytes(
    _: *const DfAttnPlugin,
    shape: *const abi::DfAttnShape,
    _pass: i32,
    bytes: *mut u64,
) -> i32 {
    guard(|| {
        if shape.is_null() || bytes.is_null() {
            return Err((Status::InvalidArgument, "NULL shape or bytes".into()));
        }
        // The kernel allocates its own (small, per-tile) state.
        unsafe { *bytes = 0 };
        Ok(())
    })
}

fn dims_of(q: &[usize], k: &[usize]) -> AttnDims {
    AttnDims {
        q_rows: q[0],
        kv_rows: k[0],
        q_heads: q[1],
        kv_heads: k[1],
        head_dim: q[2],
    }
}

fn kernel_err(msg: String) -> Fail {
    (Status::InvalidArgument, msg)
}

/// q, k, v and the mask, checked against each other: their views and the call's dims.
///
/// # Safety
/// The pointers are null or valid per the header.
unsafe fn inputs(
    q: *const abi::DLTensor,
    k: *const abi::DLTensor,
    v: *const abi::DLTensor,
    m: *const abi::DfAttnMask,
) -> Result<([Checked; 3], BlockMask, AttnDims), Fail> {
    let (q, k, v) = unsafe { (check("q", q, 3)?, check("k", k, 3)?, check("v", v, 3)?) };
    let mask = unsafe { mask(m)? };
    if q.shape[2] != k.shape[2] || k.shape != v.shape {
        return Err(kernel_err(format!(
            "q {:?}, k {:?}, v {:?} disagree",
            q.shape, k.shape, v.shape
        )));
    }
    let dims = dims_of(&q.shape, &k.shape);
    Ok(([q, k, v], mask, dims))
}

/// Each `(name, got, want)` shape must match: the call's constructors check lengths only.
fn same_shapes(pairs: &[(&str, &[usize], &[usize])]) -> Result<(), Fail> {
    match pairs.iter().find(|(_, got, want)| got != want) {
        Some((what, got, want)) => Err(kernel_err(format!("{what} {got:?}, expected {want:?}"))),
        None => Ok(()),
    }
}

unsafe extern "C" fn forward(_: *const DfAttnPlugin, a: *const abi::DfAttnForwardArgs) -> i32 {
    guard(|| unsafe {
        // Against the 1.0 size, not size_of: a host of any 1.x is served (see read_versioned).
        let a = abi::read_versioned(a, abi::FORWARD_ARGS_SIZE_V1_0)
            .ok_or_else(|| kernel_err("forward args NULL or struct_size too small".into()))?;
        let ([q, k, v], mask, dims) = inputs(a.q, a.k, a.v, a.mask)?;
        let (out, lse) = (check("out", a.out, 3)?, check("lse", a.lse, 2)?);
        same_shapes(&[
            ("out", &out.shape, &q.shape),
            ("lse", &lse.shape, &q.shape[..2]),
        ])?;
        let call = AttnForward::new(
            &dims,
            &mask,
            a.scale,
            [q.slice(), k.slice(), v.slice()],
            [out.slice_mut(), lse.slice_mut()],
        )
        .map_err(kernel_err)?;
        TiledAttention::new().forward(call).map_err(kernel_err)
    })
}

unsafe extern "C" fn backward(_: *const DfAttnPlugin, a: *const abi::DfAttnBackwardArgs) -> i32 {
    guard(|| unsafe {
        // Against the 1.0 size, not size_of: a host of any 1.x is served (see read_versioned).
        let a = abi::read_versioned(a, abi::BACKWARD_ARGS_SIZE_V1_0)
            .ok_or_else(|| kernel_err("backward args NULL or struct_size too small".into()))?;
        let ([q, k, v], mask, dims) = inputs(a.q, a.k, a.v, a.mask)?;
        let (out, lse, d_out) = (
            check("out", a.out, 3)?,
            check("lse", a.lse, 2)?,
            check("d_out", a.d_out, 3)?,
        );
        let (dq, dk, dv) = (
            check("dq", a.dq, 3)?,
            check("dk", a.dk, 3)?,
            check("dv", a.dv, 3)?,
        );
        same_shapes(&[
            ("out", &out.shape, &q.shape),
            ("lse", &lse.shape, &q.shape[..2]),
            ("d_out", &d_out.shape, &q.shape),
            ("dq", &dq.shape, &q.shape),
            ("dk", &dk.shape, &k.shape),
            ("dv", &dv.shape, &k.shape),
        ])?;
        let call = AttnBackward::new(
            &dims,
            &mask,
            a.scale,
            [
                q.slice(),
                k.slice(),
                v.slice(),
                out.slice(),
                lse.slice(),
                d_out.slice(),
            ],
            [dq.slice_mut(), dk.slice_mut(), dv.slice_mut()],
        )
        .map_err(kernel_err)?;
        TiledAttention::new().backward(call).map_err(kernel_err)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    fn message() -> String {
        unsafe { CStr::from_ptr(last_error(&PLUGIN)) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn a_panic_becomes_the_panic_status_with_its_message() {
        let status = guard(|| panic!("kernel bug"));
        assert_eq!(status, Status::Panic.code());
        assert!(message().contains("kernel bug"), "{}", message());
    }

    #[test]
    fn null_args_are_invalid_not_a_crash() {
        let status = unsafe { forward(&PLUGIN, std::ptr::null()) };
        assert_eq!(status, Status::InvalidArgument.code());
        assert!(message().contains("forward args"), "{}", message());
    }

    #[test]
    fn another_major_is_refused() {
        assert!(unsafe { dflash_attention_plugin(abi::ABI_MAJOR + 1, 0) }.is_null());
        assert!(!unsafe { dflash_attention_plugin(abi::ABI_MAJOR, 7) }.is_null());
    }
}
