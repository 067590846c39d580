//! Shared helpers of the CUDA conformance tests: backends (with an explicit, clean skip when
//! no CUDA device is present), seeded random inputs and tolerance checks that print the
//! measured error of every comparison.
#![allow(dead_code)]

use dflash_backend_cuda::{CudaBackend, CudaOptions, GemmPrecision};
use dflash_backend_reference::ReferenceBackend;
use dflash_core::registry::BackendOptions;
use dflash_core::{Error, MemoryOps, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The CUDA backend on device 0 with debug poison on (every output allocation NaN-filled
/// first, so an unwritten element fails the comparison), or `None` after printing the skip
/// line when this machine has no CUDA. Any other start-up failure (e.g. a kernel that does
/// not compile) fails the test.
pub fn cuda_with(gemm: GemmPrecision) -> Option<CudaBackend> {
    dflash_backend_cuda::link();
    let opts = BackendOptions {
        attention: "cuda-simple".into(),
        threads: 0,
        device: 0,
    };
    match CudaBackend::with_options(&opts, CudaOptions { gemm, poison: true }) {
        Ok(b) => Some(b),
        Err(Error::Unavailable { reason, .. }) => {
            skip(&reason);
            None
        }
        Err(e) => panic!("the CUDA backend failed to start: {e}"),
    }
}

/// Prints `skipped: no CUDA device (<reason>)` where a plain `cargo test` shows it: the test
/// harness captures `print!`, not writes to the stderr handle.
pub fn skip(reason: &str) {
    use std::io::Write;
    let test = std::thread::current()
        .name()
        .unwrap_or("cuda test")
        .to_string();
    let _ = writeln!(
        std::io::stderr().lock(),
        "{test}: skipped: no CUDA device ({reason})"
    );
}

/// TF32 GEMMs (the default).
pub fn cuda() -> Option<CudaBackend> {
    cuda_with(GemmPrecision::Tf32)
}

pub fn reference() -> ReferenceBackend {
    ReferenceBackend::new(&BackendOptions::default()).expect("reference backend")
}

pub fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

/// `n` values uniform in `[-s, s)` (never all zeros).
pub fn rand_vec(r: &mut ChaCha8Rng, n: usize, s: f32) -> Vec<f32> {
    (0..n).map(|_| r.random_range(-s..s)).collect()
}

pub fn up(be: &dyn MemoryOps, data: &[f32], shape: &[usize]) -> Tensor {
    be.upload(data, shape).expect("upload")
}

pub fn down(be: &dyn MemoryOps, t: &Tensor) -> Vec<f32> {
    be.download(t).expect("download")
}

/// Compares `got` (CUDA) with `want` (reference): element `i` passes when
/// `|got - want| <= rtol * |want_i| + atol * max_j |want_j|` (or both are the same
/// non-finite value). Prints the largest absolute error, the largest error over its
/// tolerance (<= 1 passes) and the reason for the tolerance, then asserts.
pub fn check(name: &str, got: &[f32], want: &[f32], rtol: f64, atol: f64, why: &str) -> f64 {
    assert_eq!(
        got.len(),
        want.len(),
        "{name}: length {} vs {}",
        got.len(),
        want.len()
    );
    let scale = want
        .iter()
        .filter(|w| w.is_finite())
        .fold(0.0f64, |m, &w| m.max((w as f64).abs()));
    let (mut worst_abs, mut worst_ratio, mut at) = (0.0f64, 0.0f64, 0usize);
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        if !w.is_finite() || !g.is_finite() {
            assert!(
                !g.is_nan() && g.to_bits() == w.to_bits(),
                "{name}[{i}]: got {g}, want {w} (a non-finite value must match exactly; NaN never passes)"
            );
            continue;
        }
        let err = (g as f64 - w as f64).abs();
        let tol = rtol * (w as f64).abs() + atol * scale;
        let ratio = if tol > 0.0 {
            err / tol
        } else if err == 0.0 {
            0.0
        } else {
            f64::INFINITY
        };
        if err > worst_abs {
            worst_abs = err;
        }
        if ratio > worst_ratio {
            worst_ratio = ratio;
            at = i;
        }
    }
    println!(
        "  {name:<44} max_abs_err {worst_abs:9.2e} (max|ref| {scale:8.2e})  err/tol {worst_ratio:5.3}  [rtol {rtol:.0e}, atol {atol:.0e}*max: {why}]"
    );
    assert!(
        worst_ratio <= 1.0,
        "{name}: element {at}: got {}, want {} (err/tol {worst_ratio:.3} > 1)",
        got[at],
        want[at]
    );
    worst_abs
}

/// Bit-exact comparison (copies, gathers, plain f32 adds).
pub fn check_exact(name: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{name}: lengths differ");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.to_bits(), w.to_bits(), "{name}[{i}]: {g} vs {w}");
    }
    println!("  {name:<44} bit-exact ({} elements)", got.len());
}

/// Scalar relative comparison.
pub fn check_scalar(name: &str, got: f64, want: f64, rtol: f64, why: &str) {
    let err = (got - want).abs();
    let rel = err / want.abs().max(f64::MIN_POSITIVE);
    println!(
        "  {name:<44} got {got:.9e} want {want:.9e} rel_err {rel:9.2e} [rtol {rtol:.0e}: {why}]"
    );
    assert!(
        got.is_finite() && rel <= rtol,
        "{name}: got {got}, want {want} (rel {rel:.3e} > {rtol:.0e})"
    );
}
