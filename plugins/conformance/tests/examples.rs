//! The in-tree example plugins through the whole conformance run, loaded as shared libraries
//! the way a user's plugin is; and a broken plugin, to show the run catches one.

use std::path::PathBuf;
use std::sync::Arc;

use dflash_attention_abi as abi;
use dflash_attention_loader::{Plugin, PluginKernel};
use dflash_plugin_conformance::{Outcome, Table, check_plugin};

fn run(kernel: &PluginKernel) -> Table {
    let table = check_plugin(kernel).expect("the suite's cases build");
    println!("{table}");
    table
}

fn assert_conforms(table: &Table) {
    let failed: Vec<String> = table
        .failed()
        .iter()
        .map(|r| format!("{}: {:?}", r.name, r.outcome))
        .collect();
    assert!(
        table.passed(),
        "{} failed:\n{}",
        table.plugin,
        failed.join("\n")
    );
    // Both examples declare every head dim and GQA: nothing may be skipped, and the raw-ABI
    // cases of both passes ran.
    assert_eq!(table.count(|o| matches!(o, Outcome::Skipped(_))), 0);
    for want in ["abi/forward/valid_guarded", "abi/backward/strided_q"] {
        assert!(table.rows.iter().any(|r| r.name == want), "no case {want}");
    }
}

#[test]
fn the_c_plugin_conforms() {
    let kernel = PluginKernel::load(dflash_plugin_c_attention::LIBRARY).expect("load");
    assert_eq!(kernel.plugin().name(), "c-attention");
    assert_conforms(&run(&kernel));
}

/// `backend.attention = "plugin:PATH"`: the reference backend's own attention ops (upload,
/// forward, backward on its own out/lse, download) on the C plugin, at the f32 device bounds.
#[test]
fn the_reference_backend_runs_the_c_plugin_through_its_ops() {
    let name = format!("plugin:{}", dflash_plugin_c_attention::LIBRARY);
    let backend = dflash_tests::reference_with(&name);
    assert_eq!(backend.attention_kernel(), name);
    let cases = dflash_tests::suite_cases().expect("suite cases");
    let report = dflash_tests::check_backend_attention(
        backend.as_ref(),
        "reference backend, c-attention plugin",
        &cases,
        &dflash_tests::F32_KERNEL,
    );
    println!("{report}");
    report.ensure_passed().unwrap();
}

/// Where cargo put the Rust example's cdylib: it builds it as this test's dependency, next to
/// the test binary in `deps/` (cdylib file names carry no hash).
fn rust_tiled_library() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    dflash_plugin_rust_tiled::library_beside(&exe).unwrap_or_else(|| {
        panic!(
            "the Rust example's library is not next to {}",
            exe.display()
        )
    })
}

#[test]
fn the_rust_plugin_conforms_as_a_shared_library() {
    let kernel = PluginKernel::load(rust_tiled_library()).expect("load");
    assert_eq!(kernel.plugin().name(), "rust-tiled");
    assert_conforms(&run(&kernel));
}

unsafe extern "C" fn accepts_anything_fwd(
    _: *const abi::DfAttnPlugin,
    _: *const abi::DfAttnForwardArgs,
) -> i32 {
    0
}
unsafe extern "C" fn no_workspace(
    _: *const abi::DfAttnPlugin,
    _: *const abi::DfAttnShape,
    _: i32,
    bytes: *mut u64,
) -> i32 {
    unsafe { *bytes = 0 };
    0
}
unsafe extern "C" fn empty_error(_: *const abi::DfAttnPlugin) -> *const std::ffi::c_char {
    c"".as_ptr()
}
static LAZY_CAPS: abi::DfAttnCapabilities = abi::DfAttnCapabilities {
    struct_size: abi::size_of_u32::<abi::DfAttnCapabilities>(),
    device_type: abi::kDLCPU,
    dtypes: abi::DTYPE_F32,
    head_dim_min: 16,
    head_dim_max: 16,
    head_dim_multiple: 16,
    flags: abi::CAP_GQA,
    mask_rules: abi::MASK_TWO_INTERVALS | abi::MASK_EMPTY_ROWS,
};
/// Returns success for every forward without writing anything; has no backward.
static LAZY: abi::DfAttnPlugin = abi::DfAttnPlugin {
    struct_size: abi::size_of_u32::<abi::DfAttnPlugin>(),
    abi_major: abi::ABI_MAJOR,
    abi_minor: abi::ABI_MINOR,
    reserved: 0,
    name: c"lazy".as_ptr(),
    version: c"0".as_ptr(),
    capabilities: &LAZY_CAPS,
    workspace_bytes: Some(no_workspace),
    forward: Some(accepts_anything_fwd),
    backward: None,
    last_error: Some(empty_error),
};
unsafe extern "C" fn lazy(_: u32, _: u32) -> *const abi::DfAttnPlugin {
    &LAZY
}

#[test]
fn a_plugin_that_writes_nothing_and_accepts_anything_fails() {
    let plugin = unsafe { Plugin::from_entry("lazy", lazy) }.expect("a well-formed table");
    let table = run(&PluginKernel::new(Arc::new(plugin)).expect("cpu f32"));
    assert!(!table.passed());
    let outcome = |name: &str| {
        table
            .rows
            .iter()
            .find(|r| r.name == name)
            .unwrap_or_else(|| panic!("no case {name}"))
            .outcome
            .clone()
    };
    // Unwritten outputs are caught by the poisoning, accepted garbage by the raw calls, and
    // the d64 cases (head dim 16 only) are skipped rather than failed.
    assert!(
        matches!(outcome("abi/forward/valid_guarded"), Outcome::Failed(m) if m.contains("unwritten"))
    );
    assert!(matches!(outcome("abi/forward/null_q"), Outcome::Failed(m) if m.contains("accepted")));
    assert!(matches!(outcome("causal/gqa2/d16"), Outcome::Failed(_)));
    assert!(matches!(outcome("causal/gqa2/d64"), Outcome::Skipped(_)));
    assert!(
        !table
            .rows
            .iter()
            .any(|r| r.name.starts_with("abi/backward"))
    );
}
