//! Running cases against a kernel: seeded inputs, NaN-poisoned outputs, the comparison with
//! the oracle, the determinism re-runs, and the malformed calls that must return `Err`.

use std::panic::{AssertUnwindSafe, catch_unwind};

use dflash_core::mask::BlockMask;
use dflash_core::{AttnBackward, AttnDims, AttnForward, HostAttentionKernel};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::cases::{Case, Layout, dims_of, mask_err};
use crate::ops::Format;
use crate::oracle;
use crate::report::{CaseResult, TensorErr};
use crate::tolerance::{Tolerance, closeness};

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
pub(crate) fn compare(
    what: &str,
    got: &[f32],
    want: &[f64],
    inner: (usize, usize),
    tol: &Tolerance,
) -> (TensorErr, Option<String>) {
    let c = closeness(got, want, tol);
    let e = TensorErr {
        max_abs: c.max_abs,
        worst: c.worst,
    };
    if let Some((g, w)) = c.len_mismatch {
        return (e, Some(format!("{what}: {g} elements, expected {w}")));
    }
    let failure = match c.worst_at {
        Some((i, g, w)) if !c.passed() => {
            let (heads, d) = inner;
            let (row, rest) = (i / (heads * d), i % (heads * d));
            let at = if d == 1 {
                format!("row {row}, head {rest}")
            } else {
                format!("row {row}, head {}, d {}", rest / d, rest % d)
            };
            Some(format!(
                "{what}[{at}] = {g}, expected {w} (|err| {:.3e}, {:.1}x tolerance)",
                (g - w).abs(),
                c.worst
            ))
        }
        _ => None,
    };
    (e, failure)
}

/// The inputs of one case: fresh uniform values from a stream seeded by the case name, `q` in
/// `[-q_amp, q_amp)`, `k` in `[-2, 2)`, `v` and `d_out` in `[-1, 1)`.
pub struct CaseInputs {
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub d_out: Vec<f32>,
}

impl CaseInputs {
    pub fn draw(case: &Case) -> Self {
        let AttnDims {
            q_rows: tq,
            kv_rows: tk,
            q_heads: hq,
            kv_heads: hkv,
            head_dim: d,
        } = case.dims;
        let mut rng = ChaCha8Rng::seed_from_u64(seed_of(&case.name));
        let q = uniform(&mut rng, tq * hq * d, case.q_amp);
        let k = uniform(&mut rng, tk * hkv * d, 2.0);
        let v = uniform(&mut rng, tk * hkv * d, 1.0);
        let d_out = uniform(&mut rng, tq * hq * d, 1.0);
        CaseInputs { q, k, v, d_out }
    }

    /// Each input rounded to `format` and widened back (`F32`: unchanged).
    pub(crate) fn rounded_to(self, format: Format) -> Self {
        if format == Format::F32 {
            return self;
        }
        let round = |xs: Vec<f32>| xs.into_iter().map(|x| format.round(x)).collect();
        CaseInputs {
            q: round(self.q),
            k: round(self.k),
            v: round(self.v),
            d_out: round(self.d_out),
        }
    }
}

fn bits(xs: &[f32]) -> Vec<u32> {
    xs.iter().map(|x| x.to_bits()).collect()
}

