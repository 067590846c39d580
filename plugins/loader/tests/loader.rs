//! The loader's refusals and error paths, each naming the plugin and the call, on the C example
//! plugin and on fake tables built here.

use std::ffi::c_char;
use std::path::PathBuf;
use std::sync::Arc;

use dflash_attention_abi as abi;
use dflash_attention_loader::{Plugin, PluginError, PluginKernel};
use dflash_core::mask::BlockMask;
use dflash_core::{AttnDims, AttnForward, HostAttentionKernel};

const CAPS: abi::DfAttnCapabilities = abi::DfAttnCapabilities {
    struct_size: abi::size_of_u32::<abi::DfAttnCapabilities>(),
    device_type: abi::kDLCPU,
    dtypes: abi::DTYPE_F32,
    head_dim_min: 1,
    head_dim_max: 64,
    head_dim_multiple: 1,
    flags: abi::CAP_GQA,
    mask_rules: abi::MASK_TWO_INTERVALS | abi::MASK_EMPTY_ROWS,
};
static CUDA_CAPS: abi::DfAttnCapabilities = abi::DfAttnCapabilities {
    device_type: abi::kDLCUDA,
    ..CAPS
};
static CPU_CAPS: abi::DfAttnCapabilities = CAPS;

unsafe extern "C" fn no_workspace(
    _: *const abi::DfAttnPlugin,
    _: *const abi::DfAttnShape,
    _: i32,
    bytes: *mut u64,
) -> i32 {
    unsafe { *bytes = 0 };
    0
}
unsafe extern "C" fn failing_forward(
    _: *const abi::DfAttnPlugin,
    _: *const abi::DfAttnForwardArgs,
) -> i32 {
    abi::Status::Internal.code()
}
unsafe extern "C" fn boom(_: *const abi::DfAttnPlugin) -> *const c_char {
    c"the fake kernel always fails".as_ptr()
}

const fn table(major: u32, caps: &'static abi::DfAttnCapabilities) -> abi::DfAttnPlugin {
    abi::DfAttnPlugin {
        struct_size: abi::size_of_u32::<abi::DfAttnPlugin>(),
        abi_major: major,
        abi_minor: 0,
        reserved: 0,
        name: c"fake".as_ptr(),
        version: c"0.0.1".as_ptr(),
        capabilities: caps,
        workspace_bytes: Some(no_workspace),
        forward: Some(failing_forward),
        backward: None,
        last_error: Some(boom),
    }
}
static FAILING: abi::DfAttnPlugin = table(abi::ABI_MAJOR, &CPU_CAPS);
static MAJOR_2: abi::DfAttnPlugin = table(2, &CPU_CAPS);
static ON_CUDA: abi::DfAttnPlugin = table(abi::ABI_MAJOR, &CUDA_CAPS);
static NO_FORWARD: abi::DfAttnPlugin = abi::DfAttnPlugin {
    forward: None,
    ..table(abi::ABI_MAJOR, &CPU_CAPS)
};

unsafe extern "C" fn failing(_: u32, _: u32) -> *const abi::DfAttnPlugin {
    &FAILING
}
unsafe extern "C" fn major_2(_: u32, _: u32) -> *const abi::DfAttnPlugin {
    &MAJOR_2
}
unsafe extern "C" fn on_cuda(_: u32, _: u32) -> *const abi::DfAttnPlugin {
    &ON_CUDA
}
unsafe extern "C" fn no_forward(_: u32, _: u32) -> *const abi::DfAttnPlugin {
    &NO_FORWARD
}
unsafe extern "C" fn refuses(_: u32, _: u32) -> *const abi::DfAttnPlugin {
    std::ptr::null()
}

fn open(label: &str, entry: abi::EntryPointFn) -> Result<Plugin, PluginError> {
    // SAFETY: the fake entry points above return valid static tables (or NULL).
    unsafe { Plugin::from_entry(label, entry) }
}

/// One small forward call (causal 5, 2 heads, D 8) on `kernel`.
fn small_forward(kernel: &dyn HostAttentionKernel, head_dim: usize) -> Result<Vec<f32>, String> {
    let mask = BlockMask::causal(5).map_err(|e| e.to_string())?;
    let dims = AttnDims {
        q_rows: 5,
        kv_rows: 5,
        q_heads: 2,
        kv_heads: 1,
        head_dim,
    };
    let n = 5 * 2 * head_dim;
    let q: Vec<f32> = (0..n).map(|i| (i % 7) as f32 * 0.1).collect();
    let kv: Vec<f32> = (0..n / 2).map(|i| (i % 5) as f32 * 0.2 - 0.4).collect();
    let (mut out, mut lse) = (vec![f32::NAN; n], vec![f32::NAN; 10]);
    let call = AttnForward::new(&dims, &mask, 0.5, [&q, &kv, &kv], [&mut out, &mut lse])?;
    kernel.forward(call)?;
    Ok(out)
}

