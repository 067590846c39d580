//! A device attention kernel against its CPU twin: the same inputs through the backend's
//! attention ops and through a host kernel that copies the device kernel's roundings (such as
//! [`crate::f16_products::F16ProductsForward`]) behind the reference backend, forward and
//! backward (each on its own `out` and `lse`, as in training), compared element-wise. Where
//! the oracle comparison must allow for the roundings themselves (rel-L2 2e-2 for f16
//! products on f32 inputs), this one allows only for summation order, so a kernel that rounds
//! at another point, rescales at another time or drops a term fails it.

use std::panic::{AssertUnwindSafe, catch_unwind};

use dflash_backend_reference::ReferenceBackend;
use dflash_core::registry::BackendOptions;
use dflash_core::{Backend, HostAttentionKernel};

use crate::backend::{Outputs, run_on_backend};
use crate::cases::Case;
use crate::report::{CaseResult, Report};
use crate::run::{CaseInputs, compare};
use crate::tolerance::{AtolUnit, Tolerance};

/// Element-wise bounds of a device kernel against its twin.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TwinBounds {
    pub out: Tolerance,
    pub lse: Tolerance,
    /// `dq`, `dk`, `dv`.
    pub grads: Tolerance,
}

const F16_TWIN_WHY: &str = "the same f16 roundings, f32 sums in the device's order against \
     f64 (a score a few f32 ulps apart may round its probability to the neighbouring f16)";

/// The tensor-core forward with f16 products against [`crate::f16_products`]' twin, and the
/// device's f32 backward against the reference backward on the twin's outputs. Both sides
/// round q, k, v and P at the same points, so what differs is f32 summation: ~1e-6 relative
/// (the f32 device bounds, `Tolerance::DEVICE_F32_ATTN_*`), plus a probability now and then
/// rounded to the neighbouring f16 (2^-11 of one key's weight) where its score landed a few
/// ulps from a rounding boundary. Bounds: out 1e-4 of the tensor's max plus 1e-3 relative
/// (5x the f32 device bound, and 1e-4 > 2^-11 times a minor key's weight), lse the f32 device
/// bound, gradients 2x the f32 device bound plus what out's difference carries into them.
pub const F16_PRODUCTS_TWIN: TwinBounds = TwinBounds {
    out: Tolerance {
        atol: 1e-4,
        rtol: 1e-3,
        atol_unit: AtolUnit::MaxWant,
        why: F16_TWIN_WHY,
    },
    lse: Tolerance {
        atol: 1e-6,
        rtol: 1e-5,
        atol_unit: AtolUnit::MaxWant,
        why: F16_TWIN_WHY,
    },
    grads: Tolerance {
        atol: 2e-4,
        rtol: 2e-3,
        atol_unit: AtolUnit::MaxWant,
        why: F16_TWIN_WHY,
    },
};

/// Runs `cases` (finite inputs: the twin does not copy how a device tile spreads a NaN) on
/// `backend` and on `twin` behind the reference backend, and compares the five results under
/// `bounds`. Failures land in the report (assert with [`Report::ensure_passed`]).
pub fn check_backend_against_twin(
    backend: &dyn Backend,
    label: &str,
    twin: Box<dyn HostAttentionKernel>,
    cases: &[Case],
    bounds: &TwinBounds,
) -> Report {
    let twin_name = twin.name().to_string();
    let twin = ReferenceBackend::with_attention_kernel(&BackendOptions::default(), twin)
        .expect("the reference backend around the twin");
    let results = cases
        .iter()
        .map(|c| {
            catch_unwind(AssertUnwindSafe(|| twin_case(backend, &twin, c, bounds))).unwrap_or_else(
                |_| {
                    let mut r = CaseResult::new(c.name.clone());
                    r.fail("panicked".into());
                    r
                },
            )
        })
        .collect();
    Report {
        kernel: format!("{label} against {twin_name}"),
        tolerance: bounds.out,
        cases: results,
    }
}

fn twin_case(be: &dyn Backend, twin: &dyn Backend, case: &Case, b: &TwinBounds) -> CaseResult {
    let mut res = CaseResult::new(case.name.clone());
    let x = CaseInputs::draw(case);
    let run = |on: &dyn Backend, who: &str| -> Result<Outputs, String> {
        run_on_backend(on, case, &x).map_err(|e| format!("{who} returned Err on valid input: {e}"))
    };
    let (got, want) = match (run(be, "the kernel"), run(twin, "the twin")) {
        (Ok(g), Ok(w)) => (g, w),
        (Err(e), _) | (_, Err(e)) => {
            res.fail(e);
            return res;
        }
    };
    let dims = case.dims;
    let (hq, hkv, d) = (dims.q_heads, dims.kv_heads, dims.head_dim);
    let mut failures = Vec::new();
    for (what, got, want, inner, tol, slot) in [
        ("out", &got.out, &want.out, (hq, d), b.out, &mut res.out),
        ("lse", &got.lse, &want.lse, (hq, 1), b.lse, &mut res.lse),
        ("dq", &got.dq, &want.dq, (hq, d), b.grads, &mut res.dq),
        ("dk", &got.dk, &want.dk, (hkv, d), b.grads, &mut res.dk),
        ("dv", &got.dv, &want.dv, (hkv, d), b.grads, &mut res.dv),
    ] {
        let want: Vec<f64> = want.iter().map(|&w| w as f64).collect();
        let (e, failure) = compare(what, got, &want, inner, &tol);
        *slot = e;
        failures.extend(failure);
    }
    for f in failures {
        res.fail(f);
    }
    res
}
