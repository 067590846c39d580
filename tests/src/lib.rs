//! Conformance suites of dflash-rs, and the [`tolerance`] every numerical test states its
//! bounds in.
//!
//! [`check_host_attention_kernel`] runs one shared set of attention cases against any
//! [`HostAttentionKernel`] (in-tree or, later, foreign through the C ABI) and compares the
//! forward `out`/`lse` and the backward `dq`/`dk`/`dv` with the dense f64 [`oracle`].
//! [`check_backend_attention`] runs the same cases through a backend's own attention ops
//! (device kernels), and [`drafter_step`] compares a whole drafter step on any backend with
//! the reference backend's. [`ops`] runs one body per op family (norms, RoPE, SwiGLU, the
//! embedding, AdamW, compute-format tensors, the host all-reduce) through every path of a
//! device backend against the reference backend.
//!
//! What every case does:
//! - inputs are fresh uniform random values from a ChaCha8 stream seeded by the case name
//!   (reproducible, different per case, never zeros): `q`, `k` in `[-2, 2)`, `v`, `d_out` in
//!   `[-1, 1)`, so softmaxes are neither flat nor one-hot;
//! - every output buffer is poisoned with NaN before the call, so a kernel that leaves any
//!   element unwritten (e.g. padding rows, keys nobody sees) fails;
//! - the backward is fed the oracle's `out`/`lse` rounded to f32, so a forward error can neither
//!   cause nor mask a backward failure;
//! - forward and backward are each run twice and must be bit-identical (training resumes
//!   exactly only if kernels are deterministic);
//! - malformed calls (wrong slice lengths, heads not divisible, mask of the wrong size) must
//!   return `Err`, never panic;
//! - a NaN input ([`nan_input_cases_on`]: in k, v, q or d_out) comes out NaN in exactly the
//!   rows and keys that read it (the NaN policy, [`NanCase`]); device kernels run the same
//!   cases through [`check_backend_attention_nan`].
//!
//! Tolerance: kernels store f32 and the oracle computes in f64 from the same f32 inputs, so the
//! only error is the kernel's own f32 rounding: with f32 products and f64 (or careful f32)
//! accumulation that is ~1e-6 relative at these sizes. An element passes when
//! `|got - want| <= atol + rtol * |want|` with `atol = rtol = 1e-4`: two orders of magnitude of
//! headroom for summation-order differences and f32 `exp`, while any real bug (a wrong mask
//! element, a missed rescale, an off-by-one tile) moves values by 1e-2 or more. `lse = -inf`
//! (rows with no visible key) must be exactly `-inf`, and non-finite values anywhere else fail.

pub mod drafter_step;
pub mod f16_products;
pub mod ops;
pub mod oracle;
pub mod step_memory;
pub mod tolerance;

mod backend;
mod cases;
mod nan;
mod report;
mod run;
mod twin;

use std::sync::Arc;

use dflash_core::registry::BackendOptions;
use dflash_core::{Backend, HostAttentionKernel};
use run::{bad_input_cases, run_case};

pub use backend::{
    AttentionChecks, BF16_KERNEL, Check, Comparison, F16_PRODUCTS_FORWARD,
    F16_PRODUCTS_FORWARD_F16_FED, F32_KERNEL, OracleInputs, check_backend_attention,
};
pub use cases::{
    Case, HOST_LAYOUTS, Layout, NanCase, NanInput, cases_on, large_masks, large_score_cases,
    nan_cases, nan_cases_on, nan_dout_cases_on, nan_input_cases_on, nan_q_cases_on, nan_v_cases_on,
    suite_cases, suite_masks,
};
pub use nan::{check_backend_attention_nan, check_host_attention_nan};
pub use report::{CaseResult, Report, TOLERANCE, TensorErr};
pub use run::{CaseInputs, checksum};
pub use tolerance::{AtolUnit, Closeness, RelL2, Tolerance, assert_close, assert_rel_l2};
pub use twin::{F16_PRODUCTS_TWIN, TwinBounds, check_backend_against_twin};

/// Runs the whole suite on `kernel`. Returns `Ok(report)` whenever the suite itself could run,
/// with one [`CaseResult`] per case (check [`Report::passed`] / [`Report::ensure_passed`]);
/// `Err` only if the suite could not build its cases.
pub fn check_host_attention_kernel(kernel: &dyn HostAttentionKernel) -> Result<Report, String> {
    check_host_attention_kernel_on(kernel, &[])
}

/// [`check_host_attention_kernel`] with every mask of [`suite_masks`] also run in each layout
/// of `extra`: a foreign kernel may declare only head dims the host suite (16 and 64) never
/// reaches, and would otherwise pass with nothing compared.
pub fn check_host_attention_kernel_on(
    kernel: &dyn HostAttentionKernel,
    extra: &[Layout],
) -> Result<Report, String> {
    let tol = TOLERANCE;
    let mut all = suite_cases()?;
    all.extend(cases_on(&suite_masks()?, extra));
    let mut cases: Vec<CaseResult> = all.iter().map(|c| run_case(kernel, c, &tol)).collect();
    cases.extend(bad_input_cases(kernel)?);
    let nan = nan_input_cases_on(Layout::new(4, 2, 16))?;
    cases.extend(check_host_attention_nan(kernel, &nan).cases);
    Ok(Report {
        kernel: kernel.name().to_string(),
        tolerance: tol,
        cases,
    })
}

/// The reference backend (the definition of correct) with attention kernel `attention`
/// (`"reference"`, or a registered plugin such as `"tiled"`), default threads.
pub fn reference_with(attention: &str) -> Arc<dyn Backend> {
    dflash_backend_reference::link();
    let opts = BackendOptions {
        attention: attention.into(),
        ..BackendOptions::default()
    };
    Arc::new(dflash_backend_reference::ReferenceBackend::new(&opts).expect("reference backend"))
}
