//! The attention suite on a backend's own attention ops (`AttentionOps`): device kernels
//! (`cuda-simple`, `cuda-flash`, later wgpu), or a host kernel behind any backend. The cases,
//! inputs and oracle are the host suite's; what differs per kernel is only how its outputs are
//! compared ([`Comparison`]), since a bf16 kernel is held to other bounds than an f32 one.
//!
//! Per case: the inputs of [`crate::Case`] are uploaded to the backend, its forward runs, its
//! backward runs on *its own* `out`/`lse` (as in training), and the five results are
//! downloaded and compared with the dense f64 oracle, once per [`Comparison`] (e.g. against
//! the oracle on the same bf16-rounded inputs and on the original f32 inputs). Output
//! poisoning is the backend's: run it with its debug poison on (CUDA: `CudaOptions::poison`),
//! so an element the kernel never writes is NaN and fails. Errors and panics fail the case.

use std::panic::{AssertUnwindSafe, catch_unwind};

use dflash_core::{AttnDims, Backend, Tensor};

use crate::cases::Case;
use crate::ops::Format;
use crate::oracle;
use crate::report::{CaseResult, Report, TensorErr};
use crate::run::{CaseInputs, compare};
use crate::tolerance::{RelL2, Tolerance, rel_l2};

/// How one output tensor is compared with the oracle.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Check {
    /// Element-wise.
    Close(Tolerance),
    /// Per tensor, relative L2 (for kernels whose per-element error is operand rounding).
    RelL2(RelL2),
}

/// The oracle's inputs: the values drawn, or those rounded to bf16 (nearest even), as a bf16
/// kernel sees them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OracleInputs {
    AsDrawn,
    Bf16Rounded,
}

/// One comparison of a kernel's outputs with the oracle.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Comparison {
    pub inputs: OracleInputs,
    pub out: Check,
    pub lse: Check,
    /// `dq`, `dk`, `dv`.
    pub grads: Check,
}

/// What a backend's attention is checked with.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionChecks {
    /// The format the case's inputs are handed to the kernel in: `F32` as drawn, or `F16`
    /// (rounded to f16 before the upload, still f32 tensors), so that a forward whose products
    /// take f16 operands and an f32 backward compute the same scores and only the kernels' own
    /// error remains. The oracle's "as drawn" inputs are these.
    pub fed: Format,
    pub comparisons: &'static [Comparison],
    /// Rows that see no key must have `out` exactly 0 (not merely within tolerance of it).
    pub empty_rows_exact_zero: bool,
}

/// An f32 kernel (f32 online softmax, f32 sums) against f64.
pub const F32_KERNEL: AttentionChecks = AttentionChecks {
    fed: Format::F32,
    comparisons: &[Comparison {
        inputs: OracleInputs::AsDrawn,
        out: Check::Close(Tolerance::DEVICE_F32_ATTN_OUT),
        lse: Check::Close(Tolerance::DEVICE_F32_ATTN_LSE),
        grads: Check::Close(Tolerance::DEVICE_F32_ATTN_GRAD),
    }],
    empty_rows_exact_zero: false,
};

/// A bf16 tensor-core kernel: q/k/v/d_out rounded to bf16 (8 significant bits, relative
/// rounding error <= 2^-8 ~ 3.9e-3), bf16 products with f32 accumulation, P and dS rounded to
/// bf16 for the second products, out/dq/dk/dv written in bf16. Two comparisons:
/// 1. against the oracle on the *same bf16-rounded inputs* (the kernel's own error, as the
///    kernel lab measured it against fp64: rel-L2 worst 2.3e-3 (out) and 2.6e-3 (dq/dk/dv),
///    lse max-abs 1.2e-5): rel-L2 1e-2 for out/dq/dk/dv (about 4x the measured worst),
///    lse |err| <= 2e-3 * max(1, |lse|) (an f32 log-sum-exp of exact bf16 products; 2e-3 is
///    the lab's bound, ~100x its measurement);
/// 2. against the oracle on the original f32 inputs (what a caller sees): input rounding
///    perturbs each score by ~scale * sum_d |q_d k_d| * 2^-9 * sqrt(2/3) (2^-9: a typical
///    rounding's size, half the bound; std ~1.6e-3 here;
///    worst case ~6e-2 at D 256 for one key), so rel-L2 2e-2 for out/dq/dk/dv and
///    lse |err| <= 2e-2 * max(1, |lse|) (rows seeing a single key carry that key's score
///    error undiluted).
///
/// Rows that see no key: out exactly 0.
pub const BF16_KERNEL: AttentionChecks = AttentionChecks {
    fed: Format::F32,
    comparisons: &[
        rounding_comparison(OracleInputs::Bf16Rounded, BF16_SAME_INPUTS_REL_L2, 2e-3),
        rounding_comparison(OracleInputs::AsDrawn, BF16_F32_INPUTS_REL_L2, 2e-2),
    ],
    empty_rows_exact_zero: true,
};

