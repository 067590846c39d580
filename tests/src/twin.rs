//! A device attention kernel against its CPU twin: the same inputs through the backend's
//! attention ops and through a host kernel that copies the device kernel's roundings (such as
//! [`crate::f16_products::F16ProductsForward`]) behind the reference backend, forward and
//! backward (each on its own `out` and `lse`, as in training), compared element by element and
//! per tensor ([`TwinBounds`]). Where the oracle comparison must allow for the roundings
//! themselves (rel-L2 2e-2 per tensor for f16 products on f32 inputs), this one allows only
//! for summation order: a kernel that rounds where the twin does not, or gets a few rows
//! wrong, fails it (`tests/tests/f16_products_twin.rs` shows both).

use dflash_backend_reference::ReferenceBackend;
use dflash_core::registry::BackendOptions;
use dflash_core::{Backend, HostAttentionKernel};

use crate::backend::{Outputs, compare_rel_l2, results_of, run_on_backend};
use crate::cases::Case;
use crate::report::{CaseResult, Report};
use crate::run::{CaseInputs, compare};
use crate::tolerance::{AtolUnit, RelL2, Tolerance};

/// Bounds of a device kernel against its twin: element-wise (a wrong row or element) and per
/// tensor (a rounding the twin does not make: one rounding is no larger than a flip to the
/// neighbouring f16, but it moves every element, so the tensor's relative L2 sees it).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TwinBounds {
    pub out: Tolerance,
    pub lse: Tolerance,
    /// `dq`, `dk`, `dv`.
    pub grads: Tolerance,
    pub out_rel_l2: RelL2,
    pub lse_rel_l2: RelL2,
    pub grads_rel_l2: RelL2,
}

const F16_TWIN_WHY: &str = "the same f16 roundings, f32 sums in the device's order against \
     f64 (a score a few f32 ulps apart may round its probability to the neighbouring f16)";

/// The tensor-core forward with f16 products against [`crate::f16_products`]' twin, and the
/// device's f32 backward against the reference backward on the twin's outputs. Both sides
/// round q, k, v and P at the same points; what differs is f32 summation: a score ~5e-7 apart
/// (128 products summed in f32 against f64, at the suite's |q|, |k| < 2), which now and then
/// (~1e-3 of the probabilities) rounds exp(s - m) to the neighbouring f16, moving that key's
/// weight by up to 2^-10 relative (one f16 ulp). One such flip moves a row's `out` by at most
/// 2^-10 (p / l)(1 - p / l) 2 max|v| <= 4.9e-4 max|v| and its `lse` by at most 2^-10 p / l;
/// the f32 backward recomputes P against that lse, so the row's gradients move by about as
/// much (relative). Element-wise: out 1e-3 of the tensor's max plus 1e-3 relative, lse 1e-3
/// of max(1, |lse|), gradients 2e-3 of the tensor's max plus 2e-3 relative (~2x a flip's
/// reach). Per tensor, set from the kernel on an H100 (2026-12-06, the 29 cases of the wgpu
/// coop test; worst rel-L2: out 1.04e-4, lse 3.5e-5, dq/dk 5.2e-4 on a large-score case) with
/// 1.4x to 1.5x to spare: out 1.6e-4, lse 5e-5, gradients 8e-4. Tensor cores sum a product's
/// terms in their own order and rounding, further from an in-order f32 sum than the CPU
/// stand-in for a device's order, the twin summing its scores in f32 in order
/// ([`crate::f16_products::ScoreSum::F32InOrder`]: worst out 2.1e-5, lse 4.0e-6, dq/dk
/// 1.7e-4, dv 3.0e-5), which passes at about a fifth of the bounds. The f32 reference kernel,
/// which rounds nothing (out 2.7e-4 to 4.0e-4, lse up to 9.4e-5), fails every case on out by
/// 1.67x or more (`tests/tests/f16_products_twin.rs` checks both).
pub const F16_PRODUCTS_TWIN: TwinBounds = TwinBounds {
    out: Tolerance {
        atol: 1e-3,
        rtol: 1e-3,
        atol_unit: AtolUnit::MaxWant,
        why: F16_TWIN_WHY,
    },
    lse: Tolerance {
        atol: 1e-3,
        rtol: 0.0,
        atol_unit: AtolUnit::WantAtLeastOne,
        why: F16_TWIN_WHY,
    },
    grads: Tolerance {
        atol: 2e-3,
        rtol: 2e-3,
        atol_unit: AtolUnit::MaxWant,
        why: F16_TWIN_WHY,
    },
    out_rel_l2: RelL2 {
        max: 1.6e-4,
        why: F16_TWIN_WHY,
    },
    lse_rel_l2: RelL2 {
        max: 5e-5,
        why: F16_TWIN_WHY,
    },
    grads_rel_l2: RelL2 {
        max: 8e-4,
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
    let results = results_of(cases, |c| twin_case(backend, &twin, c, bounds));
    Report {
        kernel: format!("{label} against {twin_name}"),
        tolerance: Tolerance::EXACT.because("the twin bounds per tensor (see each case)"),
        cases: results,
    }
}

fn twin_case(be: &dyn Backend, twin: &dyn Backend, case: &Case, b: &TwinBounds) -> CaseResult {
    let mut res = CaseResult::new(case.name.clone());
    let x = CaseInputs::draw(case);
    let run = |on: &dyn Backend, who: &str| -> Result<Outputs, String> {
        run_on_backend(on, case, &x).map_err(|e| format!("{who} {e}"))
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
    // Each tensor's element-wise and per-tensor bounds; dq, dk and dv share the gradients'.
    let (out, lse) = ((b.out, b.out_rel_l2), (b.lse, b.lse_rel_l2));
    let grads = (b.grads, b.grads_rel_l2);
    let tensors = [
        ("out", &got.out, &want.out, (hq, d), out, &mut res.out),
        ("lse", &got.lse, &want.lse, (hq, 1), lse, &mut res.lse),
        ("dq", &got.dq, &want.dq, (hq, d), grads, &mut res.dq),
        ("dk", &got.dk, &want.dk, (hkv, d), grads, &mut res.dk),
        ("dv", &got.dv, &want.dv, (hkv, d), grads, &mut res.dv),
    ];
    for (what, got, want, inner, (tol, rel_tol), slot) in tensors {
        let want: Vec<f64> = want.iter().map(|&w| w as f64).collect();
        let (mut e, failure) = compare(what, got, &want, inner, &tol);
        let (by_tensor, tensor_failure) = compare_rel_l2(what, got, &want, &rel_tol);
        e.worst = e.worst.max(by_tensor.worst);
        failures.extend(failure.into_iter().chain(tensor_failure));
        *slot = e;
    }
    for f in failures {
        res.fail(f);
    }
    res
}
