//! Fused linear cross-entropy and argmax against the reference backend: one vocabulary chunk
//! and several (the online log-sum-exp and the recomputed logits), several row chunks,
//! skipped rows exactly 0, malformed calls with the reference's messages, NaN propagation.
//!
//! Skips cleanly without an adapter; inputs, poisoning and tolerances: `common`.

mod common;

use rand::Rng;

use common::*;
use dflash_core::LossOps;

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
                    (b2, b1, i1) = (b1, z, j);
                } else if z > b2 {
                    b2 = z;
                }
            }
            (i1, b1 - b2)
        })
        .collect()
}

/// Rows whose top-2 margin is this small may flip their argmax under f32 rounding.
const NEAR_TIE: f64 = 1e-4;

#[test]
fn loss_ops_match_reference() {
    let rf = reference();
    let mut r = rng(7);
    for (label, be) in wgpu_reduction_variants() {
        // (T, H, V): on full bindings whole-vocabulary chunks of up to 1024 rows (the last
        // shape: two of them, 1024 + 76 rows); on 4 KiB bindings one chunk of all rows and
        // many vocabulary chunks (the backward recomputing each chunk's logits).
        let shapes: &[(usize, usize, usize)] = if label.starts_with("full bindings") {
            &[(37, 64, 1000), (3, 8, 5), (300, 16, 40_000), (1100, 8, 50)]
        } else {
            &[(37, 32, 100), (3, 8, 5), (150, 16, 200)]
        };
        for &(t, h, v) in shapes {
            let x = rand_vec(&mut r, t * h, 1.0);
            let w = rand_vec(&mut r, v * h, 1.0);
            let m = margins(&x, &w, t, h, v);
            let labels: Vec<u32> = m
                .iter()
                .map(|&(am, _)| {
                    if r.random_bool(0.4) {
                        am as u32
                    } else {
                        r.random_range(0..v as u32)
                    }
                })
                .collect();
            let weights: Vec<f32> = (0..t)
                .map(|_| {
                    if r.random_bool(0.3) {
                        0.0
                    } else {
                        r.random_range(0.1f32..1.0)
                    }
                })
                .collect();
            let (xw, ww) = (up(&be, &x, &[t, h]), up(&be, &w, &[v, h]));
            let (xr, wr) = (up(&rf, &x, &[t, h]), up(&rf, &w, &[v, h]));
            let gs = 0.37;
            let (sw, dxw) = be
                .linear_cross_entropy(&xw, &ww, &labels, &weights, gs)
                .unwrap();
            let (sr, dxr) = rf
                .linear_cross_entropy(&xr, &wr, &labels, &weights, gs)
                .unwrap();
            let tag = format!("[{label}] ({t}, {h}, {v})");
            let rel = |atol, rtol, why| Tolerance {
                atol,
                rtol,
                atol_unit: AtolUnit::MaxWant,
                why,
            };
            assert_close(
                &format!("sum(w*CE) {tag}"),
                &[sw.weighted_loss],
                &[sr.weighted_loss],
                &rel(0.0, 1e-5, "f32 logits and log-sum-exp vs f64"),
            );
            assert_close(
                &format!("sum(w) {tag}"),
                &[sw.weight_sum],
                &[sr.weight_sum],
                &rel(0.0, 1e-12, "the same f32 weights summed in f64"),
            );
            assert_eq!(sw.counted, sr.counted, "{tag}: counted");
            let ties = (0..t)
                .filter(|&i| weights[i] > 0.0 && m[i].1 < NEAR_TIE)
                .count() as u64;
            assert!(
                sw.correct.abs_diff(sr.correct) <= ties,
                "{tag}: correct {} vs {}",
                sw.correct,
                sr.correct
            );
            let (gw, gr) = (down(&be, &dxw), down(&rf, &dxr));
            assert_close(
                &format!("dx {tag}"),
                &gw,
                &gr,
                &rel(1e-5, 1e-4, "f32 softmax and GEMMs over V and H vs f64"),
            );
            for i in (0..t).filter(|&i| weights[i] == 0.0) {
                assert!(
                    gw[i * h..(i + 1) * h].iter().all(|&g| g == 0.0),
                    "{tag}: skipped row {i}"
                );
            }
            let aw = be.linear_argmax(&xw, &ww).unwrap();
            let ar = rf.linear_argmax(&xr, &wr).unwrap();
            let differ = (0..t)
                .filter(|&i| aw[i] != ar[i] && m[i].1 >= NEAR_TIE)
                .count();
            assert_eq!(
                differ, 0,
                "{tag}: argmax differs on rows with a clear maximum"
            );
            println!("  linear_argmax {tag}: equal on all {t} rows (near ties allowed to differ)");
        }
    }
}

