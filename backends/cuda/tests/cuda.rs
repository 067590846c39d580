//! Conformance of the CUDA backend against the reference backend: one test per op family,
//! each running the op on both backends on fresh seeded random inputs (never zeros), CUDA
//! outputs NaN-poisoned before the op writes them, with a stated tolerance and its reason;
//! attention on every mask family; a whole drafter step (loss and every gradient).
//!
//! On a machine without CUDA every test prints `skipped: no CUDA device (<reason>)` and
//! passes; `create_backend_cuda_is_clean` then checks the registry returns `Unavailable`.
//!
//! Tolerances, by cause:
//! - exact: copies, gathers, f32 adds/scales (same single rounding on both sides);
//! - f32 vs f64 accumulation (norm, attention, loss statistics): ~1e-6 relative, stated as
//!   1e-5..1e-4 depending on the reduction length;
//! - bf16 GEMMs (the backend default): both operands rounded to 8 mantissa bits, each
//!   product term off by up to ~2^-8 relative (f32 accumulation): GEMM outputs ~4e-3 of
//!   `sum |a||b|`, everything downstream ~1e-2 (drafter gradients: rel-L2 5e-2);
//! - TF32 GEMMs: operands keep 10 mantissa bits, so each product term is off by up
//!   to ~2^-10 relative: GEMM outputs ~1e-3 of `sum |a||b|`, and everything downstream of a
//!   GEMM (loss, drafter gradients) ~1e-3..1e-2. Each such check also runs with exact-f32
//!   GEMMs at a tight tolerance, which shows the difference is operand rounding and nothing
//!   else. Tests that use a GEMM only incidentally pin TF32 (`common::cuda`).

mod common;

use std::sync::Arc;

use rand::Rng;

use common::*;
use dflash_backend_cuda::{CudaBackend, DType, GemmPrecision, key_query_runs};
use dflash_core::mask::BlockMask;
use dflash_core::registry::{BackendOptions, create_backend};
use dflash_core::{
    ActivationOps, AdamWParams, AttentionOps, Backend, BackendInfo, CollectiveOps, Communicator,
    EmbeddingOps, Error, GemmOps, LossOps, MemoryOps, NormOps, OptimizerOps, RopeOps, Tensor,
    Transpose,
};

// ---------------------------------------------------------------------------------------
// Availability and errors

#[test]
fn create_backend_cuda_is_clean() {
    dflash_backend_cuda::link();
    dflash_backend_reference::link();
    let opts = BackendOptions {
        attention: "cuda-simple".into(),
        threads: 0,
        device: 0,
    };
    match create_backend("cuda", &opts) {
        Ok(b) => {
            println!("cuda backend available: {}", b.device());
            assert!(b.device().starts_with("cuda:0 ("), "{}", b.device());
            assert_eq!(b.name(), "cuda");
            // A device that does not exist is Unavailable too, not a panic.
            let far = BackendOptions {
                device: 999,
                ..opts.clone()
            };
            match create_backend("cuda", &far) {
                Err(Error::Unavailable { reason, .. }) => println!("device 999: {reason}"),
                other => panic!(
                    "device 999 should be Unavailable, got {:?}",
                    other.map(|b| b.device())
                ),
            }
            // An unknown attention kernel lists the device and host kernels.
            let bad = BackendOptions {
                attention: "nope".into(),
                ..opts
            };
            let e = create_backend("cuda", &bad)
                .err()
                .expect("unknown kernel is an error");
            assert!(e.to_string().contains("cuda-simple"), "{e}");
            assert!(e.to_string().contains("cuda-flash"), "{e}");
        }
        Err(Error::Unavailable { name, reason }) => {
            assert_eq!(name, "cuda");
            println!(
                "skipped: no CUDA device ({reason}); create_backend(\"cuda\") returned a clean Unavailable error"
            );
        }
        Err(e) => panic!("expected a backend or Unavailable, got {e}"),
    }
}

/// Every kernel file compiles with NVRTC for compute_90 wherever NVRTC can be loaded (it
/// needs no GPU), and a broken source is a typed error carrying NVRTC's log.
#[test]
fn kernels_compile_with_nvrtc() {
    if unsafe { !dflash_backend_cuda::cudarc::nvrtc::sys::is_culib_present() } {
        println!(
            "skipped: no CUDA device (NVRTC library not found, so the kernels cannot be compiled here)"
        );
        return;
    }
    let flash = dflash_backend_cuda::kernels::FLASH_SOURCE;
    for (file, src) in dflash_backend_cuda::kernels::SOURCES
        .iter()
        .chain(std::iter::once(&flash))
    {
        let t = std::time::Instant::now();
        dflash_backend_cuda::kernels::compile(file, src, "compute_90")
            .unwrap_or_else(|e| panic!("{e}"));
        println!(
            "  {file:<22} compiles for compute_90 ({:.0} ms)",
            t.elapsed().as_secs_f64() * 1e3
        );
    }
    let e = dflash_backend_cuda::kernels::compile(
        "broken.cu",
        "extern \"C\" __global__ void f() { undefined_thing(); }",
        "compute_90",
    )
    .expect_err("a broken kernel must not compile");
    let msg = e.to_string();
    assert!(matches!(e, dflash_backend_cuda::CudaError::Compile { .. }));
    assert!(
        msg.contains("broken.cu") && msg.contains("undefined_thing"),
        "{msg}"
    );
}

#[test]
fn errors_name_op_shapes_and_device() {
    let Some(cu) = cuda() else { return };
    let a = up(&cu, &[0.5; 12], &[3, 4]);
    let b = up(&cu, &[0.5; 10], &[5, 2]);
    let e = cu
        .matmul(&a, Transpose::No, &b, Transpose::No)
        .err()
        .unwrap();
    let s = e.to_string();
    assert!(matches!(e, Error::Shape { .. }));
    for needle in ["matmul", "[3, 4]", "[5, 2]", "cuda:0"] {
        assert!(s.contains(needle), "{needle:?} missing from {s:?}");
    }
    let table = up(&cu, &[0.5; 8], &[4, 2]);
    let s = cu.embedding(&table, &[1, 7]).err().unwrap().to_string();
    for needle in ["embedding", "token id 7", "position 1", "V = 4", "cuda:0"] {
        assert!(s.contains(needle), "{needle:?} missing from {s:?}");
    }
    // A reference tensor given to the CUDA backend.
    let rf = reference();
    let host = up(&rf, &[0.5; 4], &[2, 2]);
    let e = cu.add(&host, &host).err().unwrap();
    assert!(matches!(e, Error::ForeignTensor { .. }), "{e}");
    assert!(e.to_string().contains("reference"), "{e}");
    let mut w = up(&cu, &[1.0; 4], &[4]);
    let e = cu
        .linear_cross_entropy(&a, &table, &[0, 1, 2], &[1.0, -1.0, 1.0], 1.0)
        .err()
        .unwrap();
    assert!(e.to_string().contains("must be (V, 4)"), "{e}");
    let e = cu
        .linear_cross_entropy(
            &a,
            &up(&cu, &[0.1; 8], &[2, 4]),
            &[0, 1, 2],
            &[1.0, -1.0, 1.0],
            1.0,
        )
        .err()
        .unwrap();
    assert!(e.to_string().contains("row 1: weight -1"), "{e}");
    let hp = AdamWParams {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
        step: 0,
    };
    let (g, mut m, mut v) = (
        up(&cu, &[0.1; 4], &[4]),
        cu.zeros(&[4]).unwrap(),
        cu.zeros(&[4]).unwrap(),
    );
    let e = cu
        .adamw_step(&mut w, &g, &mut m, &mut v, &hp)
        .err()
        .unwrap();
    assert!(e.to_string().contains("1-based"), "{e}");
    println!("  error messages name op, shapes and device: ok");
}

// ---------------------------------------------------------------------------------------
// Memory and elementwise

