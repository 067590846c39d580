//! Shared test helpers: a backend, seeded random inputs, tolerance checks and a
//! finite-difference gradient checker.
#![allow(dead_code)]

use dflash_backend_reference::ReferenceBackend;
use dflash_core::registry::BackendOptions;
// Not every test file uses every one of these.
#[allow(unused_imports)]
pub use dflash_tests::tolerance::{AtolUnit, Tolerance, assert_close};
use rand_chacha::ChaCha8Rng;

/// The reference backend with default options (the shared op suite's `reference`).
pub fn backend() -> ReferenceBackend {
    dflash_tests::ops::reference()
}

pub fn backend_threads(threads: usize) -> ReferenceBackend {
    let opts = BackendOptions {
        threads,
        ..BackendOptions::default()
    };
    ReferenceBackend::new(&opts).expect("reference backend")
}

// Seeded inputs and transfers, shared with every backend's tests.
#[allow(unused_imports)]
pub use dflash_tests::ops::{down, rng, up};

/// `n` values uniform in `[-1, 1)` (never all zeros).
pub fn rand_vec(rng: &mut ChaCha8Rng, n: usize) -> Vec<f32> {
    dflash_tests::ops::rand_vec(rng, n, 1.0)
}

pub fn to_f64(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

/// Bit-exact equality (NaN == NaN, -0 != +0).
pub fn assert_bits_eq(what: &str, a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len(), "{what}: lengths differ");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert_eq!(x.to_bits(), y.to_bits(), "{what}[{i}]: {x} vs {y}");
    }
}

/// Checks analytic gradients against a 5-point central finite-difference stencil:
/// `f'(x) ~ (-f(x+2h) + 8f(x+h) - 8f(x-h) + f(x-2h)) / 12h` (truncation O(h^4)).
///
/// `loss(inputs)` must return a scalar in f64 (typically `sum(out * cotangent)` of an f32
/// op). `grads[i]` is the analytic gradient of input `i`, or `None` to skip that input.
pub fn fd_check(
    what: &str,
    inputs: &[Vec<f32>],
    grads: &[Option<Vec<f32>>],
    h: f32,
    tol: &Tolerance,
    loss: impl Fn(&[Vec<f32>]) -> f64,
) {
    let mut xs = inputs.to_vec();
    for (n, g) in grads.iter().enumerate() {
        let Some(g) = g else { continue };
        assert_eq!(g.len(), xs[n].len(), "{what}: grad {n} length");
        let mut num = Vec::with_capacity(g.len());
        for e in 0..g.len() {
            let x0 = xs[n][e];
            let mut at = |d: f32| {
                xs[n][e] = x0 + d;
                let l = loss(&xs);
                xs[n][e] = x0;
                l
            };
            let (p2, p1, m1, m2) = (at(2.0 * h), at(h), at(-h), at(-2.0 * h));
            num.push((-p2 + 8.0 * p1 - 8.0 * m1 + m2) / (12.0 * h as f64));
        }
        assert_close(&format!("{what}: d input {n}"), g, &num, tol);
    }
}

/// `sum(out * cot)` in f64.
pub fn dot64(out: &[f32], cot: &[f32]) -> f64 {
    out.iter()
        .zip(cot)
        .map(|(&a, &b)| a as f64 * b as f64)
        .sum()
}