/// A forward whose two products take f16 operands (q, k, v and P rounded to f16: 11
/// significant bits, relative rounding error <= 2^-11, 8x finer than bf16's) with f32
/// accumulation, softmax and output, and an f32 backward on its out and lse: wgpu's
/// tensor-core forward (`attention_fwd_coop.wgsl`). One comparison, against the oracle on the
/// f32 inputs as drawn: the bounds of [`BF16_KERNEL`]'s second comparison (rel-L2 2e-2 for
/// out/dq/dk/dv, lse |err| <= 2e-2 * max(1, |lse|)), which the coarser bf16 rounding meets,
/// so f16's holds them with margin. Rows that see no key: out exactly 0.
///
/// Not for scores far beyond a trained model's: input rounding moves a score by about
/// `scale * sqrt(D) * |q| |k| * 2^-11`, and the backward recomputes P from the f32 products,
/// so its P departs from the forward's by that much (at the large-score cases' |q| 40, D 128:
/// ~0.03 a score, beyond 2e-2 in the near-one-hot rows' gradients). Those cases take
/// [`F16_PRODUCTS_FORWARD_F16_FED`].
pub const F16_PRODUCTS_FORWARD: AttentionChecks = AttentionChecks {
    fed: Format::F32,
    comparisons: &[rounding_comparison(
        OracleInputs::AsDrawn,
        F16_F32_INPUTS_REL_L2,
        2e-2,
    )],
    empty_rows_exact_zero: true,
};

/// [`F16_PRODUCTS_FORWARD`]'s kernel fed f16-representable inputs, so its products are exact
/// and forward and backward compute the same scores: what remains is the kernel's own error,
/// P rounded to f16 for the P V product (relative <= 2^-11 an entry, random in sign, so
/// rel-L2 ~3e-4 in out and the gradients through it) and f32 sums in another order. Bounds:
/// rel-L2 4e-3 for out/dq/dk/dv (>10x that), lse |err| <= 2e-3 * max(1, |lse|) (an f32
/// log-sum-exp; BF16_KERNEL's same-inputs bound). This is how the large-score cases check
/// the lazy rescale, whatever the input rounding does to near-one-hot rows.
pub const F16_PRODUCTS_FORWARD_F16_FED: AttentionChecks = AttentionChecks {
    fed: Format::F16,
    comparisons: &[rounding_comparison(
        OracleInputs::AsDrawn,
        F16_SAME_INPUTS_REL_L2,
        2e-3,
    )],
    empty_rows_exact_zero: true,
};

const F16_SAME_INPUTS: &str = "f16-product forward vs f64 on the same f16-representable inputs";
const F16_SAME_INPUTS_REL_L2: RelL2 = RelL2 {
    max: 4e-3,
    why: F16_SAME_INPUTS,
};
const F16_F32_INPUTS: &str = "f16-product forward (inputs rounded) vs f64 on f32 inputs";
const F16_F32_INPUTS_REL_L2: RelL2 = RelL2 {
    max: 2e-2,
    why: F16_F32_INPUTS,
};

/// A comparison for a kernel whose error is operand rounding: out and the gradients within
/// `rel` per tensor, lse within `lse_atol * max(1, |lse|)`, each for `rel.why`.
const fn rounding_comparison(inputs: OracleInputs, rel: RelL2, lse_atol: f64) -> Comparison {
    Comparison {
        inputs,
        out: Check::RelL2(rel),
        lse: Check::Close(Tolerance {
            atol: lse_atol,
            rtol: 0.0,
            atol_unit: crate::tolerance::AtolUnit::WantAtLeastOne,
            why: rel.why,
        }),
        grads: Check::RelL2(rel),
    }
}

const BF16_SAME_INPUTS: &str = "bf16 kernel vs f64 on the same bf16 inputs";
const BF16_F32_INPUTS: &str = "bf16 kernel (inputs rounded) vs f64 on f32 inputs";
const BF16_SAME_INPUTS_REL_L2: RelL2 = RelL2 {
    max: 1e-2,
    why: BF16_SAME_INPUTS,
};
const BF16_F32_INPUTS_REL_L2: RelL2 = RelL2 {
    max: 2e-2,
    why: BF16_F32_INPUTS,
};