#[test]
fn memory_ops_match_reference() {
    let Some(cu) = cuda() else { return };
    let rf = reference();
    let mut r = rng(1);
    let (rows, cols) = (37, 29);
    let x = rand_vec(&mut r, rows * cols, 1.0);
    let y = rand_vec(&mut r, rows * cols, 1.0);
    let (xc, xr) = (up(&cu, &x, &[rows, cols]), up(&rf, &x, &[rows, cols]));
    let (yc, yr) = (up(&cu, &y, &[rows, cols]), up(&rf, &y, &[rows, cols]));
    check_exact("upload/download", &down(&cu, &xc), &x);
    let z = cu.zeros(&[5, 3]).unwrap();
    assert_eq!(z.dims(), &[5, 3]);
    check_exact("zeros", &down(&cu, &z), &[0.0; 15]);
    check_exact("copy", &down(&cu, &cu.copy(&xc).unwrap()), &x);
    for (s, l) in [(0, rows), (3, 10), (rows - 1, 1), (5, 0)] {
        check_exact(
            &format!("narrow_rows({s}, {l})"),
            &down(&cu, &cu.narrow_rows(&xc, s, l).unwrap()),
            &down(&rf, &rf.narrow_rows(&xr, s, l).unwrap()),
        );
    }
    let p3 = rand_vec(&mut r, 4 * cols, 1.0);
    let (p3c, p3r) = (up(&cu, &p3, &[4, cols]), up(&rf, &p3, &[4, cols]));
    let cr = cu.concat_rows(&[&xc, &p3c, &yc]).unwrap();
    assert_eq!(cr.dims(), &[2 * rows + 4, cols]);
    check_exact(
        "concat_rows",
        &down(&cu, &cr),
        &down(&rf, &rf.concat_rows(&[&xr, &p3r, &yr]).unwrap()),
    );
    let q = rand_vec(&mut r, rows * 7, 1.0);
    let (qc, qr) = (up(&cu, &q, &[rows, 7]), up(&rf, &q, &[rows, 7]));
    let cc = cu.concat_cols(&[&xc, &qc, &yc]).unwrap();
    assert_eq!(cc.dims(), &[rows, 2 * cols + 7]);
    check_exact(
        "concat_cols",
        &down(&cu, &cc),
        &down(&rf, &rf.concat_cols(&[&xr, &qr, &yr]).unwrap()),
    );
    check_exact(
        "add",
        &down(&cu, &cu.add(&xc, &yc).unwrap()),
        &down(&rf, &rf.add(&xr, &yr).unwrap()),
    );
    let (mut ac, mut ar) = (cu.copy(&xc).unwrap(), rf.copy(&xr).unwrap());
    cu.add_assign(&mut ac, &yc).unwrap();
    rf.add_assign(&mut ar, &yr).unwrap();
    check_exact("add_assign", &down(&cu, &ac), &down(&rf, &ar));
    cu.scale_assign(&mut ac, -0.37).unwrap();
    rf.scale_assign(&mut ar, -0.37).unwrap();
    check_exact("scale_assign", &down(&cu, &ac), &down(&rf, &ar));
    // Large enough for many reduction blocks.
    let big = rand_vec(&mut r, 3_000_017, 2.0);
    let (bc, br) = (up(&cu, &big, &[big.len()]), up(&rf, &big, &[big.len()]));
    let (sc, sr) = (cu.sum_squares(&bc).unwrap(), rf.sum_squares(&br).unwrap());
    check_scalar(
        "sum_squares (3M elements)",
        sc,
        sr,
        1e-10,
        "f64 sums in a different order",
    );
    assert_eq!(
        cu.sum_squares(&bc).unwrap().to_bits(),
        sc.to_bits(),
        "sum_squares is deterministic"
    );
    assert!(cu.all_finite(&bc).unwrap());
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut b2 = big.clone();
        b2[2_999_999] = bad;
        assert!(
            !cu.all_finite(&up(&cu, &b2, &[b2.len()])).unwrap(),
            "all_finite missed {bad}"
        );
    }
    println!("  all_finite detects NaN/+inf/-inf at the end of 3M elements: ok");
    // bf16 conversion (the future activation path): round to nearest even, exact back.
    let bf = cu.to_dtype(&xc, DType::Bf16).unwrap();
    let back = down(&cu, &bf);
    let want: Vec<f32> = x
        .iter()
        .map(|&v| half::bf16::from_f32(v).to_f32())
        .collect();
    check_exact("to_dtype f32 -> bf16 -> f32", &back, &want);
    let e = cu.add(&bf, &bf).err().unwrap();
    assert!(e.to_string().contains("bf16"), "{e}");
    // Shape errors match the reference's.
    let e1 = cu.narrow_rows(&xc, 30, 10).err().unwrap().to_string();
    let e2 = rf.narrow_rows(&xr, 30, 10).err().unwrap().to_string();
    assert_eq!(e1.replace("cuda:0", "cpu"), e2);
}

// ---------------------------------------------------------------------------------------
// GEMM

/// `op(a) (M, K) @ op(b) (K, N)` in f64, and `sum_k |a||b|` (the natural error scale).
fn naive_matmul(
    a: &[f32],
    ta: bool,
    b: &[f32],
    tb: bool,
    m: usize,
    k: usize,
    n: usize,
) -> (Vec<f64>, Vec<f64>) {
    let at = |i: usize, p: usize| if ta { a[p * m + i] } else { a[i * k + p] } as f64;
    let bt = |p: usize, j: usize| if tb { b[j * k + p] } else { b[p * n + j] } as f64;
    let mut c = vec![0.0; m * n];
    let mut s = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            for p in 0..k {
                c[i * n + j] += at(i, p) * bt(p, j);
                s[i * n + j] += (at(i, p) * bt(p, j)).abs();
            }
        }
    }
    (c, s)
}

fn gemm_check(name: &str, got: &[f32], want: &[f64], scale: &[f64], tol: f64) -> f64 {
    let mut worst: f64 = 0.0;
    for (i, ((&g, &w), &s)) in got.iter().zip(want).zip(scale).enumerate() {
        assert!(g.is_finite(), "{name}[{i}]: {g}");
        let r = (g as f64 - w).abs() / (s + 1e-30);
        worst = worst.max(r);
        assert!(
            r <= tol,
            "{name}[{i}]: got {g}, want {w}, err/sum|a||b| {r:.3e} > {tol:.0e}"
        );
    }
    worst
}

#[test]
fn gemm_ops_match_naive() {
    for (prec, tol, why) in [
        (
            GemmPrecision::Bf16,
            1e-2,
            "bf16 operands (RNE, rel <= 2^-9 each, so <= ~2^-8 per product) + f32 accumulation: \
             error <= ~3.9e-3 of sum|a||b|",
        ),
        (
            GemmPrecision::Tf32,
            4e-3,
            "TF32: 10-bit operand mantissas, error <= ~2^-9 of sum|a||b|",
        ),
        (
            GemmPrecision::Fp32,
            1e-5,
            "exact f32: accumulation rounding only (<= K * 2^-24)",
        ),
    ] {
        let Some(cu) = cuda_with(prec) else { return };
        println!(
            "GEMM precision {prec:?} (tolerance on |err| / sum_k |a_ik b_kj|: {tol:.0e}; {why})"
        );
        let mut r = rng(2);
        let mut worst = 0.0f64;
        for &(m, k, n) in &[
            (7, 5, 3),
            (33, 65, 17),
            (1, 9, 1),
            (130, 257, 67),
            (512, 128, 384),
        ] {
            for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
                let a = rand_vec(&mut r, m * k, 1.0);
                let b = rand_vec(&mut r, k * n, 1.0);
                let a_shape = if ta { [k, m] } else { [m, k] };
                let b_shape = if tb { [n, k] } else { [k, n] };
                let tr = |t: bool| if t { Transpose::Yes } else { Transpose::No };
                let c = cu
                    .matmul(
                        &up(&cu, &a, &a_shape),
                        tr(ta),
                        &up(&cu, &b, &b_shape),
                        tr(tb),
                    )
                    .unwrap();
                assert_eq!(c.dims(), &[m, n]);
                let (want, scale) = naive_matmul(&a, ta, &b, tb, m, k, n);
                worst = worst.max(gemm_check(
                    &format!("matmul {m}x{k}x{n} ta={ta} tb={tb}"),
                    &down(&cu, &c),
                    &want,
                    &scale,
                    tol,
                ));
                // matmul_acc with beta (and c read), same product
                for beta in [1.0f32, -0.5] {
                    let c0 = rand_vec(&mut r, m * n, 1.0);
                    let mut ct = up(&cu, &c0, &[m, n]);
                    cu.matmul_acc(
                        &mut ct,
                        &up(&cu, &a, &a_shape),
                        tr(ta),
                        &up(&cu, &b, &b_shape),
                        tr(tb),
                        beta,
                    )
                    .unwrap();
                    let w2: Vec<f64> = want
                        .iter()
                        .zip(&c0)
                        .map(|(p, &c)| beta as f64 * c as f64 + p)
                        .collect();
                    let s2: Vec<f64> = scale
                        .iter()
                        .zip(&c0)
                        .map(|(s, &c)| s + (beta as f64 * c as f64).abs())
                        .collect();
                    worst = worst.max(gemm_check(
                        &format!("matmul_acc beta={beta} {m}x{k}x{n}"),
                        &down(&cu, &ct),
                        &w2,
                        &s2,
                        tol,
                    ));
                }
            }
        }
        // beta = 0 must not read c (NaN there), leading dims fold into rows, linear = x w^T.
        let (m, k, n) = (9, 14, 6);
        let a = rand_vec(&mut r, m * k, 1.0);
        let b = rand_vec(&mut r, k * n, 1.0);
        let mut c = up(&cu, &vec![f32::NAN; m * n], &[m, n]);
        cu.matmul_acc(
            &mut c,
            &up(&cu, &a, &[m, k]),
            Transpose::No,
            &up(&cu, &b, &[k, n]),
            Transpose::No,
            0.0,
        )
        .unwrap();
        let (want, scale) = naive_matmul(&a, false, &b, false, m, k, n);
        worst = worst.max(gemm_check(
            "matmul_acc beta=0 over NaN",
            &down(&cu, &c),
            &want,
            &scale,
            tol,
        ));
        let x = rand_vec(&mut r, 2 * 3 * 8, 1.0);
        let w = rand_vec(&mut r, 5 * 8, 1.0);
        let y = cu
            .linear(&up(&cu, &x, &[2, 3, 8]), &up(&cu, &w, &[5, 8]))
            .unwrap();
        assert_eq!(y.dims(), &[6, 5]);
        let (want, scale) = naive_matmul(&x, false, &w, true, 6, 8, 5);
        worst = worst.max(gemm_check(
            "linear (2,3,8) x (5,8)^T",
            &down(&cu, &y),
            &want,
            &scale,
            tol,
        ));
        // K = 0: the product is empty.
        let e = cu
            .matmul(
                &up(&cu, &[], &[4, 0]),
                Transpose::No,
                &up(&cu, &[], &[0, 3]),
                Transpose::No,
            )
            .unwrap();
        check_exact("matmul with K = 0", &down(&cu, &e), &[0.0; 12]);
        // Plan cache: a repeated shape reuses its plan (no new entry) and the same algorithm,
        // so the result is bit-identical.
        let (m, k, n) = (130, 257, 67);
        let a = up(&cu, &rand_vec(&mut r, m * k, 1.0), &[m, k]);
        let b = up(&cu, &rand_vec(&mut r, k * n, 1.0), &[k, n]);
        let first = down(
            &cu,
            &cu.matmul(&a, Transpose::No, &b, Transpose::No).unwrap(),
        );
        let plans = cu.gemm_plans_cached();
        assert!(plans > 0, "no cuBLASLt plan cached");
        let again = down(
            &cu,
            &cu.matmul(&a, Transpose::No, &b, Transpose::No).unwrap(),
        );
        assert_eq!(
            cu.gemm_plans_cached(),
            plans,
            "a repeated shape built a new plan"
        );
        check_exact("matmul repeated (cached plan)", &again, &first);
        println!(
            "  GEMM {prec:?}: worst |err| / sum|a||b| = {worst:.2e} (tolerance {tol:.0e}); \
             {plans} plans cached, {} bf16 fallbacks to TF32",
            cu.gemm_bf16_fallbacks()
        );
        assert_eq!(
            cu.gemm_bf16_fallbacks(),
            0,
            "cuBLASLt found no bf16 algorithm for some shape (see the stderr line)"
        );
    }
}

