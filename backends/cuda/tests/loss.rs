//! Fused linear cross-entropy and argmax against the reference backend.
//!
//! Skips cleanly without CUDA; inputs, poisoning and the tolerance scheme: `common`.

mod common;

use rand::Rng;

use common::*;
use dflash_backend_cuda::{DType, GemmPrecision};
use dflash_core::{LossOps, MemoryOps};
use dflash_tests::ops::loss::{self, LossPrecision, margins};

/// The shared body (`dflash_tests::ops::loss`) in every GEMM precision, each with the bounds
/// its GEMM operands allow.
#[test]
fn loss_ops_match_reference() {
    for (prec, bounds) in [
        (
            GemmPrecision::Bf16,
            LossPrecision {
                loss_rtol: 5e-3,
                dx_rtol: 5e-2,
                dx_atol: 2e-2,
                near_tie: 0.1,
                why: "bf16 logits/dx GEMM operands (~4e-3 relative per product, 8x TF32; TF32 \
                      measured 0.023 of (3e-2, 1e-2)); logit error <= 3.9e-3 * sum|x||w| ~ 0.05 \
                      at H 64, so top-2 margins below 0.1 may flip",
            },
        ),
        (
            GemmPrecision::Tf32,
            LossPrecision {
                loss_rtol: 2e-3,
                dx_rtol: 3e-2,
                dx_atol: 1e-2,
                near_tie: 0.05,
                why: "TF32 logits/dx GEMMs (~1e-3 relative per product)",
            },
        ),
        (GemmPrecision::Fp32, LossPrecision::F32),
    ] {
        let Some(cu) = cuda_with(prec) else { return };
        let p = CudaPath::new(&format!("{prec:?} GEMMs"), cu, DType::F32);
        loss::cross_entropy(&p, &bounds);
    }
}

#[test]
fn loss_errors_and_nan_match_reference() {
    if let Some(cu) = cuda() {
        loss::cross_entropy_errors_and_nan(&CudaPath::new("f32 activations", cu, DType::F32));
    }
}

// ---------------------------------------------------------------------------------------
// bf16 LM head (`to_compute_format`)

/// The fused loss and `linear_argmax` with a bf16 head, in every GEMM precision, against the
/// reference on the same bf16-rounded head; `x` holds bf16-representable values too, so the
/// logits GEMM multiplies exactly the reference's values in every mode (products exact in f32,
/// only f32 accumulation differs): loss rel 1e-5, argmax ties only below a 1e-3 margin
/// (accumulation error <= ~K * 2^-23 * sum|x||w| ~ 4e-4 here). dx also goes through the
/// dlogits GEMM, whose f32 dlogits are rounded to bf16 / TF32 (bf16 / TF32 modes, the head
/// itself exact): the general tolerances of those modes.
#[test]
fn loss_bf16_head_matches_reference() {
    for (prec, dx_rtol, dx_atol, why) in [
        (
            GemmPrecision::Bf16,
            5e-2,
            2e-2,
            "dlogits rounded to bf16 for the dx GEMM (2^-9 relative per term); head exact",
        ),
        (
            GemmPrecision::Tf32,
            3e-2,
            1e-2,
            "dlogits rounded to TF32 for the dx GEMM; head widened exactly",
        ),
        (
            GemmPrecision::Fp32,
            2e-4,
            2e-5,
            "f32 GEMMs on the exactly widened head, f32 softmax vs f64",
        ),
    ] {
        let Some(cu) = cuda_with(prec) else { return };
        let p = CudaPath::new(&format!("{prec:?} GEMMs"), cu, DType::F32);
        let bounds = LossPrecision {
            loss_rtol: 1e-5,
            dx_rtol,
            dx_atol,
            near_tie: 1e-3,
            why,
        };
        loss::narrow_head(&p, &bounds, Format::Bf16);
        // A bf16 x is read too (checked in detail, with bf16 activations, by
        // `loss_bf16_activations_match_reference`). With f32 activations dx stays f32.
        let cu = &p.cu;
        let mut r = rng(107);
        let (t, h, v) = (300, 64, 1200);
        let xb = up_bf16(cu, &rand_vec(&mut r, t * h, 1.5), &[t, h]);
        let wc = up_bf16(cu, &rand_vec(&mut r, v * h, 0.5), &[v, h]);
        let labels: Vec<u32> = (0..t as u32).map(|i| (i * 7) % v as u32).collect();
        let (sb, dxb) = cu
            .linear_cross_entropy(&xb, &wc, &labels, &vec![1.0; t], 1.0)
            .unwrap();
        assert_eq!(dtype_of(&dxb), DType::F32);
        assert!(sb.weighted_loss.is_finite() && sb.counted == t as u64);
    }
}