#[test]
fn a_missing_library_is_a_load_error_naming_the_path() {
    let err = PluginKernel::load("/no/such/dir/libplugin.so").unwrap_err();
    assert!(matches!(err, PluginError::Load { .. }), "{err}");
    assert!(
        err.to_string().contains("/no/such/dir/libplugin.so"),
        "{err}"
    );
}

#[test]
#[cfg(target_os = "linux")]
fn a_library_without_the_entry_point_is_a_missing_symbol() {
    // Any shared library that is not a plugin: the C runtime's math library.
    let err = PluginKernel::load("libm.so.6").unwrap_err();
    match &err {
        PluginError::MissingSymbol { symbol, .. } => assert_eq!(*symbol, abi::ENTRY_POINT),
        other => panic!("expected MissingSymbol, got {other}"),
    }
}

#[test]
fn version_mismatches_are_refused_by_both_sides() {
    let err = open("major-2", major_2).unwrap_err();
    assert!(matches!(err, PluginError::Version { .. }), "{err}");
    assert!(err.to_string().contains("speaks 2.0"), "{err}");
    let err = open("refuses", refuses).unwrap_err();
    assert!(err.to_string().contains("returned NULL"), "{err}");
}

#[test]
fn a_table_without_forward_is_malformed() {
    let err = open("no-forward", no_forward).unwrap_err();
    assert!(matches!(err, PluginError::Malformed { .. }), "{err}");
    assert!(err.to_string().contains("forward"), "{err}");
}

