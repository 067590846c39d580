//! Conformance of a foreign attention plugin: [`check_plugin`] runs
//! - the attention suite of the in-tree kernels (`dflash_tests`: every mask kind, GQA groups
//!   1/2/4, head dims 16 and 64, plus head dim 128 and the plugin's own head dim at GQA 1/2,
//!   large scores; NaN-poisoned outputs, inputs that must come back
//!   unchanged, every run (first and rerun) against the dense f64 oracle at the suite's
//!   tolerance) through the loader. A case outside what the plugin declares (head dim, GQA,
//!   mask rules) counts as skipped, not passed; without `DF_ATTN_CAP_BACKWARD` the backward is
//!   skipped (one row says so) and each case checks the forward; bitwise-identical reruns are
//!   only required of a plugin declaring `DF_ATTN_CAP_DETERMINISTIC`;
//! - raw ABI calls ([`abi_cases`]): a valid call whose outputs are NaN-poisoned and guarded
//!   past their end (every element written, none beyond, no input changed), and malformed
//!   calls (NULLs, short structs, wrong ndim/dtype/device/shape/strides, bad masks, a short
//!   workspace) that must return a non-zero status with a non-empty `last_error`.

mod abi_cases;
mod device;
mod device_runs;
mod forward_only;
mod table;

use dflash_attention_abi::{CAP_BACKWARD, CAP_DETERMINISTIC};
use dflash_attention_loader::{Plugin, PluginKernel};
use dflash_core::HostAttentionKernel;
use dflash_tests::{Case, HOST_LAYOUTS, Layout};

pub use abi_cases::abi_cases;
pub use device::check_device_plugin;
pub use table::{Outcome, Row, Table};

/// Why a suite case is outside what the plugin declares for a forward, if it is (the loader's
/// own check, so a skip here is exactly a call the host would refuse).
fn undeclared(plugin: &Plugin, case: &Case) -> Option<String> {
    plugin
        .missing_capability(false, &case.dims, &case.mask)
        .map(|need| format!("needs {need}"))
}

/// The cases of `cases` outside what `plugin` declares: (name, why).
fn skips_of(plugin: &Plugin, cases: &[Case]) -> Vec<(String, String)> {
    cases
        .iter()
        .filter_map(|c| undeclared(plugin, c).map(|why| (c.name.clone(), why)))
        .collect()
}

/// Whether the plugin has a backward to check.
fn has_backward(plugin: &Plugin) -> bool {
    plugin.capabilities().flags & CAP_BACKWARD != 0
}

/// The row standing for every case's backward of a plugin without one.
fn backward_skipped() -> Row {
    Row {
        name: "backward".into(),
        worst: None,
        max_err: None,
        outcome: Outcome::Skipped(
            "DF_ATTN_CAP_BACKWARD not declared: every case checked the forward only".into(),
        ),
    }
}

/// One row per case of `report`: those named in `skips` as skipped (why), a failure that is
/// only a rerun's bit difference passed for a plugin that does not declare determinism. With
/// `forward_only`, the errors shown are the forward's (`out`, `lse`).
fn rows_of(
    report: &dflash_tests::Report,
    skips: &[(String, String)],
    flags: u32,
    forward_only: bool,
) -> Vec<Row> {
    let deterministic = flags & CAP_DETERMINISTIC != 0;
    // The suite requires bit-identical reruns of every kernel; a plugin that does not declare
    // determinism is held to everything else (each rerun is compared with the oracle too).
    let only_nondeterminism = |f: &str| {
        f.split("; ")
            .all(|part| part.contains("is not deterministic"))
    };
    report
        .cases
        .iter()
        .map(|c| {
            let skip = skips.iter().find(|(n, _)| *n == c.name);
            let outcome = match (skip, &c.failure) {
                (Some((_, why)), _) => Outcome::Skipped(why.clone()),
                (None, None) => Outcome::Passed,
                (None, Some(f)) if !deterministic && only_nondeterminism(f) => Outcome::Passed,
                (None, Some(f)) => Outcome::Failed(f.clone()),
            };
            let measured = c.numeric && !matches!(outcome, Outcome::Skipped(_));
            let (worst, max_err) = if forward_only {
                (
                    c.out.worst.max(c.lse.worst),
                    c.out.max_abs.max(c.lse.max_abs),
                )
            } else {
                (c.worst(), c.max_err())
            };
            Row {
                name: c.name.clone(),
                worst: measured.then_some(worst),
                max_err: measured.then_some(max_err),
                outcome,
            }
        })
        .collect()
}

/// The layouts run beyond the host suite's (head dims 16 and 64): head dim 128, as the device
/// suite adds, and the head dim the raw ABI cases pick, so a plugin declaring only head dims
/// the host suite never reaches is still compared with the oracle. GQA 1 and 2 each, so a
/// plugin without `DF_ATTN_CAP_GQA` is compared too.
fn extra_layouts(plugin: &Plugin) -> Vec<Layout> {
    let mut dims = vec![128usize];
    if let Some(d) = abi_cases::head_dim(plugin.capabilities()) {
        dims.push(d as usize);
    }
    dims.sort_unstable();
    dims.dedup();
    dims.retain(|&d| !HOST_LAYOUTS.iter().any(|l| l.head_dim == d));
    dims.iter()
        .flat_map(|&d| [Layout::new(2, 2, d), Layout::new(4, 2, d)])
        .collect()
}

/// The whole conformance run on `kernel`; `Err` only when the suite's cases cannot be built.
pub fn check_plugin(kernel: &PluginKernel) -> Result<Table, String> {
    let plugin = kernel.plugin();
    let extra = extra_layouts(plugin);
    // The suite's cases, the extra layouts' and its NaN cases (which it runs on this layout).
    let mut cases = dflash_tests::suite_cases()?;
    cases.extend(dflash_tests::cases_on(
        &dflash_tests::suite_masks()?,
        &extra,
    ));
    let nan = dflash_tests::nan_input_cases_on(dflash_tests::Layout::new(4, 2, 16))?;
    cases.extend(nan.into_iter().map(|nc| nc.case));
    let skips = skips_of(plugin, &cases);
    let backward = has_backward(plugin);
    // Without a backward of its own, the plugin's forward is paired with the reference
    // backward, so every case still runs whole and what it measures is the plugin's forward.
    let forward_only = forward_only::ForwardOnly(kernel);
    let checked: &dyn HostAttentionKernel = if backward { kernel } else { &forward_only };
    let report = dflash_tests::check_host_attention_kernel_on(checked, &extra)?;
    let caps = plugin.capabilities();
    let mut rows = rows_of(&report, &skips, caps.flags, !backward);
    if !backward {
        rows.push(backward_skipped());
    }
    rows.extend(abi_cases(kernel));
    Ok(Table {
        plugin: plugin.label().to_string(),
        tolerance: report.tolerance.to_string(),
        rows,
    })
}
