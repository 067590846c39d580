//! Determinism is checked exactly when declared: the same slightly non-deterministic kernel
//! (the Rust example with the last bit of `out[0]` flipped on every other call, far inside the
//! tolerance) passes without `DF_ATTN_CAP_DETERMINISTIC` and fails with it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use dflash_attention_abi as abi;
use dflash_attention_loader::{Plugin, PluginKernel};
use dflash_plugin_conformance::{Outcome, check_plugin};
use dflash_plugin_rust_tiled::{CAPABILITIES, dflash_attention_plugin as inner_entry};

static CALLS: AtomicU32 = AtomicU32::new(0);

fn inner() -> &'static abi::DfAttnPlugin {
    unsafe { &*inner_entry(abi::ABI_MAJOR, abi::ABI_MINOR) }
}

unsafe extern "C" fn forward(_: *const abi::DfAttnPlugin, a: *const abi::DfAttnForwardArgs) -> i32 {
    let t = inner();
    let status = unsafe { (t.forward.unwrap())(t, a) };
    if status == 0 && CALLS.fetch_add(1, Ordering::Relaxed) % 2 == 1 {
        unsafe {
            let out = &*(*a).out;
            let x = out
                .data
                .cast::<u8>()
                .add(out.byte_offset as usize)
                .cast::<f32>();
            *x = f32::from_bits((*x).to_bits() ^ 1);
        }
    }
    status
}
unsafe extern "C" fn backward(
    _: *const abi::DfAttnPlugin,
    a: *const abi::DfAttnBackwardArgs,
) -> i32 {
    let t = inner();
    unsafe { (t.backward.unwrap())(t, a) }
}
unsafe extern "C" fn workspace(
    _: *const abi::DfAttnPlugin,
    s: *const abi::DfAttnShape,
    pass: i32,
    bytes: *mut u64,
) -> i32 {
    let t = inner();
    unsafe { (t.workspace_bytes.unwrap())(t, s, pass, bytes) }
}
unsafe extern "C" fn last_error(_: *const abi::DfAttnPlugin) -> *const std::ffi::c_char {
    let t = inner();
    unsafe { (t.last_error.unwrap())(t) }
}

/// The Rust example's capabilities without determinism.
const CAPS: abi::DfAttnCapabilities = abi::DfAttnCapabilities {
    flags: CAPABILITIES.flags & !abi::CAP_DETERMINISTIC,
    ..CAPABILITIES
};
static UNDECLARED: abi::DfAttnCapabilities = CAPS;
static DECLARED: abi::DfAttnCapabilities = abi::DfAttnCapabilities {
    flags: CAPS.flags | abi::CAP_DETERMINISTIC,
    ..CAPS
};
const fn table(caps: &'static abi::DfAttnCapabilities) -> abi::DfAttnPlugin {
    abi::DfAttnPlugin {
        struct_size: abi::size_of_u32::<abi::DfAttnPlugin>(),
        abi_major: abi::ABI_MAJOR,
        abi_minor: abi::ABI_MINOR,
        reserved: 0,
        name: c"jittery".as_ptr(),
        version: c"0".as_ptr(),
        capabilities: caps,
        workspace_bytes: Some(workspace),
        forward: Some(forward),
        backward: Some(backward),
        last_error: Some(last_error),
    }
}
static JITTERY: abi::DfAttnPlugin = table(&UNDECLARED);
static JITTERY_CLAIMING: abi::DfAttnPlugin = table(&DECLARED);
unsafe extern "C" fn jittery(_: u32, _: u32) -> *const abi::DfAttnPlugin {
    &JITTERY
}
unsafe extern "C" fn jittery_claiming(_: u32, _: u32) -> *const abi::DfAttnPlugin {
    &JITTERY_CLAIMING
}

fn kernel(entry: abi::EntryPointFn) -> PluginKernel {
    let plugin = unsafe { Plugin::from_entry("jittery", entry) }.expect("open");
    PluginKernel::new(Arc::new(plugin)).expect("cpu f32")
}

#[test]
fn reruns_must_be_bit_identical_only_when_determinism_is_declared() {
    let relaxed = check_plugin(&kernel(jittery)).expect("suite");
    let failed: Vec<_> = relaxed.failed().iter().map(|r| r.name.clone()).collect();
    assert!(
        relaxed.passed(),
        "undeclared determinism still failed: {failed:?}"
    );

    let strict = check_plugin(&kernel(jittery_claiming)).expect("suite");
    assert!(!strict.passed());
    assert!(strict.rows.iter().any(|r| matches!(
        &r.outcome,
        Outcome::Failed(m) if m.contains("forward is not deterministic")
    )));
}
