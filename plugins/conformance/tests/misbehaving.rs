//! The Rust example behind tables that change one thing: a forward wrong only on reruns, one
//! that scales its input q in place, and correct plugins declaring less than the suite covers
//! (no backward; no rows that see nothing). The conformance run must fail the first two and
//! pass the others with what they do not declare skipped.
//!
//! Determinism is checked exactly when declared: a slightly non-deterministic forward (the
//! last bit of `out[0]` flipped on every other call, far inside the tolerance) passes without
//! `DF_ATTN_CAP_DETERMINISTIC` and fails with it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use dflash_attention_abi as abi;
use dflash_attention_loader::{Plugin, PluginKernel};
use dflash_plugin_conformance::{Outcome, Table, check_plugin};
use dflash_plugin_rust_tiled::{CAPABILITIES, dflash_attention_plugin as inner_entry};

/// What a table's forward does besides the example's own.
const RIGHT: u8 = 0;
/// Adds 1 to `out[0]` on every other call: each case's rerun.
const WRONG_RERUNS: u8 = 1;
/// Doubles `q` in place after computing.
const SCALES_Q: u8 = 2;
/// Flips the last bit of `out[0]` on every other call.
const JITTERS: u8 = 3;
/// Overwrites every output with zeros (forward and backward).
const ZEROS: u8 = 4;
/// Refuses a q that is not 3-d without setting a message.
const SILENT_Q_NDIM: u8 = 5;

static RERUN_CALLS: AtomicU32 = AtomicU32::new(0);
static JITTER_CALLS: AtomicU32 = AtomicU32::new(0);

fn inner() -> &'static abi::DfAttnPlugin {
    unsafe { &*inner_entry(abi::ABI_MAJOR, abi::ABI_MINOR) }
}

/// The `f32` elements of a compact tensor.
unsafe fn elements<'a>(t: *const abi::DLTensor) -> &'a mut [f32] {
    unsafe {
        let t = &*t;
        let n = (0..t.ndim as usize)
            .map(|i| *t.shape.add(i) as usize)
            .product();
        let data = t
            .data
            .cast::<u8>()
            .add(t.byte_offset as usize)
            .cast::<f32>();
        std::slice::from_raw_parts_mut(data, n)
    }
}