// ---------------------------------------------------------------------------------------
// RMSNorm

#[test]
fn norm_ops_match_reference() {
    let Some(cu) = cuda() else { return };
    let rf = reference();
    let mut r = rng(3);
    // (rows, cols): odd widths, one wider than a block, the QK-norm shape (many short rows).
    for &(rows, c) in &[(13, 24), (64, 4096), (3000, 64), (5, 1000), (1, 7)] {
        let eps = 1e-6f32;
        let x = rand_vec(&mut r, rows * c, 2.0);
        let w: Vec<f32> = rand_vec(&mut r, c, 0.5).iter().map(|v| 1.0 + v).collect();
        let dy = rand_vec(&mut r, rows * c, 1.0);
        let (xc, wc, dyc) = (
            up(&cu, &x, &[rows, c]),
            up(&cu, &w, &[c]),
            up(&cu, &dy, &[rows, c]),
        );
        let (xr, wr, dyr) = (
            up(&rf, &x, &[rows, c]),
            up(&rf, &w, &[c]),
            up(&rf, &dy, &[rows, c]),
        );
        let (yc, rc) = cu.rms_norm(&xc, &wc, eps).unwrap();
        let (yr, rr) = rf.rms_norm(&xr, &wr, eps).unwrap();
        let why = "f32 row sums (up to C terms) vs f64";
        check(
            &format!("rms_norm y ({rows}x{c})"),
            &down(&cu, &yc),
            &down(&rf, &yr),
            1e-5,
            1e-6,
            why,
        );
        check(
            &format!("rms_norm rstd ({rows}x{c})"),
            &down(&cu, &rc),
            &down(&rf, &rr),
            1e-5,
            0.0,
            why,
        );
        let (dxc, dwc) = cu.rms_norm_backward(&dyc, &xc, &wc, &rc).unwrap();
        let (dxr, dwr) = rf.rms_norm_backward(&dyr, &xr, &wr, &rr).unwrap();
        check(
            &format!("rms_norm_backward dx ({rows}x{c})"),
            &down(&cu, &dxc),
            &down(&rf, &dxr),
            1e-4,
            1e-5,
            "f32 row dot + cancellation in dy*w - xhat*dot",
        );
        check(
            &format!("rms_norm_backward dw ({rows}x{c})"),
            &down(&cu, &dwc),
            &down(&rf, &dwr),
            1e-4,
            1e-5,
            "f32 column sums over R rows vs f64",
        );
    }
}

// ---------------------------------------------------------------------------------------
// RoPE

#[test]
fn rope_ops_match_reference() {
    let Some(cu) = cuda() else { return };
    let rf = reference();
    let mut r = rng(4);
    for &(t, heads, d, theta) in &[
        (11, 4, 8, 10_000.0f32),
        (300, 8, 128, 1_000_000.0),
        (40, 2, 64, 10_000.0),
        (17, 1, 256, 500_000.0),
    ] {
        // Positions up to ~8K (where an f32 angle would already be off by ~1e-3 rad).
        let positions: Vec<i32> = (0..t).map(|_| r.random_range(0..8192)).collect();
        let x = rand_vec(&mut r, t * heads * d, 1.0);
        let (xc, xr) = (up(&cu, &x, &[t, heads, d]), up(&rf, &x, &[t, heads, d]));
        let yc = cu.rope(&xc, &positions, theta).unwrap();
        let yr = rf.rope(&xr, &positions, theta).unwrap();
        check(
            &format!("rope ({t},{heads},{d}) theta {theta}"),
            &down(&cu, &yc),
            &down(&rf, &yr),
            1e-5,
            1e-6,
            "same f64 angles rounded to f32; FMA contraction",
        );
        let gc = cu.rope_backward(&xc, &positions, theta).unwrap();
        let gr = rf.rope_backward(&xr, &positions, theta).unwrap();
        check(
            &format!("rope_backward ({t},{heads},{d})"),
            &down(&cu, &gc),
            &down(&rf, &gr),
            1e-5,
            1e-6,
            "as rope",
        );
    }
    let e = cu
        .rope(&up(&cu, &[0.1; 12], &[2, 2, 3]), &[0, 1], 1e4)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("D even") && e.contains("cuda:0"), "{e}");
}

// ---------------------------------------------------------------------------------------
// SwiGLU

#[test]
fn activation_ops_match_reference() {
    let Some(cu) = cuda() else { return };
    let rf = reference();
    let mut r = rng(5);
    let (t, i) = (333, 257);
    let g = rand_vec(&mut r, t * i, 8.0); // deep into both tails of the sigmoid
    let u = rand_vec(&mut r, t * i, 2.0);
    let dh = rand_vec(&mut r, t * i, 1.0);
    let s = [t, i];
    let (gc, uc, dc) = (up(&cu, &g, &s), up(&cu, &u, &s), up(&cu, &dh, &s));
    let (gr, ur, dr) = (up(&rf, &g, &s), up(&rf, &u, &s), up(&rf, &dh, &s));
    let why = "f32 expf (<= 2 ulp) vs f64";
    check(
        "swiglu",
        &down(&cu, &cu.swiglu(&gc, &uc).unwrap()),
        &down(&rf, &rf.swiglu(&gr, &ur).unwrap()),
        1e-5,
        1e-7,
        why,
    );
    let (dgc, duc) = cu.swiglu_backward(&dc, &gc, &uc).unwrap();
    let (dgr, dur) = rf.swiglu_backward(&dr, &gr, &ur).unwrap();
    check(
        "swiglu_backward d_gate",
        &down(&cu, &dgc),
        &down(&rf, &dgr),
        1e-5,
        1e-7,
        why,
    );
    check(
        "swiglu_backward d_up",
        &down(&cu, &duc),
        &down(&rf, &dur),
        1e-5,
        1e-7,
        why,
    );
}

// ---------------------------------------------------------------------------------------
// Embedding

#[test]
fn embedding_ops_match_reference() {
    let Some(cu) = cuda() else { return };
    let rf = reference();
    let mut r = rng(6);
    let (v, h) = (1000, 96);
    let table = rand_vec(&mut r, v * h, 1.0);
    let ids: Vec<u32> = (0..517).map(|_| r.random_range(0..v as u32)).collect();
    let (tc, tr) = (up(&cu, &table, &[v, h]), up(&rf, &table, &[v, h]));
    let ec = cu.embedding(&tc, &ids).unwrap();
    assert_eq!(ec.dims(), &[ids.len(), h]);
    check_exact(
        "embedding gather",
        &down(&cu, &ec),
        &down(&rf, &rf.embedding(&tr, &ids).unwrap()),
    );
    let e1 = cu.embedding(&tc, &[3, 1000]).err().unwrap().to_string();
    let e2 = rf.embedding(&tr, &[3, 1000]).err().unwrap().to_string();
    assert_eq!(e1.replace("cuda:0", "cpu"), e2);
}

// ---------------------------------------------------------------------------------------
// Fused linear cross-entropy and argmax

/// `(argmax, top1 - top2)` of each row of `x @ w^T`, in f64.
fn margins(x: &[f32], w: &[f32], t: usize, h: usize, v: usize) -> Vec<(usize, f64)> {
    (0..t)
        .map(|i| {
            let (mut b1, mut i1, mut b2) = (f64::NEG_INFINITY, 0, f64::NEG_INFINITY);
            for j in 0..v {
                let z: f64 = (0..h)
                    .map(|c| x[i * h + c] as f64 * w[j * h + c] as f64)
                    .sum();
                if z > b1 {
                    b2 = b1;
                    b1 = z;
                    i1 = j;
                } else if z > b2 {
                    b2 = z;
                }
            }
            (i1, b1 - b2)
        })
        .collect()
}

