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

use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};

use dflash_core::mask::BlockMask;
use dflash_core::{AttnDims, HostAttentionKernel};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Per-element tolerance: pass when `|got - want| <= atol + rtol * |want|`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tolerance {
    pub atol: f64,
    pub rtol: f64,
}

/// The suite's tolerance (see the crate docs for why 1e-4).
pub const TOLERANCE: Tolerance = Tolerance {
    atol: 1e-4,
    rtol: 1e-4,
};

/// Errors of one output tensor.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TensorErr {
    /// Largest `|got - want|` (infinite when a value is non-finite where it should not be).
    pub max_abs: f64,
    /// Largest `|got - want| / (atol + rtol * |want|)`: the tensor passes when `<= 1`.
    pub worst: f64,
}

/// One named case of the suite and its outcome.
#[derive(Debug, Clone)]
pub struct CaseResult {
    /// e.g. `"dflash_overlap/gqa2/d64"` or `"bad_input/q_len"`.
    pub name: String,
    pub out: TensorErr,
    pub lse: TensorErr,
    pub dq: TensorErr,
    pub dk: TensorErr,
    pub dv: TensorErr,
    /// Why the case failed; `None` when it passed.
    pub failure: Option<String>,
    /// `false` for the malformed-input cases, which check that the kernel returns `Err`
    /// and compare no values.
    pub numeric: bool,
}

impl CaseResult {
    fn new(name: String) -> Self {
        CaseResult {
            name,
            out: TensorErr::default(),
            lse: TensorErr::default(),
            dq: TensorErr::default(),
            dk: TensorErr::default(),
            dv: TensorErr::default(),
            failure: None,
            numeric: true,
        }
    }
    pub fn passed(&self) -> bool {
        self.failure.is_none()
    }
    fn all(&self) -> [TensorErr; 5] {
        [self.out, self.lse, self.dq, self.dk, self.dv]
    }
    /// Largest absolute error over all five outputs.
    pub fn max_err(&self) -> f64 {
        self.all().iter().map(|e| e.max_abs).fold(0.0, f64::max)
    }
    /// Largest tolerance ratio over all five outputs (`<= 1` passes).
    pub fn worst(&self) -> f64 {
        self.all().iter().map(|e| e.worst).fold(0.0, f64::max)
    }
    fn fail(&mut self, why: String) {
        match &mut self.failure {
            Some(f) => {
                f.push_str("; ");
                f.push_str(&why);
            }
            None => self.failure = Some(why),
        }
    }
}

impl fmt::Display for CaseResult {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = match &self.failure {
            None => "ok".to_string(),
            Some(why) => format!("FAILED: {why}"),
        };
        if !self.numeric {
            return write!(
                f,
                "case={} (malformed input must be Err) {verdict}",
                self.name
            );
        }
        write!(
            f,
            "case={} max_err={:.3e} worst={:.3} out={:.2e} lse={:.2e} dq={:.2e} dk={:.2e} dv={:.2e} {}",
            self.name,
            self.max_err(),
            self.worst(),
            self.out.max_abs,
            self.lse.max_abs,
            self.dq.max_abs,
            self.dk.max_abs,
            self.dv.max_abs,
            verdict
        )
    }
}

/// The outcome of running the suite on one kernel.
#[derive(Debug, Clone)]
pub struct Report {
    pub kernel: String,
    pub tolerance: Tolerance,
    pub cases: Vec<CaseResult>,
}

impl Report {
    pub fn passed(&self) -> bool {
        self.cases.iter().all(CaseResult::passed)
    }
    pub fn failures(&self) -> Vec<&CaseResult> {
        self.cases.iter().filter(|c| !c.passed()).collect()
    }
    /// `Ok` when every case passed, else an error naming the kernel and each failing case.
    pub fn ensure_passed(&self) -> Result<(), String> {
        let failed = self.failures();
        if failed.is_empty() {
            return Ok(());
        }
        let lines: Vec<String> = failed
            .iter()
            .map(|c| {
                format!(
                    "kernel={} case={}: {}",
                    self.kernel,
                    c.name,
                    c.failure.as_deref().unwrap_or("")
                )
            })
            .collect();
        Err(format!(
            "attention kernel {:?} failed {} of {} conformance cases:\n{}",
            self.kernel,
            failed.len(),
            self.cases.len(),
            lines.join("\n")
        ))
    }
}