/// With bf16 GEMMs a bf16 head is read in place: the device pool's peak during the loss grows
/// by far less than the head's size (an f32 head, rounded once per call, grows it by at least
/// the bf16 copy: the check can see a copy). Loss only (`grad_scale` 0), so the dlogits GEMM
/// (which rounds a chunk of dlogits) does not run; the workspace is allocated by a first call.
/// Needs `--test-threads 1` (the pool is per device), as `run_all.sh` passes.
#[test]
fn loss_bf16_head_is_not_copied() {
    use dflash_core::BackendInfo;
    let Some(cu) = cuda_with(GemmPrecision::Bf16) else {
        return;
    };
    let (t, h, v) = (300, 128, 131072);
    let head_bf16_bytes = (v * h * 2) as u64; // 32 MiB
    let x = cu.random_normal(&[t, h], 1.0, 1).unwrap();
    let wf = cu.random_normal(&[v, h], 0.05, 2).unwrap();
    let wb = cu.to_compute_format(cu.copy(&wf).unwrap()).unwrap();
    assert_eq!(dtype_of(&wb), dflash_backend_cuda::DType::Bf16);
    let mut r = rng(107);
    let labels: Vec<u32> = (0..t).map(|_| r.random_range(0..v as u32)).collect();
    let weights = vec![1.0f32; t];
    let (s_warm, _) = cu
        .linear_cross_entropy(&x, &wb, &labels, &weights, 0.0)
        .unwrap();
    let growth = |w: &dflash_core::Tensor| -> (u64, f64) {
        cu.synchronize().unwrap();
        cu.reset_peak_memory();
        let before = cu.memory_stats().unwrap();
        let (s, dx) = cu
            .linear_cross_entropy(&x, w, &labels, &weights, 0.0)
            .unwrap();
        cu.synchronize().unwrap();
        let after = cu.memory_stats().unwrap();
        drop(dx);
        (after.peak_bytes - before.in_use_bytes, s.weighted_loss)
    };
    if cu.memory_stats().is_none() {
        println!("  memory_stats: not available on this device; skipped");
        return;
    }
    let (g_bf16, l_bf16) = growth(&wb);
    let (g_f32, l_f32) = growth(&wf);
    println!(
        "  loss peak growth: bf16 head {:.2} MiB, f32 head {:.2} MiB (bf16 head copy = {} MiB)",
        g_bf16 as f64 / 1048576.0,
        g_f32 as f64 / 1048576.0,
        head_bf16_bytes >> 20
    );
    assert!(
        g_bf16 < head_bf16_bytes / 2,
        "the loss allocated {g_bf16} bytes with a bf16 head: a copy of the head?"
    );
    assert!(
        g_f32 >= head_bf16_bytes,
        "the f32 head's bf16 copy ({head_bf16_bytes} bytes) did not show ({g_f32} bytes)"
    );
    // Same values either way (the f32 head is rounded exactly as to_compute_format rounds it).
    assert_close(
        "loss, bf16 head vs f32 head rounded per call",
        &[l_f32],
        &[l_bf16],
        &Tolerance {
            atol: 0.0,
            rtol: 1e-9,
            atol_unit: AtolUnit::Absolute,
            why: "the same bf16 operands (expected bit-identical)",
        },
    );
    assert_eq!(l_bf16.to_bits(), s_warm.weighted_loss.to_bits());
}

