//! Fused linear cross-entropy and argmax against the reference backend through the shared op
//! suite (`dflash_tests::ops::loss`), and an f16 head against the f32 head.
//!
//! Skips cleanly without an adapter; inputs, poisoning and tolerances: `common`.

mod common;

use rand::Rng;

use common::*;
use dflash_core::LossOps;
use dflash_tests::ops::loss;

#[test]
fn loss_ops_match_reference() {
    for p in paths(wgpu_reduction_variants()) {
        loss::cross_entropy(&p, &loss::LossPrecision::F32);
    }
}

#[test]
fn loss_errors_and_nan_match_reference() {
    if let Some(be) = wgpu() {
        loss::cross_entropy_errors_and_nan(&WgpuPath::new("full bindings", be));
    }
}

/// An f16 LM head (the compute format of a frozen head) against the reference on the values
/// it holds: the shared body (`loss::narrow_head`).
#[test]
fn loss_f16_head_matches_reference() {
    for p in paths(wgpu_f16_both()) {
        loss::narrow_head(&p, &loss::LossPrecision::F32, Format::F16);
    }
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