impl fmt::Display for Report {
    /// One line per case, each prefixed with `kernel=<name>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in &self.cases {
            writeln!(f, "kernel={} {c}", self.kernel)?;
        }
        write!(
            f,
            "kernel={} {}/{} cases passed (atol {:e}, rtol {:e})",
            self.kernel,
            self.cases.len() - self.failures().len(),
            self.cases.len(),
            self.tolerance.atol,
            self.tolerance.rtol
        )
    }
}

/// One numerical case: a mask, dims and input statistics.
#[derive(Debug, Clone)]
pub struct Case {
    pub name: String,
    pub mask: BlockMask,
    pub dims: AttnDims,
    pub scale: f32,
    /// `q` is drawn from `[-q_amp, q_amp)` (2 normally; large to test softmax stability).
    pub q_amp: f32,
}

fn mask_err(e: impl fmt::Display) -> String {
    format!("conformance suite: building a case mask failed: {e}")
}

/// The masks of the suite, by name. Small enough for debug builds, large enough to span several
/// 32-row/32-key tiles and to hit tile edges (no size is a multiple of 32).
pub fn suite_masks() -> Result<Vec<(&'static str, BlockMask)>, String> {
    // 10 anchors sampled without replacement from [0, ctx_len - 1), sorted, plus two padding
    // blocks: what the training batch builder produces.
    let mut rng = ChaCha8Rng::seed_from_u64(0xDF1A5);
    let ctx = 150usize;
    let mut anchors: Vec<i32> = rand::seq::index::sample(&mut rng, ctx - 1, 10)
        .into_iter()
        .map(|a| a as i32)
        .collect();
    anchors.sort_unstable();
    anchors.extend([-1, -1]);
    Ok(vec![
        // Anchors closer than block_size (and one duplicate): positions overlap, the mask must
        // still isolate blocks by block index of the *key rows*, context by anchor position.
        (
            "dflash_overlap",
            BlockMask::dflash(40, 4, &[3, 5, 5, 6, 20, 21, 38, 39]).map_err(mask_err)?,
        ),
        // Anchor 0 (sees no context, only its block) and trailing padding blocks (see nothing).
        (
            "dflash_padding",
            BlockMask::dflash(37, 5, &[0, 2, 15, 16, -1, -1]).map_err(mask_err)?,
        ),
        (
            "dflash_random",
            BlockMask::dflash(ctx, 8, &anchors).map_err(mask_err)?,
        ),
        (
            "dflash_sliding",
            BlockMask::dflash_sliding(48, 4, &[2, 10, 11, 30, 47, -1], 8).map_err(mask_err)?,
        ),
        ("causal", BlockMask::causal(70).map_err(mask_err)?),
        (
            "document",
            BlockMask::document(&[13, 1, 40, 20]).map_err(mask_err)?,
        ),
        (
            "sliding_window",
            BlockMask::sliding_window(80, 17).map_err(mask_err)?,
        ),
    ])
}

fn dims_for(mask: &BlockMask, group: usize, head_dim: usize) -> AttnDims {
    let kv_heads = 2;
    AttnDims {
        q_rows: mask.q_len(),
        kv_rows: mask.kv_len(),
        q_heads: kv_heads * group,
        kv_heads,
        head_dim,
    }
}