#[test]
fn a_device_plugin_cannot_serve_host_memory() {
    let err = PluginKernel::new(Arc::new(open("on-cuda", on_cuda).unwrap())).unwrap_err();
    assert!(
        matches!(err, PluginError::MissingCapability { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("kDLCPU"), "{err}");
}

#[test]
fn a_non_zero_status_carries_the_plugins_message() {
    let kernel = PluginKernel::new(Arc::new(open("failing", failing).unwrap())).unwrap();
    let err = small_forward(&kernel, 8).unwrap_err();
    for want in [
        "fake 0.0.1 (failing)",
        "forward",
        "DF_ATTN_ERR_INTERNAL",
        "always fails",
    ] {
        assert!(err.contains(want), "{want:?} missing from {err}");
    }
}

#[test]
fn an_undeclared_head_dim_is_refused_before_the_plugin_runs() {
    let kernel = PluginKernel::new(Arc::new(open("failing", failing).unwrap())).unwrap();
    // The fake's forward always fails; a capability error proves it was never called.
    let err = small_forward(&kernel, 80).unwrap_err();
    assert!(
        err.contains("head dim 80") && err.contains("1..=64"),
        "{err}"
    );
}

#[test]
fn the_c_plugin_runs_and_its_library_outlives_the_handle_it_came_from() {
    let plugin = Arc::new(Plugin::load(dflash_plugin_c_attention::LIBRARY).unwrap());
    assert_eq!(plugin.name(), "c-attention");
    let kernel = PluginKernel::new(plugin.clone()).unwrap();
    drop(plugin);
    let out = small_forward(&kernel, 8).unwrap();
    assert!(
        out.iter().all(|x| x.is_finite()),
        "unwritten or bad output: {out:?}"
    );
    // Row 0 sees only key 0: its output is v[0] exactly (both heads share kv head 0).
    let v0: Vec<f32> = (0..8).map(|i| (i % 5) as f32 * 0.2 - 0.4).collect();
    assert_eq!(&out[..8], v0.as_slice());
}

#[test]
fn plugin_path_names_go_through_the_registry() {
    dflash_attention_loader::link();
    let name = format!("plugin:{}", dflash_plugin_c_attention::LIBRARY);
    let kernel = dflash_core::registry::create_host_attention(&name).unwrap();
    assert_eq!(kernel.name(), "c-attention");
    let err = dflash_core::registry::create_host_attention("plugin:/no/such.so")
        .err()
        .unwrap();
    assert!(err.to_string().contains("/no/such.so"), "{err}");
}

#[test]
fn registered_paths_are_kernels_under_their_own_names() {
    dflash_attention_loader::link();
    let lib = dflash_plugin_c_attention::LIBRARY;
    let names = dflash_attention_loader::register_paths(&[lib, lib]).unwrap();
    assert_eq!(names, ["c-attention", "c-attention"]);
    assert!(dflash_core::registry::attention_kernel_names().contains(&"c-attention".into()));
    let kernel = dflash_core::registry::create_host_attention("c-attention").unwrap();
    assert_eq!(kernel.name(), "c-attention");
    small_forward(kernel.as_ref(), 8).unwrap();
    // The same plugin from another file is another library claiming the name.
    let dir = std::env::temp_dir().join(format!("dflash-loader-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let copy = dir.join("libcopy.so");
    std::fs::copy(lib, &copy).unwrap();
    let err = dflash_attention_loader::register_paths(&[&copy]).unwrap_err();
    std::fs::remove_dir_all(&dir).ok();
    assert!(matches!(err, PluginError::NameTaken { .. }), "{err}");
    assert!(err.to_string().contains(lib), "{err}");
}

/// The Rust example's cdylib: cargo builds it as this test's dev-dependency, next to the test
/// binary in `deps/` (cdylib file names carry no hash).
fn rust_tiled_library() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    dflash_plugin_rust_tiled::library_beside(&exe).unwrap_or_else(|| {
        panic!(
            "the Rust example's library is not next to {}",
            exe.display()
        )
    })
}

/// `./libx.so` and `/abs/libx.so` are one library: registering it under a second spelling is
/// the no-op that registering it again is, not a clash of the plugin with itself.
#[test]
fn one_library_under_two_spellings_of_its_path_registers_once() {
    dflash_attention_loader::link();
    let lib = rust_tiled_library();
    let (dir, file) = (lib.parent().unwrap(), lib.file_name().unwrap());
    let dotted = dir.join(".").join(file);
    let up_and_back = dir.join("..").join(dir.file_name().unwrap()).join(file);
    assert_ne!(dotted.as_os_str(), lib.as_os_str());
    let names = dflash_attention_loader::register_paths(&[&lib, &dotted, &up_and_back]).unwrap();
    assert_eq!(names, ["rust-tiled", "rust-tiled", "rust-tiled"]);
    let kernel = dflash_core::registry::create_host_attention("rust-tiled").unwrap();
    small_forward(kernel.as_ref(), 8).unwrap();
}

/// A table of a later minor: the 1.0 table followed by a field this host does not know.
#[repr(C)]
struct Table1x {
    table: abi::DfAttnPlugin,
    later: u64,
}
/// Capabilities of exactly the 1.0 size, and of a later minor (one more u32 behind them).
static CAPS_1_0: abi::DfAttnCapabilities = abi::DfAttnCapabilities {
    struct_size: abi::CAPABILITIES_SIZE_V1_0,
    ..CAPS
};
#[repr(C)]
struct Caps1x {
    caps: abi::DfAttnCapabilities,
    later: u32,
}
static CAPS_1X: Caps1x = Caps1x {
    caps: abi::DfAttnCapabilities {
        struct_size: abi::size_of_u32::<Caps1x>(),
        ..CAPS
    },
    later: 7,
};

/// Succeeds only when called with the plugin's own table as `self` (not a host-side copy).
unsafe extern "C" fn forward_checking_self(
    this: *const abi::DfAttnPlugin,
    _: *const abi::DfAttnForwardArgs,
) -> i32 {
    if std::ptr::eq(this, &TABLE_1_0) {
        0
    } else {
        abi::Status::Internal.code()
    }
}
static TABLE_1_0: abi::DfAttnPlugin = abi::DfAttnPlugin {
    struct_size: abi::PLUGIN_SIZE_V1_0,
    forward: Some(forward_checking_self),
    ..table(abi::ABI_MAJOR, &CAPS_1_0)
};
static TABLE_1X: Table1x = Table1x {
    table: abi::DfAttnPlugin {
        struct_size: abi::size_of_u32::<Table1x>(),
        ..table(abi::ABI_MAJOR, &CAPS_1X.caps)
    },
    later: 9,
};
static SHORT: abi::DfAttnPlugin = abi::DfAttnPlugin {
    struct_size: abi::PLUGIN_SIZE_V1_0 - 8,
    ..table(abi::ABI_MAJOR, &CPU_CAPS)
};
unsafe extern "C" fn v1_0(_: u32, _: u32) -> *const abi::DfAttnPlugin {
    &TABLE_1_0
}
unsafe extern "C" fn v1_x(_: u32, _: u32) -> *const abi::DfAttnPlugin {
    &TABLE_1X.table
}
unsafe extern "C" fn short(_: u32, _: u32) -> *const abi::DfAttnPlugin {
    &SHORT
}

#[test]
fn tables_of_the_1_0_size_and_of_later_minors_open_and_shorter_ones_do_not() {
    let plugin = open("v1.0", v1_0).unwrap();
    assert_eq!(plugin.raw_table(), &raw const TABLE_1_0);
    let kernel = PluginKernel::new(Arc::new(plugin)).unwrap();
    // The host reads a copy of the table, but hands the plugin its own as `self`.
    small_forward(&kernel, 8).unwrap();
    let later = open("v1.x", v1_x).unwrap();
    assert_eq!(later.capabilities().mask_rules, CAPS.mask_rules);
    let err = open("short", short).unwrap_err();
    assert!(matches!(err, PluginError::Malformed { .. }), "{err}");
    assert!(err.to_string().contains("struct_size"), "{err}");
}
