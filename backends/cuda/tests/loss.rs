//! Fused linear cross-entropy and argmax against the reference backend.
//!
//! Skips cleanly without CUDA; inputs, poisoning and the tolerance scheme: `common`.

mod common;

use rand::Rng;

use common::*;
use dflash_backend_cuda::GemmPrecision;
use dflash_core::LossOps;

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