/// Every numerical case: each mask x GQA group {1, 2, 4} (2 kv heads) x head_dim {16, 64},
/// plus large-score cases (scores beyond f32 `exp` overflow) for the online softmax.
pub fn suite_cases() -> Result<Vec<Case>, String> {
    let mut cases = Vec::new();
    let masks = suite_masks()?;
    for (name, mask) in &masks {
        for group in [1, 2, 4] {
            for head_dim in [16, 64] {
                cases.push(Case {
                    name: format!("{name}/gqa{group}/d{head_dim}"),
                    mask: mask.clone(),
                    dims: dims_for(mask, group, head_dim),
                    scale: 1.0 / (head_dim as f32).sqrt(),
                    q_amp: 2.0,
                });
            }
        }
    }
    for (name, mask) in &masks {
        if matches!(*name, "dflash_random" | "causal") {
            // |q| up to 40 with |k| up to 2 and D = 16: scaled scores reach ~100, so a kernel
            // that exponentiates without subtracting the running max overflows f32.
            cases.push(Case {
                name: format!("{name}_large_scores/gqa2/d16"),
                mask: mask.clone(),
                dims: dims_for(mask, 2, 16),
                scale: 0.25,
                q_amp: 40.0,
            });
        }
    }
    Ok(cases)
}

fn seed_of(name: &str) -> u64 {
    // FNV-1a: stable across Rust versions (unlike `DefaultHasher`).
    name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

fn uniform(rng: &mut ChaCha8Rng, n: usize, amp: f32) -> Vec<f32> {
    (0..n).map(|_| rng.random_range(-amp..amp)).collect()
}

/// Compares `got` to `want`; on failure returns a message locating the worst element.
/// `inner` is the size of one row (heads x head_dim) for locating elements.
fn compare(
    what: &str,
    got: &[f32],
    want: &[f64],
    inner: (usize, usize),
    tol: Tolerance,
) -> (TensorErr, Option<String>) {
    let mut e = TensorErr::default();
    let mut worst_at: Option<(usize, f32, f64)> = None;
    if got.len() != want.len() {
        return (
            TensorErr {
                max_abs: f64::INFINITY,
                worst: f64::INFINITY,
            },
            Some(format!(
                "{what}: {} elements, expected {}",
                got.len(),
                want.len()
            )),
        );
    }
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let (abs, ratio) = if w == f64::NEG_INFINITY {
            if g == f32::NEG_INFINITY {
                (0.0, 0.0)
            } else {
                (f64::INFINITY, f64::INFINITY)
            }
        } else if !g.is_finite() {
            (f64::INFINITY, f64::INFINITY)
        } else {
            let abs = (g as f64 - w).abs();
            (abs, abs / (tol.atol + tol.rtol * w.abs()))
        };
        e.max_abs = e.max_abs.max(abs);
        if ratio > e.worst || (ratio.is_infinite() && worst_at.is_none()) {
            e.worst = ratio;
            worst_at = Some((i, g, w));
        }
    }
    let failure = match worst_at {
        Some((i, g, w)) if e.worst > 1.0 => {
            let (heads, d) = inner;
            let (row, rest) = (i / (heads * d), i % (heads * d));
            let at = if d == 1 {
                format!("row {row}, head {rest}")
            } else {
                format!("row {row}, head {}, d {}", rest / d, rest % d)
            };
            Some(format!(
                "{what}[{at}] = {g} but oracle says {w} (|err| {:.3e}, {:.1}x tolerance)",
                (g as f64 - w).abs(),
                e.worst
            ))
        }
        _ => None,
    };
    (e, failure)
}

fn bits(xs: &[f32]) -> Vec<u32> {
    xs.iter().map(|x| x.to_bits()).collect()
}