#[test]
fn loss_ops_match_reference() {
    let rf = reference();
    for (prec, rtol_l, (rtol_dx, atol_dx), margin, why) in [
        (
            GemmPrecision::Bf16,
            5e-3,
            (5e-2, 2e-2),
            0.1,
            "bf16 logits/dx GEMM operands (~4e-3 relative per product, 8x TF32; TF32 measured \
             0.023 of (3e-2, 1e-2)); logit error <= 3.9e-3 * sum|x||w| ~ 0.05 here, so \
             top-2 margins below 0.1 may flip",
        ),
        (
            GemmPrecision::Tf32,
            2e-3,
            (3e-2, 1e-2),
            0.05,
            "TF32 logits/dx GEMMs (~1e-3 relative per product)",
        ),
        (
            GemmPrecision::Fp32,
            1e-6,
            (2e-4, 2e-5),
            1e-4,
            "f32 GEMMs and f32 softmax vs f64",
        ),
    ] {
        let Some(cu) = cuda_with(prec) else { return };
        println!("fused CE with {prec:?} GEMMs");
        let mut r = rng(7);
        // 2600 rows, ~70% active: more than one 1024-row chunk and a tail.
        let (t, h, v) = (2600, 64, 1200);
        let x = rand_vec(&mut r, t * h, 1.5);
        let w = rand_vec(&mut r, v * h, 0.5);
        let m = margins(&x, &w, t, h, v);
        let mut labels = Vec::new();
        let mut weights = Vec::new();
        for &(am, _) in &m {
            labels.push(if r.random_bool(0.4) {
                am as u32
            } else {
                r.random_range(0..v as u32)
            });
            weights.push(if r.random_bool(0.3) {
                0.0
            } else {
                r.random_range(0.1f32..1.0)
            });
        }
        let gs = 1.0 / 1234.5;
        let (xc, wc) = (up(&cu, &x, &[t, h]), up(&cu, &w, &[v, h]));
        let (xr, wr) = (up(&rf, &x, &[t, h]), up(&rf, &w, &[v, h]));
        let (sc, dxc) = cu
            .linear_cross_entropy(&xc, &wc, &labels, &weights, gs)
            .unwrap();
        let (sr, dxr) = rf
            .linear_cross_entropy(&xr, &wr, &labels, &weights, gs)
            .unwrap();
        check_scalar(
            "CE weighted_loss",
            sc.weighted_loss,
            sr.weighted_loss,
            rtol_l,
            why,
        );
        check_scalar(
            "CE weight_sum",
            sc.weight_sum,
            sr.weight_sum,
            1e-12,
            "same f32 weights summed in f64, same order",
        );
        assert_eq!(sc.counted, sr.counted);
        let near_ties = (0..t)
            .filter(|&i| weights[i] > 0.0 && m[i].1 < margin)
            .count() as i64;
        let dc = sc.correct as i64 - sr.correct as i64;
        println!(
            "  CE correct {} vs {} (rows with top-2 margin < {margin}: {near_ties})",
            sc.correct, sr.correct
        );
        assert!(
            dc.abs() <= near_ties,
            "correct differs by {dc} with only {near_ties} near ties"
        );
        let dxh = down(&cu, &dxc);
        check("CE dx", &dxh, &down(&rf, &dxr), rtol_dx, atol_dx, why);
        for i in 0..t {
            if weights[i] == 0.0 {
                assert!(
                    dxh[i * h..(i + 1) * h].iter().all(|&d| d == 0.0),
                    "skipped row {i} has nonzero dx"
                );
            }
        }
        // Loss only (grad_scale 0): same stats, dx exactly zero.
        let (s0, dx0) = cu
            .linear_cross_entropy(&xc, &wc, &labels, &weights, 0.0)
            .unwrap();
        assert_eq!(
            s0.weighted_loss.to_bits(),
            sc.weighted_loss.to_bits(),
            "stats do not depend on grad_scale"
        );
        assert!(down(&cu, &dx0).iter().all(|&d| d == 0.0));
        // Nothing supervised.
        let (se, dxe) = cu
            .linear_cross_entropy(&xc, &wc, &labels, &vec![0.0; t], 1.0)
            .unwrap();
        assert_eq!((se.counted, se.weight_sum), (0, 0.0));
        assert!(down(&cu, &dxe).iter().all(|&d| d == 0.0));
        // Greedy argmax.
        let ac = cu.linear_argmax(&xc, &wc).unwrap();
        let ar = rf.linear_argmax(&xr, &wr).unwrap();
        let diff: Vec<usize> = (0..t).filter(|&i| ac[i] != ar[i]).collect();
        for &i in &diff {
            assert!(
                m[i].1 < margin,
                "argmax row {i}: {} vs {} with margin {}",
                ac[i],
                ar[i],
                m[i].1
            );
        }
        println!(
            "  linear_argmax: {} of {t} rows differ, all within top-2 margin < {margin}",
            diff.len()
        );
    }
}

// ---------------------------------------------------------------------------------------
// AdamW

#[test]
fn optimizer_ops_match_reference() {
    let Some(cu) = cuda() else { return };
    let rf = reference();
    let mut r = rng(8);
    let n = 100_003;
    let p0 = rand_vec(&mut r, n, 1.0);
    let (mut pc, mut mc, mut vc) = (
        up(&cu, &p0, &[n]),
        cu.zeros(&[n]).unwrap(),
        cu.zeros(&[n]).unwrap(),
    );
    let (mut pr, mut mr, mut vr) = (
        up(&rf, &p0, &[n]),
        rf.zeros(&[n]).unwrap(),
        rf.zeros(&[n]).unwrap(),
    );
    for step in 1..=5u64 {
        let g = rand_vec(&mut r, n, 0.1);
        let hp = AdamWParams {
            lr: 6e-4,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
            step,
        };
        cu.adamw_step(&mut pc, &up(&cu, &g, &[n]), &mut mc, &mut vc, &hp)
            .unwrap();
        rf.adamw_step(&mut pr, &up(&rf, &g, &[n]), &mut mr, &mut vr, &hp)
            .unwrap();
    }
    let why = "same f64 per-element formula, one f32 rounding per state";
    check(
        "adamw param after 5 steps",
        &down(&cu, &pc),
        &down(&rf, &pr),
        1e-7,
        0.0,
        why,
    );
    check("adamw m", &down(&cu, &mc), &down(&rf, &mr), 1e-7, 0.0, why);
    check("adamw v", &down(&cu, &vc), &down(&rf, &vr), 1e-7, 0.0, why);
}

// ---------------------------------------------------------------------------------------
// Collectives

/// Rank 0 of a pretend world of 3 whose other ranks hold fixed buffers.
struct FakeWorld(Vec<Vec<f32>>);
impl Communicator for FakeWorld {
    fn rank(&self) -> usize {
        0
    }
    fn world_size(&self) -> usize {
        self.0.len() + 1
    }
    fn all_reduce_sum(&self, data: &mut [f32]) -> std::result::Result<(), String> {
        for other in &self.0 {
            if other.len() != data.len() {
                return Err(format!("length {} vs {}", other.len(), data.len()));
            }
            for (d, o) in data.iter_mut().zip(other) {
                *d += o;
            }
        }
        Ok(())
    }
}

#[test]
fn collective_ops_match_reference() {
    let Some(cu) = cuda() else { return };
    let rf = reference();
    let mut r = rng(9);
    let n = 4099;
    let x = rand_vec(&mut r, n, 1.0);
    let world = FakeWorld(vec![rand_vec(&mut r, n, 1.0), rand_vec(&mut r, n, 1.0)]);
    let (mut xc, mut xr) = (up(&cu, &x, &[n]), up(&rf, &x, &[n]));
    cu.all_reduce_sum(&mut xc, &world).unwrap();
    rf.all_reduce_sum(&mut xr, &world).unwrap();
    check_exact(
        "all_reduce_sum (host path)",
        &down(&cu, &xc),
        &down(&rf, &xr),
    );
    let bad = FakeWorld(vec![vec![0.0; 3]]);
    let e = cu.all_reduce_sum(&mut xc, &bad).err().unwrap().to_string();
    assert!(
        e.contains("communicator failed") && e.contains("cuda:0"),
        "{e}"
    );
}

// ---------------------------------------------------------------------------------------
// Attention

fn attention_case(
    cu: &CudaBackend,
    name: &str,
    mask: &BlockMask,
    hq: usize,
    hkv: usize,
    d: usize,
    seed: u64,
) {
    let rf = reference();
    let mut r = rng(seed);
    let (tq, tk) = (mask.q_len(), mask.kv_len());
    let q = rand_vec(&mut r, tq * hq * d, 2.0);
    let k = rand_vec(&mut r, tk * hkv * d, 2.0);
    let v = rand_vec(&mut r, tk * hkv * d, 1.0);
    let d_out = rand_vec(&mut r, tq * hq * d, 1.0);
    let scale = (d as f32).powf(-0.5);
    let (qs, ks) = ([tq, hq, d], [tk, hkv, d]);
    let (qc, kc, vc, dc) = (
        up(cu, &q, &qs),
        up(cu, &k, &ks),
        up(cu, &v, &ks),
        up(cu, &d_out, &qs),
    );
    let (qr, kr, vr, dr) = (
        up(&rf, &q, &qs),
        up(&rf, &k, &ks),
        up(&rf, &v, &ks),
        up(&rf, &d_out, &qs),
    );
    let (oc, lc) = cu.attention(&qc, &kc, &vc, mask, scale).unwrap();
    let (or, lr) = rf.attention(&qr, &kr, &vr, mask, scale).unwrap();
    let why = "f32 online softmax vs f64";
    let tag = format!("{name} Hq{hq}/Hkv{hkv} D{d}");
    check(
        &format!("attn out  {tag}"),
        &down(cu, &oc),
        &down(&rf, &or),
        1e-4,
        2e-5,
        why,
    );
    check(
        &format!("attn lse  {tag}"),
        &down(cu, &lc),
        &down(&rf, &lr),
        1e-5,
        1e-6,
        why,
    );
    let (gq, gk, gv) = cu
        .attention_backward(&qc, &kc, &vc, &oc, &lc, &dc, mask, scale)
        .unwrap();
    let (wq, wk, wv) = rf
        .attention_backward(&qr, &kr, &vr, &or, &lr, &dr, mask, scale)
        .unwrap();
    let why = "f32 sums over visible pairs vs f64";
    check(
        &format!("attn dq   {tag}"),
        &down(cu, &gq),
        &down(&rf, &wq),
        2e-4,
        5e-5,
        why,
    );
    check(
        &format!("attn dk   {tag}"),
        &down(cu, &gk),
        &down(&rf, &wk),
        2e-4,
        5e-5,
        why,
    );
    check(
        &format!("attn dv   {tag}"),
        &down(cu, &gv),
        &down(&rf, &wv),
        2e-4,
        5e-5,
        why,
    );
}

