//! The NaN-propagation check ([`crate::NanCase`]) on any kernel: host kernels directly,
//! device kernels through a backend's attention ops. Only where NaN must and must not be is
//! checked; the values of the clean rows are the ordinary suite's business.

mod contract;
#[cfg(test)]
mod tests;

use std::panic::{AssertUnwindSafe, catch_unwind};

use dflash_core::{AttnBackward, AttnForward, Backend, HostAttentionKernel};

use crate::backend::{Outputs, run_on_backend};
use crate::cases::{NanCase, NanInput};
use crate::report::{CaseResult, Report};
use crate::run::CaseInputs;
use crate::tolerance::Tolerance;

use contract::check;

/// The case's usual inputs with element 0 of its (row, head) of its input set to NaN.
fn inputs(nc: &NanCase) -> CaseInputs {
    let mut x = CaseInputs::draw(&nc.case);
    let d = nc.case.dims;
    let (buf, heads) = match nc.input {
        NanInput::K => (&mut x.k, d.kv_heads),
        NanInput::V => (&mut x.v, d.kv_heads),
        NanInput::Q => (&mut x.q, d.q_heads),
        NanInput::DOut => (&mut x.d_out, d.q_heads),
    };
    buf[(nc.row * heads + nc.head) * d.head_dim] = f32::NAN;
    x
}

fn report(label: &str, cases: Vec<CaseResult>) -> Report {
    Report {
        kernel: label.to_string(),
        tolerance: Tolerance::EXACT.because("NaN propagation: where NaN must and must not be"),
        cases,
    }
}

/// Runs `f`, turning an `Err` or a panic into the failure message.
fn guarded(f: impl FnOnce() -> Result<Outputs, String>) -> Result<Outputs, String> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(o)) => Ok(o),
        Ok(Err(e)) => Err(format!("returned Err on a NaN input: {e}")),
        Err(_) => Err("panicked on a NaN input".into()),
    }
}

/// The result of one NaN case: the pattern check, or the failure of the run itself.
fn result_of(nc: &NanCase, got: Result<Outputs, String>) -> CaseResult {
    match got {
        Ok(got) => check(nc, &got),
        Err(why) => {
            let mut r = CaseResult::new(nc.case.name.clone());
            r.fail(why);
            r
        }
    }
}

/// Runs one host kernel's forward, then its backward on its own `out`/`lse` (as training
/// does), into zero-filled buffers, so every NaN in the result is the kernel's.
fn run_host(kernel: &dyn HostAttentionKernel, nc: &NanCase) -> Result<Outputs, String> {
    let c = &nc.case;
    let dims = c.dims;
    let (tq, tk, hq, hkv, d) = (
        dims.q_rows,
        dims.kv_rows,
        dims.q_heads,
        dims.kv_heads,
        dims.head_dim,
    );
    let CaseInputs { q, k, v, d_out } = inputs(nc);
    let mut out = vec![0f32; tq * hq * d];
    let mut lse = vec![0f32; tq * hq];
    let call = AttnForward::new(&dims, &c.mask, c.scale, [&q, &k, &v], [&mut out, &mut lse])?;
    kernel.forward(call)?;
    let (mut dq, mut dk, mut dv) = (
        vec![0f32; tq * hq * d],
        vec![0f32; tk * hkv * d],
        vec![0f32; tk * hkv * d],
    );
    let call = AttnBackward::new(
        &dims,
        &c.mask,
        c.scale,
        [&q, &k, &v, &out, &lse, &d_out],
        [&mut dq, &mut dk, &mut dv],
    )?;
    kernel.backward(call)?;
    Ok(Outputs {
        out,
        lse,
        dq,
        dk,
        dv,
    })
}

/// The NaN cases on a host kernel.
pub fn check_host_attention_nan(kernel: &dyn HostAttentionKernel, cases: &[NanCase]) -> Report {
    let results = cases
        .iter()
        .map(|nc| result_of(nc, guarded(|| run_host(kernel, nc))))
        .collect();
    report(kernel.name(), results)
}

/// The NaN cases through a backend's own attention ops (the device kernels' path): the same
/// pattern for every kernel, whatever its precision, since NaN survives any rounding.
pub fn check_backend_attention_nan(
    backend: &dyn Backend,
    label: &str,
    cases: &[NanCase],
) -> Report {
    let results = cases
        .iter()
        .map(|nc| {
            let got = guarded(|| {
                run_on_backend(backend, &nc.case, &inputs(nc)).map_err(|e| e.to_string())
            });
            result_of(nc, got)
        })
        .collect();
    report(label, results)
}