fn run_case(kernel: &dyn HostAttentionKernel, case: &Case, tol: Tolerance) -> CaseResult {
    let mut res = CaseResult::new(case.name.clone());
    let dims = case.dims;
    let (tq, tk, hq, hkv, d) = (
        dims.q_rows,
        dims.kv_rows,
        dims.q_heads,
        dims.kv_heads,
        dims.head_dim,
    );
    let mut rng = ChaCha8Rng::seed_from_u64(seed_of(&case.name));
    let q = uniform(&mut rng, tq * hq * d, case.q_amp);
    let k = uniform(&mut rng, tk * hkv * d, 2.0);
    let v = uniform(&mut rng, tk * hkv * d, 1.0);
    let d_out = uniform(&mut rng, tq * hq * d, 1.0);

    let fwd = oracle::forward(&dims, &q, &k, &v, &case.mask, case.scale);
    let grads = oracle::backward(&dims, &q, &k, &v, &case.mask, case.scale, &d_out);

    // Forward, twice, into NaN-poisoned buffers.
    let run_fwd = || -> Result<(Vec<f32>, Vec<f32>), String> {
        let mut out = vec![f32::NAN; tq * hq * d];
        let mut lse = vec![f32::NAN; tq * hq];
        catch_unwind(AssertUnwindSafe(|| {
            kernel.forward(
                &dims, &q, &k, &v, &case.mask, case.scale, &mut out, &mut lse,
            )
        }))
        .map_err(|_| "forward panicked".to_string())?
        .map_err(|e| format!("forward returned Err on valid input: {e}"))?;
        Ok((out, lse))
    };
    match (run_fwd(), run_fwd()) {
        (Ok((out, lse)), Ok((out2, lse2))) => {
            let (e, f) = compare("out", &out, &fwd.out, (hq, d), tol);
            res.out = e;
            if let Some(f) = f {
                res.fail(f);
            }
            let (e, f) = compare("lse", &lse, &fwd.lse, (hq, 1), tol);
            res.lse = e;
            if let Some(f) = f {
                res.fail(f);
            }
            if bits(&out) != bits(&out2) || bits(&lse) != bits(&lse2) {
                res.fail("forward is not deterministic (two runs differ bitwise)".into());
            }
        }
        (Err(e), _) | (_, Err(e)) => res.fail(e),
    }

    // Backward, twice, fed the oracle's forward rounded to f32.
    let out32: Vec<f32> = fwd.out.iter().map(|&x| x as f32).collect();
    let lse32: Vec<f32> = fwd.lse.iter().map(|&x| x as f32).collect();
    let run_bwd = || -> Result<[Vec<f32>; 3], String> {
        let mut dq = vec![f32::NAN; tq * hq * d];
        let mut dk = vec![f32::NAN; tk * hkv * d];
        let mut dv = vec![f32::NAN; tk * hkv * d];
        catch_unwind(AssertUnwindSafe(|| {
            kernel.backward(
                &dims, &q, &k, &v, &out32, &lse32, &d_out, &case.mask, case.scale, &mut dq,
                &mut dk, &mut dv,
            )
        }))
        .map_err(|_| "backward panicked".to_string())?
        .map_err(|e| format!("backward returned Err on valid input: {e}"))?;
        Ok([dq, dk, dv])
    };
    match (run_bwd(), run_bwd()) {
        (Ok([dq, dk, dv]), Ok(again)) => {
            for (what, got, want, inner, slot) in [
                ("dq", &dq, &grads.dq, (hq, d), &mut res.dq),
                ("dk", &dk, &grads.dk, (hkv, d), &mut res.dk),
                ("dv", &dv, &grads.dv, (hkv, d), &mut res.dv),
            ] {
                let (e, f) = compare(what, got, want, inner, tol);
                *slot = e;
                if let Some(f) = f {
                    res.failure = Some(match res.failure.take() {
                        Some(prev) => format!("{prev}; {f}"),
                        None => f,
                    });
                }
            }
            if [bits(&dq), bits(&dk), bits(&dv)]
                != [bits(&again[0]), bits(&again[1]), bits(&again[2])]
            {
                res.fail("backward is not deterministic (two runs differ bitwise)".into());
            }
        }
        (Err(e), _) | (_, Err(e)) => res.fail(e),
    }
    res
}