/// FNV-1a over the bits of `xs`: any changed element (NaN payloads included) changes it.
pub fn checksum(xs: &[f32]) -> u64 {
    xs.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, x| {
        (h ^ x.to_bits() as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The first of `inputs` (name, data, checksum before the call) that the call changed, as a
/// failure: inputs are read-only, and a foreign kernel writing into one (through the pointer
/// the C ABI hands it) would corrupt what the host computes from it next (q in the backward).
fn changed_input(call: &str, inputs: &[(&str, &[f32], u64)]) -> Result<(), String> {
    match inputs.iter().find(|(_, xs, sum)| checksum(xs) != *sum) {
        Some((name, _, _)) => Err(format!(
            "{call} wrote into its input {name} (inputs are read-only)"
        )),
        None => Ok(()),
    }
}

/// `got` against `want` for each run (the first, then the rerun): every run is held to the
/// tolerance, and `slot` keeps the worse error.
fn compare_runs(
    res: &mut CaseResult,
    what: &str,
    runs: [&[f32]; 2],
    want: &[f64],
    inner: (usize, usize),
    tol: &Tolerance,
    slot: fn(&mut CaseResult) -> &mut TensorErr,
) {
    for (run, got) in ["", " (rerun)"].into_iter().zip(runs) {
        let (e, f) = compare(&format!("{what}{run}"), got, want, inner, tol);
        let s = slot(res);
        if e.worst >= s.worst {
            *s = e;
        }
        if let Some(f) = f {
            res.fail(f);
        }
    }
}

pub(crate) fn run_case(
    kernel: &dyn HostAttentionKernel,
    case: &Case,
    tol: &Tolerance,
) -> CaseResult {
    let mut res = CaseResult::new(case.name.clone());
    let dims = case.dims;
    let (tq, tk, hq, hkv, d) = (
        dims.q_rows,
        dims.kv_rows,
        dims.q_heads,
        dims.kv_heads,
        dims.head_dim,
    );
    let CaseInputs { q, k, v, d_out } = CaseInputs::draw(case);

    let fwd = oracle::forward(&dims, &q, &k, &v, &case.mask, case.scale);
    let grads = oracle::backward(&dims, &q, &k, &v, &case.mask, case.scale, &d_out);
    let (sq, sk, sv, sd) = (checksum(&q), checksum(&k), checksum(&v), checksum(&d_out));

    // Forward, twice, into NaN-poisoned buffers; both runs against the oracle.
    let run_fwd = || -> Result<(Vec<f32>, Vec<f32>), String> {
        let mut out = vec![f32::NAN; tq * hq * d];
        let mut lse = vec![f32::NAN; tq * hq];
        catch_unwind(AssertUnwindSafe(|| {
            let call = AttnForward::new(
                &dims,
                &case.mask,
                case.scale,
                [&q, &k, &v],
                [&mut out, &mut lse],
            )?;
            kernel.forward(call)
        }))
        .map_err(|_| "forward panicked".to_string())?
        .map_err(|e| format!("forward returned Err on valid input: {e}"))?;
        changed_input("forward", &[("q", &q, sq), ("k", &k, sk), ("v", &v, sv)])?;
        Ok((out, lse))
    };
    match (run_fwd(), run_fwd()) {
        (Ok((out, lse)), Ok((out2, lse2))) => {
            let o = [&out[..], &out2[..]];
            compare_runs(&mut res, "out", o, &fwd.out, (hq, d), tol, |r| &mut r.out);
            let l = [&lse[..], &lse2[..]];
            compare_runs(&mut res, "lse", l, &fwd.lse, (hq, 1), tol, |r| &mut r.lse);
            if bits(&out) != bits(&out2) || bits(&lse) != bits(&lse2) {
                res.fail("forward is not deterministic (two runs differ bitwise)".into());
            }
        }
        (Err(e), _) | (_, Err(e)) => res.fail(e),
    }

    // Backward, twice, fed the oracle's forward rounded to f32; both runs against the oracle.
    let out32: Vec<f32> = fwd.out.iter().map(|&x| x as f32).collect();
    let lse32: Vec<f32> = fwd.lse.iter().map(|&x| x as f32).collect();
    let (so, sl) = (checksum(&out32), checksum(&lse32));
    let run_bwd = || -> Result<[Vec<f32>; 3], String> {
        let mut dq = vec![f32::NAN; tq * hq * d];
        let mut dk = vec![f32::NAN; tk * hkv * d];
        let mut dv = vec![f32::NAN; tk * hkv * d];
        catch_unwind(AssertUnwindSafe(|| {
            let call = AttnBackward::new(
                &dims,
                &case.mask,
                case.scale,
                [&q, &k, &v, &out32, &lse32, &d_out],
                [&mut dq, &mut dk, &mut dv],
            )?;
            kernel.backward(call)
        }))
        .map_err(|_| "backward panicked".to_string())?
        .map_err(|e| format!("backward returned Err on valid input: {e}"))?;
        let inputs = [
            ("q", &q[..], sq),
            ("k", &k[..], sk),
            ("v", &v[..], sv),
            ("out", &out32[..], so),
            ("lse", &lse32[..], sl),
            ("d_out", &d_out[..], sd),
        ];
        changed_input("backward", &inputs)?;
        Ok([dq, dk, dv])
    };
    match (run_bwd(), run_bwd()) {
        (Ok([dq, dk, dv]), Ok(again)) => {
            let (gq, gk, gv) = (&grads.dq, &grads.dk, &grads.dv);
            let (q_in, kv_in) = ((hq, d), (hkv, d));
            compare_runs(&mut res, "dq", [&dq, &again[0]], gq, q_in, tol, |r| {
                &mut r.dq
            });
            compare_runs(&mut res, "dk", [&dk, &again[1]], gk, kv_in, tol, |r| {
                &mut r.dk
            });
            compare_runs(&mut res, "dv", [&dv, &again[2]], gv, kv_in, tol, |r| {
                &mut r.dv
            });
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

/// Malformed calls: each must return `Err` (not panic, not `Ok`). The call's constructor
/// rejects them before any kernel runs, which is what every kernel relies on.
pub(crate) fn bad_input_cases(kernel: &dyn HostAttentionKernel) -> Result<Vec<CaseResult>, String> {
    let mask = BlockMask::dflash(20, 4, &[3, 9, -1]).map_err(mask_err)?;
    let good = dims_of(&mask, Layout::new(4, 2, 16));
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
            AttnForward::new(&b.dims, &mask, scale, [&qb, &kb, &vb], [&mut out, &mut lse])
                .and_then(|call| kernel.forward(call))
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
            AttnBackward::new(
                &b.dims,
                &mask,
                scale,
                [&qb, &kb, &vb, &out, &lse, &d_out],
                [&mut dq, &mut dk, &mut dv],
            )
            .and_then(|call| kernel.backward(call))
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use dflash_backend_reference::ReferenceAttention;

    use super::*;
    use crate::cases::{Layout, large_score_cases};
    use crate::report::TOLERANCE;

    /// The reference kernel, right on each first run of a case and off by 1 in one element on
    /// each rerun (odd calls), of the forward or the backward.
    #[derive(Default)]
    struct RightOnlyOnce {
        backward: bool,
        calls: AtomicUsize,
    }

    impl RightOnlyOnce {
        fn rerun(&self, pass_is_backward: bool) -> bool {
            pass_is_backward == self.backward && self.calls.fetch_add(1, Ordering::Relaxed) % 2 == 1
        }
    }

    impl HostAttentionKernel for RightOnlyOnce {
        fn name(&self) -> &str {
            "right-only-once"
        }
        fn forward(&self, call: AttnForward<'_>) -> Result<(), String> {
            let x = call.input;
            let (out, lse) = (call.out, call.lse);
            let again = AttnForward::new(&x.dims, x.mask, x.scale, [x.q, x.k, x.v], [out, lse])?;
            ReferenceAttention.forward(again)?;
            if self.rerun(false) {
                out[0] += 1.0;
            }
            Ok(())
        }
        fn backward(&self, call: AttnBackward<'_>) -> Result<(), String> {
            let x = call.input;
            let dk = call.dk;
            let again = AttnBackward::new(
                &x.dims,
                x.mask,
                x.scale,
                [x.q, x.k, x.v, call.out, call.lse, call.d_out],
                [call.dq, &mut *dk, call.dv],
            )?;
            ReferenceAttention.backward(again)?;
            if self.rerun(true) {
                dk[0] += 1.0;
            }
            Ok(())
        }
    }

    /// A rerun is held to the oracle, not only to the first run: a kernel right once and wrong
    /// after fails with the rerun named (beside its non-determinism, which a plugin not
    /// declaring determinism is forgiven).
    #[test]
    fn a_wrong_rerun_fails_against_the_oracle() {
        let case = &large_score_cases(Layout::new(4, 2, 16)).unwrap()[0];
        for backward in [false, true] {
            let kernel = RightOnlyOnce {
                backward,
                ..Default::default()
            };
            let res = run_case(&kernel, case, &TOLERANCE);
            let failure = res.failure.clone().unwrap_or_default();
            let want = if backward {
                "dk (rerun)["
            } else {
                "out (rerun)["
            };
            assert!(failure.contains(want), "{failure}");
            assert!(res.worst() > 1.0, "{res}");
        }
        let right = run_case(&ReferenceAttention, case, &TOLERANCE);
        assert!(right.passed(), "{right}");
    }

    /// Fed in f16, every input is f16-representable (rounding it again changes nothing) and
    /// most of the drawn values moved; fed in f32, the draw is untouched.
    #[test]
    fn inputs_fed_in_f16_are_f16_values() {
        let case = &large_score_cases(Layout::new(4, 2, 16)).unwrap()[0];
        let drawn = CaseInputs::draw(case);
        let fed = CaseInputs::draw(case).rounded_to(Format::F16);
        for (name, a, b) in [
            ("q", &drawn.q, &fed.q),
            ("k", &drawn.k, &fed.k),
            ("v", &drawn.v, &fed.v),
            ("d_out", &drawn.d_out, &fed.d_out),
        ] {
            assert!(b.iter().all(|&x| Format::F16.round(x) == x), "{name}");
            let moved = a.iter().zip(b).filter(|(x, y)| x != y).count();
            assert!(moved * 2 > a.len(), "{name}: {moved} of {} moved", a.len());
            // Half an ulp: 2^-11 relative, or 2^-25 absolute among f16's subnormals.
            let off = a
                .iter()
                .zip(b)
                .find(|&(x, y)| (x - y).abs() > (x.abs() * 2f32.powi(-11)).max(2f32.powi(-25)));
            assert!(
                off.is_none(),
                "{name}: {off:?} moved by more than half an ulp"
            );
        }
        let same = CaseInputs::draw(case).rounded_to(Format::F32);
        assert_eq!(bits(&same.q), bits(&drawn.q));
    }
}
