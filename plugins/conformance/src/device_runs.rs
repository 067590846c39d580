//! Runs of the device suite's cases through a backend's attention ops beyond what
//! `dflash_tests::check_backend_attention` does: the forward alone (a plugin without a
//! backward), and each case run twice, whose outputs must be bit-identical (a plugin declaring
//! `DF_ATTN_CAP_DETERMINISTIC`). A run is a function of the case, so the checks are tested on
//! a host backend and on runs that misbehave on purpose.

use dflash_core::Backend;
use dflash_tests::tolerance::closeness;
use dflash_tests::{Case, Tolerance, oracle};

use crate::table::{Outcome, Row};

/// A case's inputs: the suite's own draw (`dflash_tests::CaseInputs`).
pub(crate) type Inputs = dflash_tests::CaseInputs;

/// `[out, lse]`, then `[dq, dk, dv]` when the run includes the backward.
pub(crate) type Outputs = Vec<Vec<f32>>;

/// One run of a case: the forward, and the backward on its own `out`/`lse` when asked.
pub(crate) trait Run: Fn(&Case, &Inputs, bool) -> Result<Outputs, String> {}
impl<F: Fn(&Case, &Inputs, bool) -> Result<Outputs, String>> Run for F {}

/// Runs through `backend`'s attention ops (upload, forward, backward, download). The
/// conformance backend runs in poison mode (`device.rs`), so every output a run gets starts
/// NaN: an element the plugin leaves unwritten fails, in either run.
pub(crate) fn on_backend(backend: &dyn Backend) -> impl Run + '_ {
    move |case: &Case, x: &Inputs, backward: bool| {
        let d = case.dims;
        let (qs, ks) = (
            [d.q_rows, d.q_heads, d.head_dim],
            [d.kv_rows, d.kv_heads, d.head_dim],
        );
        let run = || -> dflash_core::Result<Outputs> {
            let q = backend.upload(&x.q, &qs)?;
            let k = backend.upload(&x.k, &ks)?;
            let v = backend.upload(&x.v, &ks)?;
            let (out, lse) = backend.attention(&q, &k, &v, &case.mask, case.scale)?;
            let mut got = vec![backend.download(&out)?, backend.download(&lse)?];
            if backward {
                let d_out = backend.upload(&x.d_out, &qs)?;
                let (dq, dk, dv) = backend
                    .attention_backward(&q, &k, &v, &out, &lse, &d_out, &case.mask, case.scale)?;
                for t in [dq, dk, dv] {
                    got.push(backend.download(&t)?);
                }
            }
            Ok(got)
        };
        run().map_err(|e| e.to_string())
    }
}

fn skipped<'a>(skips: &'a [(String, String)], case: &Case) -> Option<&'a String> {
    skips
        .iter()
        .find(|(n, _)| *n == case.name)
        .map(|(_, why)| why)
}

/// One row per case: `out` and `lse` of the forward against the f64 oracle under `tol`
/// (`[out, lse]`); cases in `skips` skipped.
pub(crate) fn forward_rows(
    cases: &[Case],
    skips: &[(String, String)],
    tol: [Tolerance; 2],
    run: impl Run,
) -> Vec<Row> {
    cases
        .iter()
        .map(|case| {
            let mut row = Row {
                name: case.name.clone(),
                worst: None,
                max_err: None,
                outcome: Outcome::Passed,
            };
            if let Some(why) = skipped(skips, case) {
                row.outcome = Outcome::Skipped(why.clone());
                return row;
            }
            let x = Inputs::draw(case);
            let got = match run(case, &x, false) {
                Ok(got) => got,
                Err(e) => {
                    row.outcome = Outcome::Failed(format!("forward returned Err: {e}"));
                    return row;
                }
            };
            let want = oracle::forward(&case.dims, &x.q, &x.k, &x.v, &case.mask, case.scale);
            let mut failures = Vec::new();
            let (mut worst, mut max_err) = (0f64, 0f64);
            for ((what, got), (want, tol)) in ["out", "lse"]
                .into_iter()
                .zip(&got)
                .zip([&want.out, &want.lse].into_iter().zip(&tol))
            {
                let c = closeness(got, want, tol);
                (worst, max_err) = (worst.max(c.worst), max_err.max(c.max_abs));
                if c.passed() {
                    continue;
                }
                failures.push(match (c.len_mismatch, c.worst_at) {
                    (Some((g, w)), _) => format!("{what}: {g} elements, expected {w}"),
                    (_, Some((i, g, w))) => format!(
                        "{what}[{i}] = {g}, expected {w} ({:.1}x tolerance)",
                        c.worst
                    ),
                    _ => format!("{what}: {:.1}x tolerance", c.worst),
                });
            }
            (row.worst, row.max_err) = (Some(worst), Some(max_err));
            if !failures.is_empty() {
                row.outcome = Outcome::Failed(failures.join("; "));
            }
            row
        })
        .collect()
}

/// Each case not in `skips` run twice (with the backward when `backward`): the cases whose
/// runs differ bitwise, with the outputs that differ.
pub(crate) fn nondeterministic(
    cases: &[Case],
    skips: &[(String, String)],
    backward: bool,
    run: impl Run,
) -> Vec<(String, String)> {
    const NAMES: [&str; 5] = ["out", "lse", "dq", "dk", "dv"];
    let bits = |xs: &[f32]| xs.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    cases
        .iter()
        .filter(|c| skipped(skips, c).is_none())
        .filter_map(|case| {
            let x = Inputs::draw(case);
            // A failing run is the other checks' business.
            let (a, b) = (run(case, &x, backward).ok()?, run(case, &x, backward).ok()?);
            let differ: Vec<&str> = NAMES
                .iter()
                .zip(a.iter().zip(&b))
                .filter(|(_, (a, b))| bits(a) != bits(b))
                .map(|(n, _)| *n)
                .collect();
            (!differ.is_empty()).then(|| {
                let msg = format!(
                    "not deterministic, as DF_ATTN_CAP_DETERMINISTIC declares: two runs differ \
                     bitwise in {}",
                    differ.join(", ")
                );
                (case.name.clone(), msg)
            })
        })
        .collect()
}

/// `rows` with each case of `nondeterministic` failed (beside any failure it has).
pub(crate) fn fail_nondeterministic(rows: &mut [Row], nondeterministic: &[(String, String)]) {
    for (name, why) in nondeterministic {
        if let Some(row) = rows.iter_mut().find(|r| r.name == *name) {
            row.outcome = match &row.outcome {
                Outcome::Failed(f) => Outcome::Failed(format!("{f}; {why}")),
                _ => Outcome::Failed(why.clone()),
            };
        }
    }
}

#[cfg(test)]
mod tests;