/// Malformed calls: each must return `Err` (not panic, not `Ok`).
fn bad_input_cases(kernel: &dyn HostAttentionKernel) -> Result<Vec<CaseResult>, String> {
    let mask = BlockMask::dflash(20, 4, &[3, 9, -1]).map_err(mask_err)?;
    let good = dims_for(&mask, 2, 16);
    let (tq, tk, hq, hkv, d) = (
        good.q_rows,
        good.kv_rows,
        good.q_heads,
        good.kv_heads,
        good.head_dim,
    );
    let mut rng = ChaCha8Rng::seed_from_u64(seed_of("bad_input"));
    let q = uniform(&mut rng, tq * hq * d, 1.0);
    let k = uniform(&mut rng, tk * hkv * d, 1.0);
    let v = uniform(&mut rng, tk * hkv * d, 1.0);
    let scale = 0.25;

    struct Bad {
        name: &'static str,
        dims: AttnDims,
        q_len: usize,
        kv_len: usize,
        out_len: usize,
        lse_len: usize,
    }
    let ok = Bad {
        name: "",
        dims: good,
        q_len: tq * hq * d,
        kv_len: tk * hkv * d,
        out_len: tq * hq * d,
        lse_len: tq * hq,
    };
    let bads = [
        Bad {
            name: "bad_input/q_len",
            q_len: ok.q_len - 1,
            ..ok
        },
        Bad {
            name: "bad_input/kv_len",
            kv_len: ok.kv_len + d,
            ..ok
        },
        Bad {
            name: "bad_input/out_len",
            out_len: ok.out_len - d,
            ..ok
        },
        Bad {
            name: "bad_input/lse_len",
            lse_len: ok.lse_len + 1,
            ..ok
        },
        // 3 query heads over 2 kv heads: not a whole number of groups.
        Bad {
            name: "bad_input/heads",
            dims: AttnDims { q_heads: 3, ..good },
            ..ok
        },
        Bad {
            name: "bad_input/kv_heads_zero",
            dims: AttnDims {
                kv_heads: 0,
                ..good
            },
            ..ok
        },
        // The mask describes a different number of query rows than q has.
        Bad {
            name: "bad_input/mask_rows",
            dims: AttnDims {
                q_rows: tq + 4,
                ..good
            },
            ..ok
        },
    ];
    let mut results = Vec::new();
    for b in bads {
        let mut res = CaseResult::new(b.name.to_string());
        res.numeric = false;
        let pad = |xs: &[f32], n: usize| -> Vec<f32> {
            let mut v: Vec<f32> = xs.iter().copied().cycle().take(n).collect();
            v.resize(n, 0.5);
            v
        };
        let (qb, kb, vb) = (pad(&q, b.q_len), pad(&k, b.kv_len), pad(&v, b.kv_len));
        let d_out = pad(&q, b.out_len);
        let fwd = catch_unwind(AssertUnwindSafe(|| {
            let mut out = vec![f32::NAN; b.out_len];
            let mut lse = vec![f32::NAN; b.lse_len];
            kernel.forward(&b.dims, &qb, &kb, &vb, &mask, scale, &mut out, &mut lse)
        }));
        match fwd {
            Err(_) => res.fail("forward panicked on malformed input (must return Err)".into()),
            Ok(Ok(())) => res.fail("forward accepted malformed input".into()),
            Ok(Err(_)) => {}
        }
        let bwd = catch_unwind(AssertUnwindSafe(|| {
            let out = pad(&q, b.out_len);
            let lse = vec![0.0f32; b.lse_len];
            let mut dq = vec![f32::NAN; b.q_len];
            let mut dk = vec![f32::NAN; b.kv_len];
            let mut dv = vec![f32::NAN; b.kv_len];
            kernel.backward(
                &b.dims, &qb, &kb, &vb, &out, &lse, &d_out, &mask, scale, &mut dq, &mut dk, &mut dv,
            )
        }));
        match bwd {
            Err(_) => res.fail("backward panicked on malformed input (must return Err)".into()),
            Ok(Ok(())) => res.fail("backward accepted malformed input".into()),
            Ok(Err(_)) => {}
        }
        results.push(res);
    }
    Ok(results)
}

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
