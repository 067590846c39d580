//! The device-only checks on a host backend (the reference backend's attention ops), whose
//! runs are then made to misbehave: what a CUDA plugin's would look like, without a GPU.

use std::sync::atomic::{AtomicUsize, Ordering};

use dflash_tests::{Case, HOST_LAYOUTS, Tolerance, cases_on, suite_masks};

use super::*;

const TOL: [Tolerance; 2] = [
    Tolerance::DEVICE_F32_ATTN_OUT,
    Tolerance::DEVICE_F32_ATTN_LSE,
];

/// A few cases: two masks (one with padding blocks) on two layouts.
fn cases() -> Vec<Case> {
    let masks: Vec<_> = suite_masks()
        .unwrap()
        .into_iter()
        .filter(|(n, _)| ["dflash_padding", "causal_45"].contains(n))
        .collect();
    cases_on(&masks, &HOST_LAYOUTS[..2])
}

#[test]
fn a_right_forward_passes_and_a_wrong_one_fails_naming_the_tensor() {
    let backend = dflash_tests::reference_with("reference");
    let cases = cases();
    let skips = vec![(cases[0].name.clone(), "why not".to_string())];
    let rows = forward_rows(&cases, &skips, TOL, on_backend(backend.as_ref()));
    assert_eq!(rows.len(), cases.len());
    assert_eq!(rows[0].outcome, Outcome::Skipped("why not".into()));
    for r in &rows[1..] {
        assert_eq!(r.outcome, Outcome::Passed, "{}", r.name);
        assert!(r.worst.unwrap() < 1.0);
    }

    let inner = on_backend(backend.as_ref());
    let off = |c: &Case, x: &Inputs, b: bool| {
        let mut got = inner(c, x, b)?;
        got[1][3] += 0.5;
        Ok(got)
    };
    let rows = forward_rows(&cases, &[], TOL, off);
    for r in &rows {
        assert!(
            matches!(&r.outcome, Outcome::Failed(m) if m.starts_with("lse[3] = ")),
            "{}: {:?}",
            r.name,
            r.outcome
        );
    }
}

#[test]
fn runs_that_differ_bitwise_are_found_and_fail_their_rows() {
    let backend = dflash_tests::reference_with("reference");
    let cases = cases();
    let run = on_backend(backend.as_ref());
    assert!(nondeterministic(&cases, &[], true, &run).is_empty());

    // The last bit of dk[0] flipped on every other call: far inside any tolerance.
    let calls = AtomicUsize::new(0);
    let jitter = |c: &Case, x: &Inputs, b: bool| {
        let mut got = run(c, x, b)?;
        if calls.fetch_add(1, Ordering::Relaxed) % 2 == 1 {
            got[3][0] = f32::from_bits(got[3][0].to_bits() ^ 1);
        }
        Ok(got)
    };
    let skips = vec![(cases[1].name.clone(), "skipped".to_string())];
    let differ = nondeterministic(&cases, &skips, true, jitter);
    assert_eq!(differ.len(), cases.len() - 1);
    assert!(
        differ
            .iter()
            .all(|(n, m)| *n != cases[1].name && m.ends_with("in dk"))
    );

    let mut rows = forward_rows(&cases, &skips, TOL, &run);
    fail_nondeterministic(&mut rows, &differ);
    assert!(matches!(&rows[0].outcome, Outcome::Failed(m) if m.contains("not deterministic")));
    assert!(matches!(rows[1].outcome, Outcome::Skipped(_)));
}