#[test]
fn loss_errors_and_nan_match_reference() {
    let rf = reference();
    let Some(be) = wgpu() else { return };
    let (t, h, v) = (4, 3, 5);
    let x = vec![0.5; t * h];
    let w = vec![0.25; v * h];
    let (xw, ww) = (up(&be, &x, &[t, h]), up(&be, &w, &[v, h]));
    let (xr, wr) = (up(&rf, &x, &[t, h]), up(&rf, &w, &[v, h]));
    for (labels, weights) in [
        (vec![0, 1, 9, 2], vec![1.0; 4]), // label out of range
        (vec![0, 1, 2, 3], vec![1.0, f32::NAN, 1.0, 1.0]), // a NaN weight
        (vec![0, 1], vec![1.0; 2]),       // wrong lengths
    ] {
        let e1 = be
            .linear_cross_entropy(&xw, &ww, &labels, &weights, 1.0)
            .unwrap_err();
        let e2 = rf
            .linear_cross_entropy(&xr, &wr, &labels, &weights, 1.0)
            .unwrap_err();
        assert_eq!(e1.to_string().replace("wgpu:0", "cpu"), e2.to_string());
        println!("  {e1}");
    }
    let bad = up(&be, &[1.0; 8], &[2, 4]);
    let e = be.linear_argmax(&bad, &ww).unwrap_err().to_string();
    assert!(e.contains("linear_argmax") && e.contains("wgpu:0"), "{e}");
    // A NaN feature makes its row's loss NaN on both sides.
    let mut xn = x.clone();
    xn[4] = f32::NAN;
    let (s, _) = be
        .linear_cross_entropy(&up(&be, &xn, &[t, h]), &ww, &[0, 1, 2, 3], &[1.0; 4], 1.0)
        .unwrap();
    let (sr, _) = rf
        .linear_cross_entropy(&up(&rf, &xn, &[t, h]), &wr, &[0, 1, 2, 3], &[1.0; 4], 1.0)
        .unwrap();
    assert!(
        s.weighted_loss.is_nan() && sr.weighted_loss.is_nan(),
        "{s:?} {sr:?}"
    );
    println!("  a NaN feature gives a NaN loss, as on the reference");
}

/// An f16 LM head (the compute format of a frozen head) gives the fused loss, its `dx` and the
/// argmax bit for bit what the f32 head with the same values gives (the GEMMs widen on load,
/// the products and sums are the same f32 operations), which `loss_ops_match_reference`
/// checks against the reference. Odd `H` puts head rows at odd f16 offsets. On 4 KiB
/// bindings an f16 binding holds twice the head rows of an f32 one, so the vocabulary chunks
/// differ and the online log-sum-exp and the `dx` sums fold in another order: there the two
/// agree to f32 rounding (1e-6 relative, where a wrong chunk would be off by 1e-2 or more).
#[test]
fn loss_f16_head_matches_the_f32_head_bit_exact() {
    let mut r = rng(17);
    for (label, be) in wgpu_f16_both() {
        let shapes: &[(usize, usize, usize)] = if label == "f16, full bindings" {
            &[(37, 64, 1000), (9, 33, 300), (300, 16, 40_000)]
        } else {
            &[(37, 32, 100), (20, 9, 200)]
        };
        for &(t, h, v) in shapes {
            let x = up(&be, &rand_vec(&mut r, t * h, 1.0), &[t, h]);
            let (w16, held) = up_f16(&be, &rand_vec(&mut r, v * h, 1.0), &[v, h]);
            let w32 = up(&be, &held, &[v, h]);
            let labels: Vec<u32> = (0..t).map(|_| r.random_range(0..v as u32)).collect();
            let weights: Vec<f32> = (0..t)
                .map(|i| {
                    if i % 4 == 1 {
                        0.0
                    } else {
                        r.random_range(0.1f32..1.0)
                    }
                })
                .collect();
            let (s16, dx16) = be
                .linear_cross_entropy(&x, &w16, &labels, &weights, 0.37)
                .unwrap();
            let (s32, dx32) = be
                .linear_cross_entropy(&x, &w32, &labels, &weights, 0.37)
                .unwrap();
            let tag = format!("[{label}] ({t}, {h}, {v})");
            assert_eq!(
                (s16.correct, s16.counted),
                (s32.correct, s32.counted),
                "{tag}"
            );
            if label == "f16, full bindings" {
                assert_eq!(
                    s16.weighted_loss.to_bits(),
                    s32.weighted_loss.to_bits(),
                    "{tag}"
                );
                check_exact(
                    &format!("f16 head dx {tag}"),
                    &down(&be, &dx16),
                    &down(&be, &dx32),
                );
            } else {
                let rel = (s16.weighted_loss - s32.weighted_loss).abs() / s32.weighted_loss.abs();
                assert!(
                    rel <= 1e-6,
                    "{tag}: loss {} vs {}",
                    s16.weighted_loss,
                    s32.weighted_loss
                );
                let chunking = RelL2 {
                    max: 1e-6,
                    why: "f32 sums folded in another chunk order",
                };
                assert_rel_l2(
                    &format!("f16 head dx {tag}"),
                    &down(&be, &dx16),
                    &down(&be, &dx32),
                    &chunking,
                );
            }
            assert_eq!(
                be.linear_argmax(&x, &w16).unwrap(),
                be.linear_argmax(&x, &w32).unwrap(),
                "{tag}: argmax"
            );
            println!(
                "  f16 head {tag}: loss {:.6} as the f32 head's, argmax equal",
                s16.weighted_loss
            );
        }
    }
}
