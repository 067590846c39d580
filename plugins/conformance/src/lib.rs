//! Conformance of a foreign attention plugin: [`check_plugin`] runs
//! - the attention suite of the in-tree kernels (`dflash_tests`: every mask kind, GQA groups
//!   1/2/4, head dims 16 and 64, large scores; NaN-poisoned outputs, bit-identical re-runs,
//!   the dense f64 oracle at the suite's tolerance) through the loader, a case outside what
//!   the plugin declares (head dim, GQA) counting as skipped, not passed, and the bitwise
//!   reruns only required of a plugin declaring `DF_ATTN_CAP_DETERMINISTIC`;
//! - raw ABI calls ([`abi_cases`]): a valid call whose outputs are NaN-poisoned and guarded
//!   past their end (every element written, none beyond), and malformed calls (NULLs, short
//!   structs, wrong ndim/dtype/device/shape/strides, bad masks, a short workspace) that must
//!   return a non-zero status with a non-empty `last_error`.

mod abi_cases;
mod device;
mod table;

use dflash_attention_abi::CAP_DETERMINISTIC;
use dflash_attention_loader::PluginKernel;
use dflash_core::AttnDims;

pub use abi_cases::abi_cases;
pub use device::check_device_plugin;
pub use table::{Outcome, Row, Table};

/// Why a suite case is outside what the plugin declares, if it is.
fn undeclared(caps: &dflash_attention_abi::DfAttnCapabilities, dims: &AttnDims) -> Option<String> {
    if !caps.supports_head_dim(dims.head_dim as u64) {
        return Some(format!("head dim {} not declared", dims.head_dim));
    }
    if dims.q_heads != dims.kv_heads && caps.flags & dflash_attention_abi::CAP_GQA == 0 {
        return Some("GQA not declared".into());
    }
    None
}

/// One row per case of `report`: those named in `skips` as skipped (why), a failure that is
/// only a rerun's bit difference passed for a plugin that does not declare determinism.
fn rows_of(report: &dflash_tests::Report, skips: &[(String, String)], flags: u32) -> Vec<Row> {
    let deterministic = flags & CAP_DETERMINISTIC != 0;
    // The suite requires bit-identical reruns of every kernel; a plugin that does not declare
    // determinism is held to everything else.
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
            Row {
                name: c.name.clone(),
                worst: measured.then(|| c.worst()),
                max_err: measured.then(|| c.max_err()),
                outcome,
            }
        })
        .collect()
}

/// The whole conformance run on `kernel`; `Err` only when the suite's cases cannot be built.
pub fn check_plugin(kernel: &PluginKernel) -> Result<Table, String> {
    let skips: Vec<(String, String)> = dflash_tests::suite_cases()?
        .iter()
        .filter_map(|c| {
            undeclared(kernel.plugin().capabilities(), &c.dims).map(|why| (c.name.clone(), why))
        })
        .collect();
    let report = dflash_tests::check_host_attention_kernel(kernel)?;
    let mut rows = rows_of(&report, &skips, kernel.plugin().capabilities().flags);
    rows.extend(abi_cases(kernel));
    Ok(Table {
        plugin: kernel.plugin().label().to_string(),
        tolerance: report.tolerance.to_string(),
        rows,
    })
}