// ---------------------------------------------------------------------------------------
// bf16 activations

/// The fused CE with bf16 activations: `x` f32 or bf16 (bf16-representable values in both, so
/// the loss's inputs are the same), head bf16; dx comes back bf16, the statistics as f64 /
/// counts. Exact-f32 GEMMs (`Fp32`), so the only rounding beyond the f32 loss's is dx's
/// storage: loss rel 1e-5 (f32 exp / accumulation vs f64, as `loss_bf16_head_matches_reference`
/// FP32), dx 2^-8 |ref| + the FP32 dx tolerance (2e-4 rel, 2e-5 of max). Rows with weight 0
/// get dx exactly 0. `linear_argmax` reads a bf16 x: ties within the margin only.
#[test]
fn loss_bf16_activations_match_reference() {
    use dflash_backend_cuda::{DType, GemmPrecision};
    let Some(cu) = cuda_act(GemmPrecision::Fp32, DType::Bf16) else {
        return;
    };
    let rf = reference();
    let mut r = rng(214);
    let (t, h, v) = (300, 64, 1500);
    let x = bf16_rounded(&rand_vec(&mut r, t * h, 1.0));
    let w = bf16_rounded(&rand_vec(&mut r, v * h, 0.2));
    let labels: Vec<u32> = (0..t).map(|_| r.random_range(0..v as u32)).collect();
    let weights: Vec<f32> = (0..t)
        .map(|i| {
            if i % 7 == 0 {
                0.0
            } else {
                r.random_range(0.1..1.0)
            }
        })
        .collect();
    let gs = 0.37;
    let wc = up_bf16(&cu, &w, &[v, h]);
    let (xr, wr) = (up(&rf, &x, &[t, h]), up(&rf, &w, &[v, h]));
    let (sr, dxr) = rf
        .linear_cross_entropy(&xr, &wr, &labels, &weights, gs)
        .unwrap();
    let dxr = down(&rf, &dxr);
    let ar = rf.linear_argmax(&xr, &wr).unwrap();
    let m = margins(&x, &w, t, h, v);
    for xd in [DType::F32, DType::Bf16] {
        let (xc, _) = up_as(&cu, &x, &[t, h], xd);
        let (sc, dxc) = cu
            .linear_cross_entropy(&xc, &wc, &labels, &weights, gs)
            .unwrap();
        assert_dtype("CE dx", &dxc, DType::Bf16);
        assert_close(
            &format!("bf16-activation CE loss (x {})", xd.name()),
            &[sc.weighted_loss],
            &[sr.weighted_loss],
            &Tolerance {
                atol: 0.0,
                rtol: 1e-5,
                atol_unit: AtolUnit::Absolute,
                why: "f32 exp / accumulation vs f64 (exact-f32 GEMMs)",
            },
        );
        assert_eq!(sc.counted, sr.counted);
        let dxh = down(&cu, &dxc);
        check_bf16(
            &format!("bf16-activation CE dx (x {})", xd.name()),
            &dxh,
            &dxr,
            &Tolerance {
                atol: 2e-5,
                rtol: 2e-4,
                atol_unit: AtolUnit::MaxWant,
                why: "FP32 GEMM dx tolerance",
            },
        );
        for i in 0..t {
            if weights[i] == 0.0 {
                assert!(dxh[i * h..(i + 1) * h].iter().all(|&d| d == 0.0));
            }
        }
        let ac = cu.linear_argmax(&xc, &wc).unwrap();
        for i in 0..t {
            assert!(
                ac[i] == ar[i] || m[i].1 < 1e-3,
                "argmax row {i}: {} vs {} (margin {})",
                ac[i],
                ar[i],
                m[i].1
            );
        }
    }
}
