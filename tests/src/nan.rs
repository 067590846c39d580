//! The NaN-propagation check ([`crate::NanCase`]) on any kernel: host kernels directly,
//! device kernels through a backend's attention ops. Only where NaN must and must not be is
//! checked; the values of the clean rows are the ordinary suite's business.

use std::panic::{AssertUnwindSafe, catch_unwind};

use dflash_core::{AttnBackward, AttnForward, Backend, HostAttentionKernel};

use crate::backend::{Outputs, run_on_backend};
use crate::cases::NanCase;
use crate::report::{CaseResult, Report};
use crate::run::CaseInputs;
use crate::tolerance::Tolerance;

fn inputs(nc: &NanCase) -> CaseInputs {
    let mut x = CaseInputs::draw(&nc.case);
    let d = nc.case.dims;
    let at = (nc.key * d.kv_heads + nc.kv_head) * d.head_dim;
    if nc.in_v {
        x.v[at] = f32::NAN;
    } else {
        x.k[at] = f32::NAN;
    }
    x
}

/// Compares `got` with the pattern [`NanCase`] states; failures land in the result.
fn check(nc: &NanCase, got: &Outputs) -> CaseResult {
    let mut res = CaseResult::new(nc.case.name.clone());
    let dims = nc.case.dims;
    let (hq, hkv, d, group) = (dims.q_heads, dims.kv_heads, dims.head_dim, dims.group());
    let dense = nc.case.mask.to_dense_oracle();
    let mut fail = |why: String| {
        if res.failure.is_none() {
            res.fail(why);
        }
    };
    for (i, visible) in dense.iter().enumerate() {
        let sees_any = visible.iter().any(|&b| b);
        for h in 0..hq {
            let at = (i * hq + h) * d;
            let (out, lse, dq) = (
                &got.out[at..at + d],
                got.lse[i * hq + h],
                &got.dq[at..at + d],
            );
            let poisoned = visible[nc.key] && h / group == nc.kv_head;
            if poisoned && nc.in_v {
                if !out[0].is_nan() || !lse.is_finite() {
                    fail(format!(
                        "row {i}, head {h} reads the NaN value {} but out = {:?}.., lse = {lse} \
                         (must be NaN at dim 0, lse finite)",
                        nc.key,
                        &out[..2]
                    ));
                }
                if !dq.iter().all(|x| x.is_nan()) {
                    fail(format!(
                        "row {i}, head {h} reads the NaN value but dq is not all NaN"
                    ));
                }
            } else if poisoned {
                if !out.iter().all(|x| x.is_nan()) || !lse.is_nan() {
                    fail(format!(
                        "row {i}, head {h} reads the NaN key {} but out = {:?}.., lse = {lse} \
                         (must be NaN)",
                        nc.key,
                        &out[..2]
                    ));
                }
                if !dq.iter().all(|x| x.is_nan()) {
                    fail(format!(
                        "row {i}, head {h} reads the NaN key but dq is not all NaN"
                    ));
                }
            } else if !sees_any {
                if out.iter().any(|&x| x != 0.0) || lse != f32::NEG_INFINITY {
                    fail(format!(
                        "row {i} sees no key but out = {:?}.., lse = {lse} (must be 0, -inf)",
                        &out[..2]
                    ));
                }
            } else if nc.in_v && nc.within_tiles {
                if !lse.is_finite() {
                    fail(format!(
                        "row {i}, head {h} never reads the NaN value but lse = {lse} (must be \
                         finite)"
                    ));
                }
            } else if !out.iter().all(|x| x.is_finite()) || !lse.is_finite() {
                fail(format!(
                    "row {i}, head {h} never reads the NaN input but out/lse is not finite"
                ));
            } else if !nc.within_tiles && !dq.iter().all(|x| x.is_finite()) {
                fail(format!(
                    "row {i}, head {h} never reads the NaN input but dq is not finite"
                ));
            }
        }
    }
    let kj = (nc.key * hkv + nc.kv_head) * d;
    for (what, g) in [("dk", &got.dk), ("dv", &got.dv)] {
        let g = &g[kj..kj + d];
        if nc.in_v && what == "dv" {
            if !g.iter().all(|x| x.is_finite()) {
                fail(format!("dv of the NaN value {} is not finite", nc.key));
            }
        } else if !g.iter().all(|x| x.is_nan()) {
            fail(format!("{what} of the NaN key {} is not all NaN", nc.key));
        }
    }
    res
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Layout, nan_v_cases_on, reference_with};

    /// One fault planted in the reference backend's outputs: the row (`Reader`, a
    /// `Bystander` that sees keys but not the NaN input, a row that sees none) and what is
    /// set there.
    #[derive(Debug, Clone, Copy)]
    enum Row {
        Reader,
        Bystander,
        Empty,
    }

    #[derive(Debug, Clone, Copy)]
    enum Fault {
        None,
        OutNan,
        OutZero,
        LseNan,
        DqNan,
    }

    /// The NaN check itself, strict and at tile granularity, for a NaN key and a NaN value:
    /// the reference backend's outputs with one fault planted at a time, and whether each
    /// contract must fail them. A bystander's dq (key or value) and out (value) may turn NaN
    /// only under `within_tiles`; a NaN in a row that sees no key, in a bystander's lse or
    /// (for a key) its out, or a hidden NaN in a row that reads it fails both.
    #[test]
    fn nan_contracts_catch_what_they_promise() {
        use Fault::*;
        use Row::*;
        // (NaN in v, row, fault, fails strict, fails within_tiles)
        let table = [
            (false, Reader, None, false, false),
            (false, Bystander, DqNan, true, false),
            (false, Bystander, OutNan, true, true),
            (false, Empty, OutNan, true, true),
            (false, Bystander, LseNan, true, true),
            (false, Reader, OutZero, true, true),
            (true, Reader, None, false, false),
            (true, Bystander, OutNan, true, false),
            (true, Bystander, DqNan, true, false),
            (true, Empty, OutNan, true, true),
            (true, Bystander, LseNan, true, true),
            (true, Reader, OutZero, true, true),
        ];
        let be = reference_with("reference");
        for in_v in [false, true] {
            let cases = match in_v {
                true => nan_v_cases_on(Layout::new(4, 2, 16)),
                false => crate::nan_cases_on(Layout::new(4, 2, 16)),
            };
            let nc = cases
                .expect("cases")
                .into_iter()
                .find(|c| c.case.name.starts_with("dflash_padding"))
                .expect("the padded DFlash case");
            let clean = run_on_backend(be.as_ref(), &nc.case, &inputs(&nc)).expect("reference run");
            let dims = nc.case.dims;
            let (hq, d) = (dims.q_heads, dims.head_dim);
            let h = nc.kv_head * dims.group();
            let dense = nc.case.mask.to_dense_oracle();
            let row_of = |r: Row| {
                let pick = |v: &Vec<bool>| match r {
                    Reader => v[nc.key],
                    Bystander => !v[nc.key] && v.iter().any(|&b| b),
                    Empty => !v.iter().any(|&b| b),
                };
                dense.iter().position(pick).expect("such a row")
            };
            for &(v, row, fault, strict_fails, tiles_fails) in &table {
                if v != in_v {
                    continue;
                }
                let i = row_of(row);
                let (at, at_lse) = ((i * hq + h) * d, i * hq + h);
                let mut got = Outputs {
                    out: clean.out.clone(),
                    lse: clean.lse.clone(),
                    dq: clean.dq.clone(),
                    dk: clean.dk.clone(),
                    dv: clean.dv.clone(),
                };
                match fault {
                    None => {}
                    OutNan => got.out[at] = f32::NAN,
                    OutZero => got.out[at] = 0.0,
                    LseNan => got.lse[at_lse] = f32::NAN,
                    DqNan => got.dq[at] = f32::NAN,
                }
                for (contract, nc, fails) in [
                    ("strict", nc.clone(), strict_fails),
                    ("within_tiles", nc.clone().within_tiles(), tiles_fails),
                ] {
                    let failure = check(&nc, &got).failure;
                    assert_eq!(
                        failure.is_some(),
                        fails,
                        "NaN in v {in_v}, {row:?} {fault:?}, {contract}: {failure:?}"
                    );
                }
            }
        }
    }
}