/// The backward's key -> query-run index (built on the host) against the dense mask, on
/// every mask family. Needs no GPU.
#[test]
fn key_query_runs_match_dense_mask() {
    let masks = [
        BlockMask::dflash(20, 4, &[2, 3, 9, 15, -1]).unwrap(),
        BlockMask::dflash(20, 4, &[-1, 0, 3, 3, 19]).unwrap(),
        BlockMask::dflash_sliding(40, 4, &[3, 9, 10, 30, -1], 7).unwrap(),
        BlockMask::causal(33).unwrap(),
        BlockMask::document(&[10, 1, 17, 9]).unwrap(),
        BlockMask::sliding_window(50, 8).unwrap(),
    ];
    for m in &masks {
        let (off, rs, re) = key_query_runs(m);
        let dense = m.to_dense_oracle();
        assert_eq!(off.len(), m.kv_len() + 1);
        for j in 0..m.kv_len() {
            let mut from_runs = vec![false; m.q_len()];
            let mut last_end = -1;
            for r in off[j] as usize..off[j + 1] as usize {
                assert!(
                    rs[r] < re[r] && rs[r] > last_end,
                    "runs of key {j} are maximal and ascending"
                );
                last_end = re[r];
                for i in rs[r]..re[r] {
                    from_runs[i as usize] = true;
                }
            }
            let col: Vec<bool> = (0..m.q_len()).map(|i| dense[i][j]).collect();
            assert_eq!(from_runs, col, "key {j}");
        }
    }
    println!(
        "  key -> query runs match the dense masks of {} mask families",
        masks.len()
    );
}

#[test]
fn attention_ops_match_reference() {
    let Some(cu) = cuda() else { return };
    let s = 40;
    // DFlash: overlapping anchors (5, 6), one block past the end, padding blocks.
    let dflash = BlockMask::dflash(s, 4, &[1, 5, 6, 20, 37, -1, -1]).unwrap();
    let sliding_dflash = BlockMask::dflash_sliding(s, 4, &[3, 9, 10, 30, -1], 7).unwrap();
    let causal = BlockMask::causal(45).unwrap();
    let document = BlockMask::document(&[10, 1, 17, 9]).unwrap();
    let sliding = BlockMask::sliding_window(50, 8).unwrap();
    let mut seed = 100;
    for &(hq, hkv, d) in &[(4, 2, 64), (8, 2, 128), (2, 1, 256), (3, 3, 8), (4, 1, 40)] {
        for (name, mask) in [
            ("dflash", &dflash),
            ("dflash_sliding", &sliding_dflash),
            ("causal", &causal),
            ("document", &document),
            ("sliding", &sliding),
        ] {
            seed += 1;
            attention_case(&cu, name, mask, hq, hkv, d, seed);
        }
    }
    // A bigger DFlash case: 512 context rows, 48 blocks of 16 (two overlapping, two padding).
    let mut anchors: Vec<i32> = (0..46).map(|i| 10 + i * 10).collect();
    anchors[1] = anchors[0] + 3;
    anchors.extend([-1, -1]);
    let big = BlockMask::dflash(512, 16, &anchors).unwrap();
    attention_case(&cu, "dflash S512 N48 bs16", &big, 8, 2, 128, 7);
    // head_dim above the kernel's limit is a clean error.
    let q = up(&cu, &vec![0.1; 2 * 288], &[2, 1, 288]);
    let m2 = BlockMask::causal(2).unwrap();
    let e = cu
        .attention(&q, &q, &q, &m2, 1.0)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("head_dim 288") && e.contains("cuda-simple"),
        "{e}"
    );
    // A host kernel by name runs through a host round trip and agrees too.
    let host = CudaBackend::with_options(
        &BackendOptions {
            attention: "reference".into(),
            threads: 0,
            device: 0,
        },
        dflash_backend_cuda::CudaOptions {
            gemm: GemmPrecision::Tf32,
            poison: true,
        },
    )
    .unwrap();
    assert_eq!(host.attention_kernel(), "reference");
    attention_case(&host, "dflash via host 'reference'", &dflash, 4, 2, 64, 5);
}

// ---------------------------------------------------------------------------------------
// Attention, "cuda-flash" (bf16 tensor-core kernel)
//
// Tolerances. The kernel rounds q/k/v/d_out to bf16 (8 significant bits: relative rounding
// error <= 2^-9 ~ 2e-3), multiplies in bf16 with f32 accumulation, rounds P and dS to bf16
// for the second products and writes out/dq/dk/dv in bf16. Two comparisons per case:
// 1. against the reference run on the *same bf16-rounded inputs* (the kernel's own error,
//    as the kernel lab measured it against fp64: rel-L2 worst 2.3e-3 (out) and 2.6e-3
//    (dq/dk/dv), lse max-abs 1.2e-5): rel-L2 1e-2 for out/dq/dk/dv (about 4x the measured
//    worst), lse |err| <= 2e-3 * max(1, |lse|) (lse is an f32 log-sum-exp of exact bf16
//    products; 2e-3 is the lab's bound, ~100x its measurement);
// 2. against the reference on the original f32 inputs (what a caller sees): input rounding
//    perturbs each score by ~scale * sum_d |q_d k_d| * 2^-9 * sqrt(2/3) (std ~1.6e-3 here;
//    worst case ~6e-2 at D 256 for one key), so rel-L2 2e-2 for out/dq/dk/dv and
//    lse |err| <= 2e-2 * max(1, |lse|) (rows seeing a single key carry that key's score
//    error undiluted).

fn round_vec(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| bf16_round(v)).collect()
}

#[allow(clippy::too_many_arguments)]
fn flash_case(
    cu: &CudaBackend,
    name: &str,
    mask: &BlockMask,
    hq: usize,
    hkv: usize,
    d: usize,
    seed: u64,
) {
    let rf = reference();
    let mut r = rng(seed);
    let (tq, tk) = (mask.q_len(), mask.kv_len());
    let q = rand_vec(&mut r, tq * hq * d, 2.0);
    let k = rand_vec(&mut r, tk * hkv * d, 2.0);
    let v = rand_vec(&mut r, tk * hkv * d, 1.0);
    let d_out = rand_vec(&mut r, tq * hq * d, 1.0);
    let scale = (d as f32).powf(-0.5);
    let (qs, ks) = ([tq, hq, d], [tk, hkv, d]);
    let (qc, kc, vc, dc) = (
        up(cu, &q, &qs),
        up(cu, &k, &ks),
        up(cu, &v, &ks),
        up(cu, &d_out, &qs),
    );
    let (oc, lc) = cu.attention(&qc, &kc, &vc, mask, scale).unwrap();
    let (gq, gk, gv) = cu
        .attention_backward(&qc, &kc, &vc, &oc, &lc, &dc, mask, scale)
        .unwrap();
    let got = [
        down(cu, &oc),
        down(cu, &lc),
        down(cu, &gq),
        down(cu, &gk),
        down(cu, &gv),
    ];
    let tag = format!("{name} Hq{hq}/Hkv{hkv} D{d}");
    for (rounded, (tol_rel, tol_lse, why)) in [
        (
            true,
            (1e-2, 2e-3, "bf16 kernel vs f64 on the same bf16 inputs"),
        ),
        (
            false,
            (
                2e-2,
                2e-2,
                "bf16 kernel (inputs rounded) vs f64 on f32 inputs",
            ),
        ),
    ] {
        let rd = |x: &Vec<f32>| if rounded { round_vec(x) } else { x.clone() };
        let (qr, kr, vr, dr) = (
            up(&rf, &rd(&q), &qs),
            up(&rf, &rd(&k), &ks),
            up(&rf, &rd(&v), &ks),
            up(&rf, &rd(&d_out), &qs),
        );
        let (or, lr) = rf.attention(&qr, &kr, &vr, mask, scale).unwrap();
        let (wq, wk, wv) = rf
            .attention_backward(&qr, &kr, &vr, &or, &lr, &dr, mask, scale)
            .unwrap();
        let which = if rounded { "bf16 in" } else { "f32 in " };
        check_rel_l2(
            &format!("flash out {which} {tag}"),
            &got[0],
            &down(&rf, &or),
            tol_rel,
            why,
        );
        check_abs_scaled(
            &format!("flash lse {which} {tag}"),
            &got[1],
            &down(&rf, &lr),
            tol_lse,
            why,
        );
        for (i, (g, w)) in [("dq", &wq), ("dk", &wk), ("dv", &wv)].iter().enumerate() {
            check_rel_l2(
                &format!("flash {g}  {which} {tag}"),
                &got[2 + i],
                &down(&rf, w),
                tol_rel,
                why,
            );
        }
    }
    // Rows that see no key: out exactly 0 (the reference's convention too).
    let dense = mask.to_dense_oracle();
    for (i, row) in dense.iter().enumerate() {
        if !row.iter().any(|&b| b) {
            let o = &got[0][i * hq * d..(i + 1) * hq * d];
            assert!(
                o.iter().all(|&x| x == 0.0),
                "{tag}: row {i} sees no key but out != 0"
            );
        }
    }
}