/// Runs `cases` on `backend`'s attention ops and compares them under `checks`. Never panics
/// on a kernel's failure: every failure lands in its case of the returned report (assert with
/// [`Report::ensure_passed`]). `label` names the run in the report (e.g. the kernel's name
/// and the backend's options).
pub fn check_backend_attention(
    backend: &dyn Backend,
    label: &str,
    cases: &[Case],
    checks: &AttentionChecks,
) -> Report {
    let results = results_of(cases, |c| run_backend_case(backend, c, checks));
    // The report's tolerance line names the first comparison's `out` bound, if element-wise.
    let tolerance = match checks.comparisons.first().map(|c| c.out) {
        Some(Check::Close(t)) => t,
        _ => Tolerance::EXACT.because("per-tensor rel-L2 bounds (see each case)"),
    };
    Report {
        kernel: label.to_string(),
        tolerance,
        cases: results,
    }
}

/// `run` on each case, a panic becoming that case's failure.
pub(crate) fn results_of(cases: &[Case], run: impl Fn(&Case) -> CaseResult) -> Vec<CaseResult> {
    cases
        .iter()
        .map(|c| {
            catch_unwind(AssertUnwindSafe(|| run(c))).unwrap_or_else(|_| {
                let mut r = CaseResult::new(c.name.clone());
                r.fail("panicked".into());
                r
            })
        })
        .collect()
}

/// `got` against `want` by relative L2 under `tol`: the tensor's error (`worst` as a fraction
/// of the bound) and, past the bound, the failure naming `what`.
pub(crate) fn compare_rel_l2(
    what: &str,
    got: &[f32],
    want: &[f64],
    tol: &RelL2,
) -> (TensorErr, Option<String>) {
    match rel_l2(got, want) {
        Ok((rel, max_abs)) => (
            TensorErr {
                max_abs,
                worst: rel / tol.max,
            },
            (rel > tol.max).then(|| {
                format!(
                    "{what}: relative L2 error {rel:.3e} > {:e} ({})",
                    tol.max, tol.why
                )
            }),
        ),
        Err(e) => (
            TensorErr {
                max_abs: f64::INFINITY,
                worst: f64::INFINITY,
            },
            Some(format!("{what}{e}")),
        ),
    }
}

/// The five outputs of one run, on the host.
#[derive(Debug, Clone)]
pub(crate) struct Outputs {
    pub(crate) out: Vec<f32>,
    pub(crate) lse: Vec<f32>,
    pub(crate) dq: Vec<f32>,
    pub(crate) dk: Vec<f32>,
    pub(crate) dv: Vec<f32>,
}

/// Why a run on a backend gave no outputs to compare.
#[derive(Debug)]
pub(crate) enum RunError {
    /// An op returned an error on valid input.
    Backend(dflash_core::Error),
    /// An op changed one of its inputs: they are read-only, and a kernel writing into one
    /// (a plugin through the pointer the ABI hands it) corrupts what the host computes from
    /// it next (q and the forward's out/lse in the backward).
    WroteInput {
        call: &'static str,
        input: &'static str,
    },
}

impl std::fmt::Display for RunError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RunError::Backend(e) => write!(f, "returned Err on valid input: {e}"),
            RunError::WroteInput { call, input } => {
                write!(
                    f,
                    "{call} wrote into its input {input} (inputs are read-only)"
                )
            }
        }
    }
}

impl From<dflash_core::Error> for RunError {
    fn from(e: dflash_core::Error) -> Self {
        RunError::Backend(e)
    }
}

