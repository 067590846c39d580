//! Conformance of a CUDA plugin: the CUDA backend is built with the plugin as its attention
//! kernel (`plugin:PATH`), so the plugin gets what training gives it — device addresses, the
//! backend's stream, a device workspace — and the device attention suite of the in-tree CUDA
//! kernels (`dflash_tests::check_backend_attention`: every suite mask on the host suite's
//! layouts plus head dim 128, the large-score cases, NaN-poisoned outputs, the dense f64
//! oracle at the f32 device tolerance) and the NaN cases run through the backend's ops. A
//! plugin without a backward has its forward checked alone ([`device_runs::forward_rows`]); one
//! declaring determinism has every case run twice more, bit for bit. Cases outside the declared
//! capabilities are skipped. The raw ABI cases of host plugins (malformed calls on host
//! buffers) do not apply.

use std::path::Path;

use dflash_attention_abi::{CAP_DETERMINISTIC, kDLCUDA};
use dflash_attention_loader::Plugin;
use dflash_backend_cuda::{CudaBackend, CudaOptions, DType, GemmPrecision};
use dflash_core::Error;
use dflash_core::registry::BackendOptions;
use dflash_tests::{F32_KERNEL, HOST_LAYOUTS, Layout, Tolerance, cases_on, large_score_cases};

use crate::{
    Outcome, Row, Table, backward_skipped, device_runs, has_backward, rows_of, skips_of, undeclared,
};

/// The device suite's layouts: the host suite's (head dims 16 and 64, GQA 1/2/4) and one at
/// head dim 128, where one-warp-per-row kernels first need several registers per lane.
fn layouts() -> Vec<Layout> {
    let mut l = HOST_LAYOUTS.to_vec();
    l.push(Layout::new(4, 2, 128));
    l
}

/// The whole device conformance run on the CUDA plugin at `path`; `Err` when it cannot run
/// (the library does not load, does not declare CUDA, or this machine has no CUDA device).
pub fn check_device_plugin(path: &Path) -> Result<Table, String> {
    dflash_attention_loader::link();
    let plugin = Plugin::load(path).map_err(|e| e.to_string())?;
    let caps = *plugin.capabilities();
    if caps.device_type != kDLCUDA {
        return Err(format!(
            "{} declares device type {}, not kDLCUDA: run the host conformance on it",
            plugin.label(),
            caps.device_type
        ));
    }
    let opts = BackendOptions {
        attention: format!("plugin:{}", path.display()),
        threads: 0,
        device: 0,
    };
    // Exact f32 everywhere and poisoned outputs: the plugin's own error is all that is measured.
    let copts = CudaOptions {
        gemm: GemmPrecision::Fp32,
        activations: DType::F32,
        poison: true,
        attn_forward_ctas: None,
    };
    let backend = match CudaBackend::with_options(&opts, copts) {
        Ok(b) => b,
        Err(Error::Unavailable { reason, .. }) => {
            return Err(format!(
                "{} is a CUDA plugin and this machine has no usable CUDA device: {reason}",
                plugin.label()
            ));
        }
        Err(e) => {
            return Err(format!(
                "the CUDA backend did not start with the plugin: {e}"
            ));
        }
    };
    let masks = dflash_tests::suite_masks()?;
    let mut cases = cases_on(&masks, &layouts());
    cases.extend(large_score_cases(Layout::new(4, 2, 16))?);
    let skips = skips_of(&plugin, &cases);
    let label = plugin.label().to_string();
    let backward = has_backward(&plugin);
    let (mut rows, tolerance) = if backward {
        let report = dflash_tests::check_backend_attention(&backend, &label, &cases, &F32_KERNEL);
        let rows = rows_of(&report, &skips, caps.flags, false);
        (rows, report.tolerance.to_string())
    } else {
        let tol = [
            Tolerance::DEVICE_F32_ATTN_OUT,
            Tolerance::DEVICE_F32_ATTN_LSE,
        ];
        let rows =
            device_runs::forward_rows(&cases, &skips, tol, device_runs::on_backend(&backend));
        (rows, tol[0].to_string())
    };
    if caps.flags & CAP_DETERMINISTIC != 0 {
        let run = device_runs::on_backend(&backend);
        let differ = device_runs::nondeterministic(&cases, &skips, backward, run);
        device_runs::fail_nondeterministic(&mut rows, &differ);
    }
    if !backward {
        rows.push(backward_skipped());
    }
    // NaN propagation (forward, then backward) on the first layout whose cases are declared.
    let mut nan_layout = None;
    for layout in layouts() {
        let nan = dflash_tests::nan_input_cases_on(layout)?;
        if nan.iter().all(|nc| undeclared(&plugin, &nc.case).is_none()) {
            nan_layout = Some(nan);
            break;
        }
    }
    match nan_layout {
        Some(nan) if backward => {
            // NaN in k, v, q and d_out at tile granularity (`NanCase::within_tiles`: what a
            // kernel whose products with P and dS are MMAs over whole tiles can keep, as the
            // CUDA backend's).
            let nan: Vec<_> = nan
                .into_iter()
                .map(dflash_tests::NanCase::within_tiles)
                .collect();
            let nan_report = dflash_tests::check_backend_attention_nan(&backend, &label, &nan);
            rows.extend(rows_of(&nan_report, &[], caps.flags, false));
        }
        _ => rows.push(Row {
            name: "nan".into(),
            worst: None,
            max_err: None,
            outcome: Outcome::Skipped(if backward {
                "no layout of the NaN cases is declared".into()
            } else {
                "the NaN cases run the backward too".into()
            }),
        }),
    }
    Ok(Table {
        plugin: label,
        tolerance,
        rows,
    })
}