#[test]
fn attention_cuda_flash_matches_reference() {
    let Some(cu) = cuda_attn("cuda-flash", GemmPrecision::Tf32) else {
        return;
    };
    assert_eq!(cu.attention_kernel(), "cuda-flash");
    // The same masks as the cuda-simple conformance test.
    let s = 40;
    let dflash = BlockMask::dflash(s, 4, &[1, 5, 6, 20, 37, -1, -1]).unwrap();
    let sliding_dflash = BlockMask::dflash_sliding(s, 4, &[3, 9, 10, 30, -1], 7).unwrap();
    let causal = BlockMask::causal(45).unwrap();
    let document = BlockMask::document(&[10, 1, 17, 9]).unwrap();
    let sliding = BlockMask::sliding_window(50, 8).unwrap();
    let mut seed = 300;
    for &(hq, hkv, d) in &[
        (4, 2, 64),
        (4, 1, 64),
        (8, 2, 128),
        (3, 3, 128),
        (2, 1, 256),
        (4, 2, 256),
    ] {
        for (name, mask) in [
            ("dflash", &dflash),
            ("dflash_sliding", &sliding_dflash),
            ("causal", &causal),
            ("document", &document),
            ("sliding", &sliding),
        ] {
            seed += 1;
            flash_case(&cu, name, mask, hq, hkv, d, seed);
        }
    }
    // Bigger cases spanning several 128-row query tiles and key tiles: DFlash with 512
    // context rows and 48 blocks of 16 (two overlapping, two padding), and a long causal mask.
    let mut anchors: Vec<i32> = (0..46).map(|i| 10 + i * 10).collect();
    anchors[1] = anchors[0] + 3;
    anchors.extend([-1, -1]);
    let big = BlockMask::dflash(512, 16, &anchors).unwrap();
    let causal_big = BlockMask::causal(300).unwrap();
    for &(hq, hkv, d) in &[(4, 1, 64), (8, 2, 128), (2, 1, 256)] {
        seed += 1;
        flash_case(&cu, "dflash S512 N48 bs16", &big, hq, hkv, d, seed);
        seed += 1;
        flash_case(&cu, "causal 300", &causal_big, hq, hkv, d, seed);
    }
    // Head dims other than 64/128/256 are a clean error naming the supported set.
    for bad_d in [40usize, 288] {
        let q = up(&cu, &vec![0.1; 2 * bad_d], &[2, 1, bad_d]);
        let m2 = BlockMask::causal(2).unwrap();
        let e = cu
            .attention(&q, &q, &q, &m2, 1.0)
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains(&format!("head_dim {bad_d}"))
                && e.contains("64, 128, 256")
                && e.contains("cuda-flash"),
            "{e}"
        );
        let e = cu
            .attention_backward(&q, &q, &q, &q, &up(&cu, &[0.0; 2], &[2, 1]), &q, &m2, 1.0)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains(&format!("head_dim {bad_d}")), "{e}");
    }
    println!("  unsupported head dims: clean errors");
}

// ---------------------------------------------------------------------------------------
// A whole drafter step

mod drafter {
    use super::*;
    use dflash_config::{DrafterConfig, DrafterShape, LayerType, Qwen3Config};
    use dflash_data::{block_targets, default_gamma};
    use dflash_models::drafter::{FrozenTarget, normal_vec};
    use dflash_models::{DraftInput, Drafter, DrafterParams};
    use rand::Rng;

    pub struct Problem {
        pub cfg: DrafterConfig,
        pub host_params: Vec<(String, Vec<usize>, Vec<f32>)>,
        pub embed: Vec<f32>,
        pub lm_head: Vec<f32>,
        pub v: usize,
        pub h: usize,
        pub features: Vec<f32>,
        pub anchors: Vec<i32>,
        pub ids: Vec<u32>,
        pub loss_mask: Vec<u8>,
    }

    fn target_cfg(v: usize, h: usize) -> Qwen3Config {
        let json = format!(
            r#"{{"model_type": "qwen3", "vocab_size": {v}, "hidden_size": {h},
                "intermediate_size": {i}, "num_hidden_layers": 4, "num_attention_heads": 4,
                "num_key_value_heads": 2, "head_dim": {hd}, "rms_norm_eps": 1e-6,
                "rope_theta": 10000.0, "max_position_embeddings": 4096,
                "tie_word_embeddings": false, "torch_dtype": "float32"}}"#,
            i = 2 * h,
            hd = h / 4
        );
        Qwen3Config::from_json_str(&json, "test").expect("tiny target config")
    }

    /// `small = false`: the tiny drafter of the models tests (H 16, 2 layers, 4/2 heads of 8,
    /// V 40, block 4, S 11, anchors [2, 3, 9, -1]). `small = true`: H 128, heads 4/2 of 64,
    /// 3 layers (the middle one sliding, window 24), V 500, block 16, S 160, 10 blocks.
    pub fn problem(small: bool, seed: u64) -> Problem {
        let (h, v, bs, s, layers, hd) = if small {
            (128, 500, 16, 160, 3, 64)
        } else {
            (16, 40, 4, 11, 2, 8)
        };
        let mask_id = (v - 1) as u32;
        let mut shape = DrafterShape::standard(mask_id);
        shape.num_layers = layers;
        shape.block_size = bs;
        shape.num_target_features = 2;
        shape.target_layer_ids = Some(vec![1, 3]);
        shape.intermediate_size = Some(if small { 256 } else { 24 });
        shape.num_attention_heads = Some(4);
        shape.num_key_value_heads = Some(2);
        shape.head_dim = Some(hd);
        shape.dtype = dflash_config::DType::Float32;
        if small {
            shape.layer_types = Some(vec![
                LayerType::FullAttention,
                LayerType::SlidingAttention,
                LayerType::FullAttention,
            ]);
            shape.sliding_window = Some(24);
        }
        let cfg = DrafterConfig::for_target(&target_cfg(v, h), &shape).expect("drafter config");
        let rf = reference();
        let params = DrafterParams::init_random(&rf, &cfg, 0.2, seed).unwrap();
        let mut r = rng(seed ^ 0x5eed);
        let host_params = DrafterParams::layout(&cfg)
            .into_iter()
            .zip(params.tensors())
            .map(|((name, shape), t)| {
                let mut w = down(&rf, t);
                if name.ends_with("norm.weight") {
                    // Non-unit norm weights so gradient bugs they would hide show.
                    w = normal_vec(&mut r, w.len(), 0.2)
                        .iter()
                        .map(|x| 1.0 + x)
                        .collect();
                }
                (name, shape, w)
            })
            .collect();
        let embed = normal_vec(&mut r, v * h, 1.0);
        let lm_head = normal_vec(&mut r, v * h, 0.5);
        let ids: Vec<u32> = (0..s).map(|_| r.random_range(0..mask_id)).collect();
        let mut loss_mask = vec![1u8; s];
        loss_mask[0] = 0;
        loss_mask[1] = 0;
        loss_mask[5] = 0;
        let features = normal_vec(&mut r, s * 2 * h, 1.0);
        let anchors = if small {
            vec![2, 5, 30, 31, 70, 100, 150, 155, -1, -1] // overlapping, past the end, padding
        } else {
            vec![2, 3, 9, -1]
        };
        Problem {
            cfg,
            host_params,
            embed,
            lm_head,
            v,
            h,
            features,
            anchors,
            ids,
            loss_mask,
        }
    }

    pub struct Run {
        pub loss: f64,
        pub weight_sum: f64,
        pub correct: u64,
        pub counted: u64,
        pub loss_only: f64,
        pub predict: Vec<u32>,
        pub grads: Vec<(String, Vec<f32>)>,
    }

    pub fn run(b: Arc<dyn Backend>, p: &Problem, recompute: bool) -> Run {
        let params = DrafterParams::from_tensors(
            p.host_params
                .iter()
                .map(|(_, shape, w)| b.upload(w, shape).unwrap())
                .collect(),
        );
        let frozen = Arc::new(FrozenTarget {
            embed: b.upload(&p.embed, &[p.v, p.h]).unwrap(),
            lm_head: b.upload(&p.lm_head, &[p.v, p.h]).unwrap(),
        });
        let bs = p.cfg.block_size;
        let bt = block_targets(
            &p.ids,
            &p.loss_mask,
            &p.anchors,
            bs,
            default_gamma(bs),
            p.cfg.mask_token_id,
        );
        let inp = DraftInput {
            features: &p.features,
            anchors: &p.anchors,
            block_ids: &bt.block_ids,
            positions: &bt.positions,
            labels: &bt.labels,
            weights: &bt.weights,
        };
        let drafter = Drafter::new(b.clone(), p.cfg.clone(), params, frozen).unwrap();
        let mut g = DrafterParams::zeros(b.as_ref(), &p.cfg).unwrap();
        let stats = drafter
            .forward_backward(&inp, 1.0 / 3.0, &mut g, recompute)
            .unwrap();
        let loss_only = drafter.loss(&inp).unwrap().weighted_loss;
        let predict = drafter.predict(&inp).unwrap();
        let grads = DrafterParams::layout(&p.cfg)
            .into_iter()
            .zip(g.tensors())
            .map(|((name, _), t)| (name, b.download(t).unwrap()))
            .collect();
        Run {
            loss: stats.weighted_loss,
            weight_sum: stats.weight_sum,
            correct: stats.correct,
            counted: stats.counted,
            loss_only,
            predict,
            grads,
        }
    }
}