unsafe extern "C" fn forward<const MODE: u8>(
    _: *const abi::DfAttnPlugin,
    a: *const abi::DfAttnForwardArgs,
) -> i32 {
    let t = inner();
    if MODE == SILENT_Q_NDIM && unsafe { !a.is_null() && !(*a).q.is_null() && (*(*a).q).ndim != 3 }
    {
        return 1;
    }
    let status = unsafe { (t.forward.unwrap())(t, a) };
    if status != 0 {
        return status;
    }
    match MODE {
        WRONG_RERUNS if RERUN_CALLS.fetch_add(1, Ordering::Relaxed) % 2 == 1 => unsafe {
            elements((*a).out)[0] += 1.0
        },
        SCALES_Q => unsafe { elements((*a).q).iter_mut().for_each(|x| *x *= 2.0) },
        JITTERS if JITTER_CALLS.fetch_add(1, Ordering::Relaxed) % 2 == 1 => unsafe {
            let x = &mut elements((*a).out)[0];
            *x = f32::from_bits(x.to_bits() ^ 1)
        },
        ZEROS => unsafe {
            elements((*a).out).fill(0.0);
            elements((*a).lse).fill(0.0);
        },
        _ => {}
    }
    status
}
unsafe extern "C" fn backward<const MODE: u8>(
    _: *const abi::DfAttnPlugin,
    a: *const abi::DfAttnBackwardArgs,
) -> i32 {
    let t = inner();
    let status = unsafe { (t.backward.unwrap())(t, a) };
    if status == 0 && MODE == ZEROS {
        unsafe {
            for g in [(*a).dq, (*a).dk, (*a).dv] {
                elements(g).fill(0.0);
            }
        }
    }
    status
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

const fn table<const MODE: u8>(caps: &'static abi::DfAttnCapabilities) -> abi::DfAttnPlugin {
    abi::DfAttnPlugin {
        struct_size: abi::size_of_u32::<abi::DfAttnPlugin>(),
        abi_major: abi::ABI_MAJOR,
        abi_minor: abi::ABI_MINOR,
        reserved: 0,
        name: c"misbehaving".as_ptr(),
        version: c"0".as_ptr(),
        capabilities: caps,
        workspace_bytes: Some(workspace),
        forward: Some(forward::<MODE>),
        backward: Some(backward::<MODE>),
        last_error: Some(last_error),
    }
}

static ALL: abi::DfAttnCapabilities = CAPABILITIES;
static NOT_DETERMINISTIC: abi::DfAttnCapabilities = abi::DfAttnCapabilities {
    flags: CAPABILITIES.flags & !abi::CAP_DETERMINISTIC,
    ..CAPABILITIES
};
static DETERMINISTIC: abi::DfAttnCapabilities = abi::DfAttnCapabilities {
    flags: CAPABILITIES.flags | abi::CAP_DETERMINISTIC,
    ..CAPABILITIES
};
static NO_BACKWARD: abi::DfAttnCapabilities = abi::DfAttnCapabilities {
    flags: CAPABILITIES.flags & !abi::CAP_BACKWARD,
    ..CAPABILITIES
};
static NO_EMPTY_ROWS: abi::DfAttnCapabilities = abi::DfAttnCapabilities {
    mask_rules: abi::MASK_TWO_INTERVALS,
    ..CAPABILITIES
};

/// Only head dim 128, which the host suite's own layouts (16, 64) never reach.
static HEAD_128: abi::DfAttnCapabilities = abi::DfAttnCapabilities {
    head_dim_min: 128,
    head_dim_max: 128,
    head_dim_multiple: 1,
    ..CAPABILITIES
};

static WRONG_RERUNS_TABLE: abi::DfAttnPlugin = table::<WRONG_RERUNS>(&NOT_DETERMINISTIC);
static SCALES_Q_TABLE: abi::DfAttnPlugin = table::<SCALES_Q>(&ALL);
static FORWARD_ONLY_TABLE: abi::DfAttnPlugin = abi::DfAttnPlugin {
    backward: None,
    ..table::<RIGHT>(&NO_BACKWARD)
};
static NO_EMPTY_ROWS_TABLE: abi::DfAttnPlugin = table::<RIGHT>(&NO_EMPTY_ROWS);
static JITTERY_TABLE: abi::DfAttnPlugin = table::<JITTERS>(&NOT_DETERMINISTIC);
static JITTERY_CLAIMING_TABLE: abi::DfAttnPlugin = table::<JITTERS>(&DETERMINISTIC);
static SILENT_TABLE: abi::DfAttnPlugin = table::<SILENT_Q_NDIM>(&ALL);
unsafe extern "C" fn silent(_: u32, _: u32) -> *const abi::DfAttnPlugin {
    &SILENT_TABLE
}
static ZEROS_128_TABLE: abi::DfAttnPlugin = table::<ZEROS>(&HEAD_128);
static RIGHT_128_TABLE: abi::DfAttnPlugin = table::<RIGHT>(&HEAD_128);

unsafe extern "C" fn zeros_128(_: u32, _: u32) -> *const abi::DfAttnPlugin {
    &ZEROS_128_TABLE
}
unsafe extern "C" fn right_128(_: u32, _: u32) -> *const abi::DfAttnPlugin {
    &RIGHT_128_TABLE
}
unsafe extern "C" fn wrong_reruns(_: u32, _: u32) -> *const abi::DfAttnPlugin {
    &WRONG_RERUNS_TABLE
}
unsafe extern "C" fn scales_q(_: u32, _: u32) -> *const abi::DfAttnPlugin {
    &SCALES_Q_TABLE
}
unsafe extern "C" fn forward_only(_: u32, _: u32) -> *const abi::DfAttnPlugin {
    &FORWARD_ONLY_TABLE
}
unsafe extern "C" fn no_empty_rows(_: u32, _: u32) -> *const abi::DfAttnPlugin {
    &NO_EMPTY_ROWS_TABLE
}
unsafe extern "C" fn jittery(_: u32, _: u32) -> *const abi::DfAttnPlugin {
    &JITTERY_TABLE
}
unsafe extern "C" fn jittery_claiming(_: u32, _: u32) -> *const abi::DfAttnPlugin {
    &JITTERY_CLAIMING_TABLE
}

fn run(entry: abi::EntryPointFn) -> Table {
    let plugin = unsafe { Plugin::from_entry("misbehaving", entry) }.expect("open");
    let kernel = PluginKernel::new(Arc::new(plugin)).expect("cpu f32");
    let table = check_plugin(&kernel).expect("suite");
    println!("{table}");
    table
}

fn outcome(table: &Table, name: &str) -> Outcome {
    let row = table.rows.iter().find(|r| r.name == name);
    row.unwrap_or_else(|| panic!("no case {name}"))
        .outcome
        .clone()
}

fn failed_with(table: &Table, name: &str, text: &str) -> bool {
    matches!(outcome(table, name), Outcome::Failed(m) if m.contains(text))
}

#[test]
fn a_forward_wrong_only_on_reruns_fails_even_without_declared_determinism() {
    let table = run(wrong_reruns);
    assert!(!table.passed());
    for case in ["causal/gqa2/d16", "dflash_padding/gqa1/d64"] {
        assert!(failed_with(&table, case, "out (rerun)["), "{table}");
    }
}

#[test]
fn a_forward_writing_into_its_input_q_fails_naming_it() {
    let table = run(scales_q);
    assert!(!table.passed());
    let named = "forward wrote into its input q";
    assert!(failed_with(&table, "causal/gqa2/d16", named), "{table}");
    let raw = "wrote into its input q";
    assert!(
        failed_with(&table, "abi/forward/valid_guarded", raw),
        "{table}"
    );
}

fn assert_passed(table: &Table) {
    let failed: Vec<_> = table.failed().iter().map(|r| r.name.clone()).collect();
    assert!(table.passed(), "failed: {failed:?}");
}

#[test]
fn a_correct_forward_only_plugin_passes_with_its_backward_skipped() {
    let table = run(forward_only);
    assert_passed(&table);
    assert!(matches!(outcome(&table, "backward"), Outcome::Skipped(_)));
    assert_eq!(outcome(&table, "causal/gqa2/d16"), Outcome::Passed);
    assert_eq!(
        outcome(&table, "abi/forward/valid_guarded"),
        Outcome::Passed
    );
    assert!(
        !table
            .rows
            .iter()
            .any(|r| r.name.starts_with("abi/backward"))
    );
}

#[test]
fn a_plugin_without_empty_rows_passes_with_the_padding_cases_skipped() {
    let table = run(no_empty_rows);
    assert_passed(&table);
    let why = "DF_ATTN_MASK_EMPTY_ROWS";
    for case in ["dflash_padding/gqa2/d16", "dflash_padding_nan_k10/gqa2/d16"] {
        assert!(
            matches!(outcome(&table, case), Outcome::Skipped(m) if m.contains(why)),
            "{case}: {table}"
        );
    }
    assert_eq!(outcome(&table, "causal/gqa2/d16"), Outcome::Passed);
    assert_eq!(
        outcome(&table, "abi/forward/valid_guarded"),
        Outcome::Passed
    );
    assert_eq!(
        outcome(&table, "abi/backward/valid_guarded"),
        Outcome::Passed
    );
}

#[test]
fn reruns_must_be_bit_identical_only_when_determinism_is_declared() {
    assert_passed(&run(jittery));
    let strict = run(jittery_claiming);
    assert!(!strict.passed());
    assert!(strict.rows.iter().any(|r| matches!(
        &r.outcome,
        Outcome::Failed(m) if m.contains("forward is not deterministic")
    )));
}

#[test]
fn a_plugin_writing_zeros_at_a_head_dim_outside_the_host_suite_fails() {
    // Declaring only head dim 128 used to skip every numeric case, and the malformed-call
    // rows alone passed the run.
    let table = run(zeros_128);
    assert!(!table.passed(), "{table}");
    assert!(
        matches!(outcome(&table, "causal/gqa1/d128"), Outcome::Failed(_)),
        "{table}"
    );
}

#[test]
fn a_correct_plugin_declaring_only_head_dim_128_passes_on_its_own_head_dim() {
    let table = run(right_128);
    assert_passed(&table);
    assert_eq!(outcome(&table, "causal/gqa2/d128"), Outcome::Passed);
    assert!(matches!(
        outcome(&table, "causal/gqa2/d16"),
        Outcome::Skipped(_)
    ));
}

#[test]
fn a_table_whose_only_passes_are_not_numeric_verified_nothing() {
    let row = |name: &str, worst: Option<f64>, outcome: Outcome| dflash_plugin_conformance::Row {
        name: name.into(),
        worst,
        max_err: worst,
        outcome,
    };
    let mut table = Table {
        plugin: "fake".into(),
        tolerance: "-".into(),
        rows: vec![
            row("bad_input/q_len", None, Outcome::Passed),
            row("abi/forward/null_q", None, Outcome::Passed),
            row(
                "causal/gqa2/d16",
                None,
                Outcome::Skipped("needs head dim 16".into()),
            ),
        ],
    };
    assert!(!table.passed());
    assert!(
        table.to_string().contains("nothing was verified"),
        "{table}"
    );
    table
        .rows
        .push(row("causal/gqa2/d128", Some(0.1), Outcome::Passed));
    assert!(table.passed(), "{table}");
}

#[test]
fn an_error_without_a_message_fails_even_after_other_calls_set_one() {
    // The example's last_error keeps the previous failure's message on the same thread
    // (null_args, short_struct, ... run before q_ndim).
    let table = run(silent);
    assert!(!table.passed());
    assert!(
        failed_with(&table, "abi/forward/q_ndim", "empty last_error"),
        "{table}"
    );
    assert_eq!(outcome(&table, "abi/forward/null_q"), Outcome::Passed);
}

/// The device path (a backend built with the plugin as its attention kernel, what a CUDA
/// plugin's conformance runs): a forward that writes into q fails each case naming it, read
/// back from the backend's own tensor.
#[test]
fn a_forward_writing_into_q_fails_the_backend_suite_too() {
    use dflash_core::registry::BackendOptions;
    let plugin = unsafe { Plugin::from_entry("misbehaving", scales_q) }.expect("open");
    let kernel = PluginKernel::new(Arc::new(plugin)).expect("cpu f32");
    let opts = BackendOptions {
        attention: String::new(),
        threads: 1,
        device: 0,
    };
    let backend =
        dflash_backend_reference::ReferenceBackend::with_attention_kernel(&opts, Box::new(kernel))
            .expect("backend");
    let masks = dflash_tests::suite_masks().unwrap();
    let cases = dflash_tests::cases_on(&masks[..2], &dflash_tests::HOST_LAYOUTS[..1]);
    let report = dflash_tests::check_backend_attention(
        &backend,
        "scales_q",
        &cases,
        &dflash_tests::F32_KERNEL,
    );
    assert!(!cases.is_empty());
    for case in &report.cases {
        let failure = case.failure.as_deref().unwrap_or("");
        assert!(
            failure.contains("the forward wrote into its input q"),
            "{}: {failure:?}",
            case.name
        );
    }
}