/// The forward and backward of `case` on `be`, each op's inputs read back after it and
/// required bit-identical to what they held before (as the backend holds them: an input
/// kept in another format is compared in that format).
pub(crate) fn run_on_backend(
    be: &dyn Backend,
    case: &Case,
    x: &CaseInputs,
) -> Result<Outputs, RunError> {
    let AttnDims {
        q_rows: tq,
        kv_rows: tk,
        q_heads: hq,
        kv_heads: hkv,
        head_dim: d,
    } = case.dims;
    let (qs, ks) = ([tq, hq, d], [tk, hkv, d]);
    let q = be.upload(&x.q, &qs)?;
    let k = be.upload(&x.k, &ks)?;
    let v = be.upload(&x.v, &ks)?;
    let d_out = be.upload(&x.d_out, &qs)?;
    let down = |t: &Tensor| be.download(t);
    let bits = |xs: Vec<f32>| xs.into_iter().map(f32::to_bits).collect::<Vec<_>>();
    let held = |ts: &[(&'static str, &Tensor)]| -> dflash_core::Result<Vec<_>> {
        ts.iter()
            .map(|&(name, t)| Ok((name, bits(down(t)?))))
            .collect()
    };
    let unchanged = |call: &'static str, before: &[(&'static str, Vec<u32>)], ts: &[&Tensor]| {
        for ((input, was), t) in before.iter().zip(ts) {
            if bits(down(t)?) != *was {
                return Err(RunError::WroteInput { call, input });
            }
        }
        Ok(())
    };
    let fwd_inputs = held(&[("q", &q), ("k", &k), ("v", &v)])?;
    let (out, lse) = be.attention(&q, &k, &v, &case.mask, case.scale)?;
    unchanged("the forward", &fwd_inputs, &[&q, &k, &v])?;
    let (out_host, lse_host) = (down(&out)?, down(&lse)?);
    let mut bwd_inputs = fwd_inputs;
    bwd_inputs.extend(held(&[("d_out", &d_out)])?);
    bwd_inputs.push(("out", bits(out_host.clone())));
    bwd_inputs.push(("lse", bits(lse_host.clone())));
    let (dq, dk, dv) =
        be.attention_backward(&q, &k, &v, &out, &lse, &d_out, &case.mask, case.scale)?;
    unchanged(
        "the backward",
        &bwd_inputs,
        &[&q, &k, &v, &d_out, &out, &lse],
    )?;
    Ok(Outputs {
        out: out_host,
        lse: lse_host,
        dq: down(&dq)?,
        dk: down(&dk)?,
        dv: down(&dv)?,
    })
}

fn run_backend_case(be: &dyn Backend, case: &Case, checks: &AttentionChecks) -> CaseResult {
    let mut res = CaseResult::new(case.name.clone());
    let x = CaseInputs::draw(case).rounded_to(checks.fed);
    let got = match run_on_backend(be, case, &x) {
        Ok(g) => g,
        Err(e) => {
            res.fail(e.to_string());
            return res;
        }
    };
    let dims = case.dims;
    let (hq, hkv, d) = (dims.q_heads, dims.kv_heads, dims.head_dim);
    let mut failures = Vec::new();
    for cmp in checks.comparisons {
        let round = |xs: &[f32]| -> Vec<f32> {
            match cmp.inputs {
                OracleInputs::AsDrawn => xs.to_vec(),
                OracleInputs::Bf16Rounded => xs.iter().map(|&v| Format::Bf16.round(v)).collect(),
            }
        };
        let (q, k, v, d_out) = (round(&x.q), round(&x.k), round(&x.v), round(&x.d_out));
        let fwd = oracle::forward(&dims, &q, &k, &v, &case.mask, case.scale);
        let grads = oracle::backward(&dims, &q, &k, &v, &case.mask, case.scale, &d_out);
        let which = match cmp.inputs {
            OracleInputs::AsDrawn => "",
            OracleInputs::Bf16Rounded => " (bf16 inputs)",
        };
        for (what, got, want, inner, check, slot) in [
            ("out", &got.out, &fwd.out, (hq, d), cmp.out, &mut res.out),
            ("lse", &got.lse, &fwd.lse, (hq, 1), cmp.lse, &mut res.lse),
            ("dq", &got.dq, &grads.dq, (hq, d), cmp.grads, &mut res.dq),
            ("dk", &got.dk, &grads.dk, (hkv, d), cmp.grads, &mut res.dk),
            ("dv", &got.dv, &grads.dv, (hkv, d), cmp.grads, &mut res.dv),
        ] {
            let what = format!("{what}{which}");
            let (e, failure) = match check {
                Check::Close(tol) => compare(&what, got, want, inner, &tol),
                Check::RelL2(tol) => compare_rel_l2(&what, got, want, &tol),
            };
            // Over several comparisons a slot keeps its worst.
            if e.worst >= slot.worst {
                *slot = e;
            }
            failures.extend(failure);
        }
    }
    for f in failures {
        res.fail(f);
    }
    if checks.empty_rows_exact_zero {
        let row = hq * d;
        for (i, visible) in case.mask.to_dense_oracle().iter().enumerate() {
            let o = &got.out[i * row..(i + 1) * row];
            if !visible.iter().any(|&b| b) && o.iter().any(|&x| x != 0.0) {
                res.fail(format!("row {i} sees no key but out != 0"));
                break;
            }
        }
    }
    res
}