#[test]
fn drafter_step_matches_reference() {
    dflash_backend_reference::link();
    if cuda().is_none() {
        return;
    }
    let reference: Arc<dyn Backend> = Arc::new(reference());
    for small in [false, true] {
        let p = drafter::problem(small, 11);
        let want = drafter::run(reference.clone(), &p, false);
        assert!(want.counted > 0 && want.loss > 0.0);
        for t in DRAFTER_TOLS {
            let (prec, why) = (t.prec, t.why);
            let Some(cu) = cuda_with(prec) else { return };
            let cu: Arc<dyn Backend> = Arc::new(cu);
            for recompute in [false, true] {
                let got = drafter::run(cu.clone(), &p, recompute);
                let which = format!(
                    "{} drafter, {prec:?}, recompute={recompute}",
                    if small { "small" } else { "tiny" }
                );
                println!("{which}");
                check_scalar("  loss sum(w*CE)", got.loss, want.loss, t.loss_rtol, why);
                check_scalar(
                    "  loss only (grad_scale 0)",
                    got.loss_only,
                    want.loss,
                    t.loss_rtol,
                    why,
                );
                check_scalar(
                    "  weight_sum",
                    got.weight_sum,
                    want.weight_sum,
                    1e-12,
                    "same weights",
                );
                assert_eq!(got.counted, want.counted);
                let slack = 1 + want.counted / t.correct_slack_div;
                assert!(
                    got.correct.abs_diff(want.correct) <= slack,
                    "correct {} vs {}",
                    got.correct,
                    want.correct
                );
                let same = got
                    .predict
                    .iter()
                    .zip(&want.predict)
                    .filter(|(a, b)| a == b)
                    .count();
                println!(
                    "    predict: {same} of {} slots equal; correct {} vs {}",
                    want.predict.len(),
                    got.correct,
                    want.correct
                );
                assert!(
                    same * 100 >= want.predict.len() * t.same_pct,
                    "predictions differ too often"
                );
                for ((name, g), (_, w)) in got.grads.iter().zip(&want.grads) {
                    if let Some(l2) = t.rel_l2 {
                        check_rel_l2(&format!("  d {name}"), g, w, l2, why);
                    }
                    check(&format!("  d {name}"), g, w, t.rtol, t.atol, why);
                }
            }
        }
    }
}

/// Tolerances of one GEMM precision in the whole-drafter-step test.
struct DrafterTol {
    prec: GemmPrecision,
    /// Per element: `|err| <= rtol * |want| + atol * max|want|`.
    rtol: f64,
    atol: f64,
    /// Per tensor relative L2 bound (the precision check where per-element bounds are loose).
    rel_l2: Option<f64>,
    loss_rtol: f64,
    /// `correct` may differ by `1 + counted / correct_slack_div`.
    correct_slack_div: u64,
    /// Percentage of equal greedy predictions required.
    same_pct: usize,
    why: &'static str,
}

/// bf16: 8x TF32's unit roundoff (2^-8 vs 2^-11 per operand), and every GEMM of the step
/// (forward, both backward products, the fused CE) is affected, like the bf16 flash attention
/// test (~3e-3 rel-L2 per op, rel-L2 3e-2 over a step) but on every projection: rel-L2 5e-2
/// per gradient tensor (each bf16 GEMM output is ~2e-3..4e-3 rel-L2; ~20 GEMMs on a gradient's
/// path compound to ~1e-2..2e-2). Per element the all-TF32 run reaches 5.5e-3 of max|want|;
/// 8x that is ~4.4e-2, so atol 1e-1 of max (rtol 2e-1) catches only gross local errors. Loss
/// rel 1e-2 (TF32 measured 8.9e-5; 8x is ~7e-4); predictions >= 90% equal, like the flash
/// attention step.
const DRAFTER_TOLS: [DrafterTol; 3] = [
    DrafterTol {
        prec: GemmPrecision::Bf16,
        rtol: 2e-1,
        atol: 1e-1,
        rel_l2: Some(5e-2),
        loss_rtol: 1e-2,
        correct_slack_div: 20,
        same_pct: 90,
        why: "bf16 GEMM operands through every layer (~4e-3 per product, compounding)",
    },
    DrafterTol {
        prec: GemmPrecision::Tf32,
        rtol: 3e-2,
        atol: 1e-2,
        rel_l2: None,
        loss_rtol: 5e-3,
        correct_slack_div: 50,
        same_pct: 95,
        why: "TF32 GEMMs through every layer (~1e-3 per GEMM, compounding)",
    },
    DrafterTol {
        prec: GemmPrecision::Fp32,
        rtol: 1e-3,
        atol: 1e-4,
        rel_l2: None,
        loss_rtol: 1e-5,
        correct_slack_div: u64::MAX,
        same_pct: 95,
        why: "f32 kernels vs f64 reference reductions",
    },
];

/// A whole drafter step (small config: head_dim 64, a sliding layer, overlapping and padding
/// blocks) with `"cuda-flash"` attention and exact-f32 GEMMs, so the bf16 attention is the
/// only low-precision part. Tolerances: each attention op is ~3e-3 relative (rel-L2, see the
/// flash attention tests), compounding through 3 layers forward and backward: gradients
/// rel-L2 3e-2 per tensor; per element rtol 1e-1, atol 5e-2 of the tensor's max (bf16 has 4x
/// TF32's unit roundoff; the all-TF32 run reaches ~4.5e-3 of max per element, so ~2e-2 is
/// expected here); loss rel 1e-2; >= 90% equal predictions.
#[test]
fn drafter_step_with_cuda_flash_matches_reference() {
    dflash_backend_reference::link();
    let Some(cu) = cuda_attn("cuda-flash", GemmPrecision::Fp32) else {
        return;
    };
    let cu: Arc<dyn Backend> = Arc::new(cu);
    let reference: Arc<dyn Backend> = Arc::new(reference());
    let p = drafter::problem(true, 11);
    let want = drafter::run(reference, &p, false);
    assert!(want.counted > 0 && want.loss > 0.0);
    let why = "bf16 flash attention (f32 GEMMs) vs f64 reference";
    for recompute in [false, true] {
        let got = drafter::run(cu.clone(), &p, recompute);
        println!("small drafter, cuda-flash, Fp32 GEMMs, recompute={recompute}");
        check_scalar("  loss sum(w*CE)", got.loss, want.loss, 1e-2, why);
        check_scalar(
            "  loss only (grad_scale 0)",
            got.loss_only,
            want.loss,
            1e-2,
            why,
        );
        check_scalar(
            "  weight_sum",
            got.weight_sum,
            want.weight_sum,
            1e-12,
            "same weights",
        );
        assert_eq!(got.counted, want.counted);
        assert!(
            got.correct.abs_diff(want.correct) <= 1 + want.counted / 20,
            "correct {} vs {}",
            got.correct,
            want.correct
        );
        let same = got
            .predict
            .iter()
            .zip(&want.predict)
            .filter(|(a, b)| a == b)
            .count();
        println!(
            "    predict: {same} of {} slots equal; correct {} vs {}",
            want.predict.len(),
            got.correct,
            want.correct
        );
        assert!(
            same * 100 >= want.predict.len() * 90,
            "predictions differ too often"
        );
        for ((name, g), (_, w)) in got.grads.iter().zip(&want.grads) {
            check_rel_l2(&format!("  d {name}"), g, w, 3e-2, why);
            check(&format!("  d {name}"), g, w, 1e-1, 5e-2, why);
        }
    }
}

