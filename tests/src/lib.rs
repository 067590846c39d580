//! Conformance suites of dflash-rs.
//!
//! [`check_host_attention_kernel`] runs one shared set of attention cases against any
//! [`HostAttentionKernel`] (in-tree or, later, foreign through the C ABI) and compares the
//! forward `out`/`lse` and the backward `dq`/`dk`/`dv` with the dense f64 [`oracle`].
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
//!   return `Err`, never panic.
//!
//! Tolerance: kernels store f32 and the oracle computes in f64 from the same f32 inputs, so the
//! only error is the kernel's own f32 rounding: with f32 products and f64 (or careful f32)
//! accumulation that is ~1e-6 relative at these sizes. An element passes when
//! `|got - want| <= atol + rtol * |want|` with `atol = rtol = 1e-4`: two orders of magnitude of
//! headroom for summation-order differences and f32 `exp`, while any real bug (a wrong mask
//! element, a missed rescale, an off-by-one tile) moves values by 1e-2 or more. `lse = -inf`
//! (rows with no visible key) must be exactly `-inf`, and non-finite values anywhere else fail.

pub mod oracle;

mod cases;
mod report;
mod run;

use dflash_core::HostAttentionKernel;
use run::{bad_input_cases, run_case};

pub use cases::{Case, suite_cases, suite_masks};
pub use report::{CaseResult, Report, TOLERANCE, TensorErr, Tolerance};

/// Runs the whole suite on `kernel`. Returns `Ok(report)` whenever the suite itself could run,
/// with one [`CaseResult`] per case (check [`Report::passed`] / [`Report::ensure_passed`]);
/// `Err` only if the suite could not build its cases.
pub fn check_host_attention_kernel(kernel: &dyn HostAttentionKernel) -> Result<Report, String> {
    let tol = TOLERANCE;
    let mut cases: Vec<CaseResult> = suite_cases()?
        .iter()
        .map(|c| run_case(kernel, c, tol))
        .collect();
    cases.extend(bad_input_cases(kernel)?);
    Ok(Report {
        kernel: kernel.name().to_string(),
        tolerance: tol,
        cases,
    })
}
