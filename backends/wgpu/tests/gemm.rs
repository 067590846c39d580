//! GEMMs against a naive f64 matmul through the shared op suite (`dflash_tests::ops::gemm`:
//! every transpose, `matmul_acc` with several `beta`, edge sizes, and the chunked paths, 4 KiB
//! bindings splitting `M`, `N` and `K`), then f16 operands and the cooperative-matrix kernel.
//!
//! Skips cleanly without an adapter; inputs, poisoning and tolerances: `common`.

mod common;

use common::*;
use dflash_core::GemmOps;
use dflash_tests::ops::gemm::{self, GemmPrecision, transpose, with_beta};

/// The shared body (`dflash_tests::ops::gemm`) through the shipped kernel on full and 4 KiB
/// bindings, the 64 x 64-tile kernel and those behind switches (`common::GEMM_SWITCHES`).
#[test]
fn gemm_ops_match_naive() {
    for p in paths(wgpu_gemm_variants()) {
        gemm::products(&p, &GemmPrecision::F32);
    }
}

fn shapes(full: bool) -> &'static [(usize, usize, usize)] {
    if full {
        &gemm::SHAPES
    } else {
        &gemm::SHAPES_SMALL
    }
}

/// f16 operands (the compute format): the shared body (`gemm::compute_format_operands`) on the
/// adapter's bindings (the shipped kernel and those behind switches, `common::GEMM_SWITCHES`)
/// and on 4 KiB bindings (split M, N, K). Products of f16 values, or of f16 and f32 values
/// already in f16 (the f32 operand the test uploads), are exact in f32, so the f32 GEMM bound
/// holds (`GEMM_TOL`, 1e-5 of `sum |a||b|`).
#[test]
fn gemm_f16_operands_match_naive() {
    for p in paths(wgpu_f16_gemm_variants()) {
        gemm::compute_format_operands(&p, gemm::F32Operands::AsStored, GEMM_TOL);
    }
}

/// One product of the cooperative-matrix GEMM, `(m, k, n)` with transposes `t` and operand
/// dtypes `f16` (`(a16, b16)`: f16 tensors, else f32 ones the kernel rounds), by `matmul` and
/// by `matmul_acc` with beta 0 (c NaN) and -0.5, against the naive product of the operands
/// rounded to f16; the worst error relative to `sum |a||b|`.
fn check_coop_product(
    be: &dflash_backend_wgpu::WgpuBackend,
    r: &mut rand_chacha::ChaCha8Rng,
    (m, k, n): (usize, usize, usize),
    (ta, tb): (bool, bool),
    (a16, b16): (bool, bool),
) -> f64 {
    let a = rand_vec(r, m * k, 1.0);
    let b = rand_vec(r, k * n, 1.0);
    let ash = if ta { [k, m] } else { [m, k] };
    let bsh = if tb { [n, k] } else { [k, n] };
    // The values the kernel multiplies: what an f16 tensor holds, an f32 one's rounded here.
    let operand = |x: &[f32], shape: &[usize], f16: bool| {
        if f16 {
            up_f16(be, x, shape)
        } else {
            (
                up(be, x, shape),
                x.iter().map(|&v| Format::F16.round(v)).collect(),
            )
        }
    };
    let (wa, ha) = operand(&a, &ash, a16);
    let (wb, hb) = operand(&b, &bsh, b16);
    let name = format!("coop a16={a16} b16={b16} {m}x{k}x{n} ta={ta} tb={tb}");
    let (want, scale) = naive(&ha, ta, &hb, tb, (m, k, n));
    let c = be.matmul(&wa, transpose(ta), &wb, transpose(tb)).unwrap();
    let mut worst = check_gemm(&name, &down(be, &c), &want, &scale);
    for beta in [0.0f32, -0.5] {
        let c0 = if beta == 0.0 {
            vec![f32::NAN; m * n]
        } else {
            rand_vec(r, m * n, 1.0)
        };
        let mut ct = up(be, &c0, &[m, n]);
        be.matmul_acc(&mut ct, &wa, transpose(ta), &wb, transpose(tb), beta)
            .unwrap();
        let (w2, s2) = with_beta(&want, &scale, &c0, beta);
        let got = down(be, &ct);
        worst = worst.max(check_gemm(
            &format!("acc beta={beta} {name}"),
            &got,
            &w2,
            &s2,
        ));
    }
    worst
}

/// The cooperative-matrix GEMM (`matmul_coop`, tensor cores) where the adapter has it; else a
/// skip line naming what the adapter lacks (lavapipe: cooperative matrices), after checking
/// that the backend refuses to start with it there (`common::wgpu_coop_gemm_variants`).
///
/// The kernel rounds its operands to f16, so the reference is the naive f64 product of the
/// operands rounded to f16 on the host (f32 operands to nearest even, `Format::F16.round`; f16
/// ones as their tensors hold them). Products of f16 values are exact in f32, so the only error left is
/// the f32 accumulation: tolerance `GEMM_TOL`, 1e-5 of `sum |a||b|` (tensor cores may truncate
/// instead of rounding as they accumulate: at most ~2^-23 of that sum a k-step of 16, < 3e-6
/// for K = 257). A kernel whose f32 -> f16 conversion does not round to nearest (WGSL leaves it
/// to the implementation) fails here with errors near 2^-11. Every transpose and dtype pair;
/// tails in m, n and k; chunked M, N and K on 4 KiB bindings.
#[test]
fn coop_gemm_matches_naive_of_f16_rounded_operands() {
    let mut r = rng(5);
    let dtypes = [(false, false), (true, false), (false, true), (true, true)];
    let transposes = [(false, false), (false, true), (true, false), (true, true)];
    for (label, be) in wgpu_coop_gemm_variants() {
        let mut worst = 0.0f64;
        for &shape in shapes(label.contains("full bindings")) {
            for t in transposes {
                for f16 in dtypes {
                    worst = worst.max(check_coop_product(&be, &mut r, shape, t, f16));
                }
            }
        }
        println!(
            "  [{label}] every shape, transpose and dtype pair: worst err/sum|a||b| {worst:.2e} \
             against the operands rounded to f16 (tol {GEMM_TOL:e}: f32 accumulation)"
        );
    }
}

/// The host's f16 rounding (`Format::F16.round`, the `half` crate: the cooperative-matrix
/// GEMM's reference) is the device's: bit-for-bit what `to_compute_format` (round to nearest even on the bits) holds, on
/// random values, ties, and values below f16's normal range; skips without `SHADER_F16`.
#[test]
fn host_f16_rounding_matches_the_device() {
    let tie = 2f32.powi(-11);
    let mut x = vec![
        1.0 + tie,
        1.0 + 3.0 * tie,
        -(1.0 + tie),
        3e-5,
        -1e-7,
        2f32.powi(-25),
        0.0,
        65504.0,
    ];
    assert_eq!(Format::F16.round(1.0 + tie), 1.0, "a tie rounds to even");
    assert_eq!(Format::F16.round(1.0 + 3.0 * tie), 1.0 + 4.0 * tie);
    x.extend(rand_vec(&mut rng(6), 4096, 2.0));
    let Some(be) = wgpu_f16() else { return };
    let (_, held) = up_f16(&be, &x, &[x.len()]);
    for (&v, &h) in x.iter().zip(&held) {
        assert_eq!(
            Format::F16.round(v).to_bits(),
            h.to_bits(),
            "{v}: host {}",
            Format::F16.round(v)
        );
    }
    println!(
        "  {} values: the host's f16 rounding is the device's",
        x.len()
    );
}
