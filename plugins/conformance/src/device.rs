//! Conformance of a CUDA plugin: the CUDA backend is built with the plugin as its attention
//! kernel (`plugin:PATH`), so the plugin gets what training gives it — device addresses, the
//! backend's stream, a device workspace — and the device attention suite of the in-tree CUDA
//! kernels (`dflash_tests::check_backend_attention`: every suite mask on the host suite's
//! layouts plus head dim 128, the large-score cases, NaN-poisoned outputs, the dense f64
//! oracle at the f32 device tolerance) and the NaN cases run through the backend's ops. The raw
//! ABI cases of host plugins (malformed calls on host buffers) do not apply.

use std::path::Path;

use dflash_attention_abi::kDLCUDA;
use dflash_attention_loader::Plugin;
use dflash_backend_cuda::{CudaBackend, CudaOptions, DType, GemmPrecision};
use dflash_core::Error;
use dflash_core::registry::BackendOptions;
use dflash_tests::{F32_KERNEL, HOST_LAYOUTS, Layout, cases_on, large_score_cases};

use crate::{Table, rows_of, undeclared};

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
    let skips: Vec<(String, String)> = cases
        .iter()
        .filter_map(|c| undeclared(&caps, &c.dims).map(|why| (c.name.clone(), why)))
        .collect();
    let label = plugin.label().to_string();
    let report = dflash_tests::check_backend_attention(&backend, &label, &cases, &F32_KERNEL);
    let mut rows = rows_of(&report, &skips, caps.flags);
    // NaN propagation on the first declared layout.
    if let Some(layout) = layouts().into_iter().find(|l| {
        let dims = dflash_core::AttnDims {
            q_rows: 1,
            kv_rows: 1,
            q_heads: l.q_heads,
            kv_heads: l.kv_heads,
            head_dim: l.head_dim,
        };
        undeclared(&caps, &dims).is_none()
    }) {
        // NaN in k, v, q and d_out at tile granularity (`NanCase::within_tiles`: what a kernel
        // whose products with P and dS are MMAs over whole tiles can keep, as the CUDA
        // backend's).
        let nan: Vec<_> = dflash_tests::nan_input_cases_on(layout)?
            .into_iter()
            .map(dflash_tests::NanCase::within_tiles)
            .collect();
        let nan_report = dflash_tests::check_backend_attention_nan(&backend, &label, &nan);
        rows.extend(rows_of(&nan_report, &[], caps.flags));
    }
    Ok(Table {
        plugin: label,
        tolerance: report.tolerance.to_string(),
        rows,
    })
}