#[test]
fn backend_is_usable_from_many_threads() {
    let Some(cu) = cuda() else { return };
    let cu = Arc::new(cu);
    let rf = reference();
    let mut r = rng(12);
    let (m, k) = (64, 48);
    let a = rand_vec(&mut r, m * k, 1.0);
    let want = down(
        &rf,
        &rf.matmul(
            &up(&rf, &a, &[m, k]),
            Transpose::No,
            &up(&rf, &a, &[m, k]),
            Transpose::Yes,
        )
        .unwrap(),
    );
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let (cu, a) = (cu.clone(), a.clone());
            std::thread::spawn(move || {
                // A second backend on the same device shares the compiled kernels.
                let mine = CudaBackend::new(&BackendOptions {
                    attention: "cuda-simple".into(),
                    threads: 0,
                    device: 0,
                })
                .unwrap();
                let mut out = Vec::new();
                for be in [cu.as_ref(), &mine] {
                    let t: Tensor = be.upload(&a, &[m, k]).unwrap();
                    out.push(
                        be.download(&be.matmul(&t, Transpose::No, &t, Transpose::Yes).unwrap())
                            .unwrap(),
                    );
                }
                out
            })
        })
        .collect();
    for h in handles {
        for got in h.join().unwrap() {
            check(
                "matmul from 8 threads x 2 backends",
                &got,
                &want,
                1e-2,
                1e-2,
                "TF32 and the env-selected default (bf16: |err| <= 2^-8 * sum|a||b| ~ 0.05)",
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// Timing (information only; no assertion beyond correctness elsewhere)

/// `n` values: 1M seeded random ones repeated (cheap to make at GB sizes; never zeros).
fn tiled(r: &mut rand_chacha::ChaCha8Rng, n: usize, s: f32) -> Vec<f32> {
    let base = rand_vec(r, n.min(1 << 20), s);
    base.iter().copied().cycle().take(n).collect()
}

/// Median wall time of `f` over `reps` runs after one warm-up, with the stream synchronised.
fn time_ms(cu: &CudaBackend, reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    cu.synchronize().unwrap();
    let mut ts: Vec<f64> = (0..reps)
        .map(|_| {
            let t = std::time::Instant::now();
            f();
            cu.synchronize().unwrap();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    ts.sort_by(f64::total_cmp);
    ts[reps / 2]
}

#[test]
fn timing_report() {
    if cuda().is_none() {
        return;
    }
    // Poison off for timing (it adds a fill per allocation).
    let cu = CudaBackend::with_options(
        &BackendOptions {
            attention: "cuda-simple".into(),
            threads: 0,
            device: 0,
        },
        dflash_backend_cuda::CudaOptions {
            gemm: GemmPrecision::Tf32,
            poison: false,
        },
    )
    .unwrap();
    let mut r = rng(99);
    println!("timings on {} (median of 5, synchronised):", cu.device());
    // Qwen3-8B drafter shapes: 8192 query tokens, H 4096.
    let (t, h, i) = (8192, 4096, 12288);
    let x = up(&cu, &tiled(&mut r, t * h, 1.0), &[t, h]);
    let w = up(&cu, &tiled(&mut r, i * h, 0.02), &[i, h]);
    let ms = time_ms(&cu, 5, || {
        cu.linear(&x, &w).unwrap();
    });
    println!(
        "  linear {t}x{h} @ ({i}x{h})^T  TF32: {ms:8.2} ms  {:7.1} TFLOP/s",
        2.0 * (t * h * i) as f64 / ms / 1e9
    );
    let wn = up(&cu, &tiled(&mut r, h, 1.0), &[h]);
    let ms = time_ms(&cu, 5, || {
        cu.rms_norm(&x, &wn, 1e-6).unwrap();
    });
    println!(
        "  rms_norm {t}x{h}: {ms:8.3} ms  {:7.1} GB/s",
        (2 * t * h * 4) as f64 / ms / 1e6
    );
    let ms = time_ms(&cu, 5, || {
        cu.add(&x, &x).unwrap();
    });
    println!(
        "  add {t}x{h}: {ms:8.3} ms  {:7.1} GB/s",
        (3 * t * h * 4) as f64 / ms / 1e6
    );
    // Fused CE over a 151936 vocabulary, 2048 rows (~1700 active).
    let (tl, v) = (2048, 151_936);
    let xl = up(&cu, &tiled(&mut r, tl * h, 1.0), &[tl, h]);
    let wl = up(&cu, &tiled(&mut r, v * h, 0.02), &[v, h]);
    let labels: Vec<u32> = (0..tl).map(|_| r.random_range(0..v as u32)).collect();
    let weights: Vec<f32> = (0..tl)
        .map(|k| if k % 16 == 0 { 0.0 } else { 1.0 })
        .collect();
    let ms = time_ms(&cu, 3, || {
        cu.linear_cross_entropy(&xl, &wl, &labels, &weights, 1.0)
            .unwrap();
    });
    let act = weights.iter().filter(|&&w| w > 0.0).count();
    println!(
        "  linear_cross_entropy {tl} rows ({act} active), V {v}: {ms:8.2} ms  {:7.1} TFLOP/s (2 GEMMs)",
        4.0 * (act * h * v) as f64 / ms / 1e9
    );
    // The same GEMM-bound ops with bf16 GEMM operands (the default; includes the f32 -> bf16
    // conversions of both operands per GEMM). Tensors cross backends (event tracking).
    let cub = CudaBackend::with_options(
        &BackendOptions {
            attention: "cuda-simple".into(),
            threads: 0,
            device: 0,
        },
        dflash_backend_cuda::CudaOptions {
            gemm: GemmPrecision::Bf16,
            poison: false,
        },
    )
    .unwrap();
    let ms = time_ms(&cub, 5, || {
        cub.linear(&x, &w).unwrap();
    });
    println!(
        "  linear {t}x{h} @ ({i}x{h})^T  bf16: {ms:8.2} ms  {:7.1} TFLOP/s (with operand conversion)",
        2.0 * (t * h * i) as f64 / ms / 1e9
    );
    let ms = time_ms(&cub, 3, || {
        cub.linear_cross_entropy(&xl, &wl, &labels, &weights, 1.0)
            .unwrap();
    });
    println!(
        "  linear_cross_entropy bf16 GEMMs, {tl} rows ({act} active), V {v}: {ms:8.2} ms  {:7.1} TFLOP/s (2 GEMMs)",
        4.0 * (act * h * v) as f64 / ms / 1e9
    );
    drop(cub);
    drop((xl, wl, x, w));
    // Attention on the DFlash mask: ctx 2048 + 128 blocks of 16, 32/8 heads, d 128.
    let (s, nb, bs, hq, hkv, d) = (2048usize, 128usize, 16usize, 32usize, 8usize, 128usize);
    let mut anchors: Vec<i32> = (0..nb).map(|_| r.random_range(1..s as i32 - 1)).collect();
    anchors.sort();
    let mask = BlockMask::dflash(s, bs, &anchors).unwrap();
    let (tq, tk) = (nb * bs, s + nb * bs);
    let q = up(&cu, &tiled(&mut r, tq * hq * d, 1.0), &[tq, hq, d]);
    let k = up(&cu, &tiled(&mut r, tk * hkv * d, 1.0), &[tk, hkv, d]);
    let vv = up(&cu, &tiled(&mut r, tk * hkv * d, 1.0), &[tk, hkv, d]);
    let pairs = mask.visible_pairs() as f64;
    let mut fwd = None;
    let ms = time_ms(&cu, 3, || {
        fwd = Some(cu.attention(&q, &k, &vv, &mask, 0.088).unwrap());
    });
    println!(
        "  attention fwd cuda-simple, DFlash ctx {s} + {nb}x{bs}, {hq}/{hkv} heads d{d}: {ms:8.2} ms  {:6.2} TFLOP/s (anchor: flex 107)",
        4.0 * pairs * (hq * d) as f64 / ms / 1e9
    );
    let (o, l) = fwd.unwrap();
    let ms_b = time_ms(&cu, 3, || {
        cu.attention_backward(&q, &k, &vv, &o, &l, &q, &mask, 0.088)
            .unwrap();
    });
    println!(
        "  attention bwd cuda-simple: {ms_b:8.2} ms; fwd+bwd {:6.2} TFLOP/s (anchor: flex 88)",
        3.5 * 4.0 * pairs * (hq * d) as f64 / (ms + ms_b) / 1e9
    );
    let n = 100_000_000;
    let mut p = up(&cu, &tiled(&mut r, n, 1.0), &[n]);
    let g = cu.copy(&p).unwrap();
    let (mut m, mut v2) = (cu.zeros(&[n]).unwrap(), cu.zeros(&[n]).unwrap());
    let mut step = 0;
    let ms = time_ms(&cu, 5, || {
        step += 1;
        let hp = AdamWParams {
            lr: 1e-4,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.0,
            step,
        };
        cu.adamw_step(&mut p, &g, &mut m, &mut v2, &hp).unwrap();
    });
    println!(
        "  adamw 1e8 params: {ms:8.2} ms  {:7.1} GB/s (28 B/param)",
        28.0 * n as f64 / ms / 1e6
    );
}

// ---------------------------------------------------------------------------------------
// Device-side random weights and memory accounting (used by the benchmarks)

#[test]
fn random_normal_matches_the_host_generator_and_memory_is_tracked() {
    let Some(cu) = cuda() else { return };
    let rf = reference();
    // Odd length: the last pair is half-written. Same counter-based stream on both sides;
    // only the last ulp of f64 log/sincos may differ, so 1e-6 relative after rounding to f32.
    let (n, std, seed) = (100_001usize, 0.02f32, 42u64);
    let dev = down(&cu, &cu.random_normal(&[n], std, seed).unwrap());
    let host = down(&rf, &rf.random_normal(&[n], std, seed).unwrap());
    let worst = dev
        .iter()
        .zip(&host)
        .map(|(a, b)| ((a - b).abs() / b.abs().max(1e-3 * std)) as f64)
        .fold(0.0, f64::max);
    assert!(
        worst <= 1e-6,
        "random_normal: worst relative difference {worst:e}"
    );
    assert!(cu.random_normal(&[4], f32::NAN, 1).is_err());
    println!("  random_normal vs host generator: worst rel {worst:.2e} (tol 1e-6)");

    // Peak memory follows a 256 MiB allocation and resets to what is live.
    let Some(before) = cu.memory_stats() else {
        println!("  memory_stats: not available on this device");
        return;
    };
    cu.reset_peak_memory();
    let big = cu.zeros(&[64 << 20]).unwrap(); // 256 MiB of f32
    cu.synchronize().unwrap();
    let during = cu.memory_stats().unwrap();
    assert!(
        during.peak_bytes >= before.in_use_bytes + (256 << 20),
        "{before:?} -> {during:?}"
    );
    drop(big);
    cu.synchronize().unwrap();
    cu.reset_peak_memory();
    let after = cu.memory_stats().unwrap();
    assert!(
        after.peak_bytes < during.peak_bytes,
        "{during:?} -> {after:?}"
    );
    println!(
        "  memory_stats: peak {} MiB with the buffer, {} MiB after reset",
        during.peak_bytes >> 20,
        after.peak_bytes >> 20
    );
}
