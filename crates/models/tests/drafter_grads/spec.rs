//! docs/design.md §2.3 transcribed directly (no dflash-data, no dflash-mask): block targets
//! and the dense DFlash mask, with the tests that the drafter's mask and `block_targets`
//! follow it.

use dflash_core::mask::BlockMask;

use crate::common::*;
use crate::support::problem;

/// Labels, weights, block ids and positions of the blocks per docs/design.md §2.2-2.3. With
/// `shift = 1` the labels are the (buggy) next-position tokens `ids[a+k+1]`.
pub(crate) struct Spec {
    pub(crate) labels: Vec<u32>,
    pub(crate) weights: Vec<f32>,
    pub(crate) block_ids: Vec<u32>,
    pub(crate) positions: Vec<i32>,
}

pub(crate) fn spec_targets(seq: &Sequence, gamma: f32, shift: usize) -> Spec {
    let n = ANCHORS.len() * BS;
    let mut sp = Spec {
        labels: vec![0; n],
        weights: vec![0.0; n],
        block_ids: vec![MASK_ID; n],
        positions: vec![0; n],
    };
    for (blk, &a) in ANCHORS.iter().enumerate() {
        if a < 0 {
            continue; // padding block: all MASK, weight 0
        }
        let a = a as usize;
        sp.block_ids[blk * BS] = seq.ids[a];
        for k in 0..BS {
            let r = blk * BS + k;
            sp.positions[r] = (a + k) as i32;
            let p = a + k + shift;
            if p < S {
                sp.labels[r] = seq.ids[p]; // 0 past the end (weight 0 there anyway)
                if k > 0 && seq.loss_mask[a + k] == 1 {
                    sp.weights[r] = (-((k - 1) as f32) / gamma).exp();
                }
            }
        }
    }
    sp
}

/// The DFlash mask, densely, from the §2.3 rule: block n (anchor a_n) sees context rows with
/// position < a_n and every row of its own block; padding blocks see nothing.
fn spec_mask() -> Vec<Vec<bool>> {
    let rows = ANCHORS.len() * BS;
    (0..rows)
        .map(|r| {
            let (blk, a) = (r / BS, ANCHORS[r / BS]);
            (0..S + rows)
                .map(|key| {
                    a >= 0
                        && if key < S {
                            (key as i32) < a
                        } else {
                            (key - S) / BS == blk
                        }
                })
                .collect()
        })
        .collect()
}

/// `sum w * CE` over rows of `(B, V)` logits.
pub(crate) fn dense_weighted_ce(logits: &[f64], labels: &[u32], weights: &[f32]) -> f64 {
    logits
        .chunks(V)
        .zip(labels.iter().zip(weights))
        .filter(|(_, (_, w))| **w > 0.0)
        .map(|(row, (&lab, &w))| {
            let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let lse = m + row.iter().map(|z| (z - m).exp()).sum::<f64>().ln();
            w as f64 * (lse - row[lab as usize])
        })
        .sum()
}

/// `(argmax, top1 - top2 margin)` of a row.
pub(crate) fn argmax_margin(row: &[f64]) -> (usize, f64) {
    let mut idx: Vec<usize> = (0..row.len()).collect();
    idx.sort_by(|&i, &j| row[j].total_cmp(&row[i]));
    (idx[0], row[idx[0]] - row[idx[1]])
}

/// The mask the drafter uses (and the oracle densifies) is exactly the §2.3 rule: by anchor
/// position (overlapping blocks 2 and 3 stay isolated), context strictly before the anchor,
/// padding blocks blind.
#[test]
fn mask_matches_the_position_rule() {
    let dense = BlockMask::dflash(S, BS, &ANCHORS)
        .unwrap()
        .to_dense_oracle();
    assert_eq!(dense, spec_mask());
    // Spot checks of the known bugs: the anchor's own feature is not visible ...
    assert!(
        !dense[0][2] && dense[0][1],
        "block at 2 sees context [0, 2)"
    );
    // ... and block 1 (anchor 3) sees its own rows only, not block 0's overlapping ones.
    assert!(dense[BS][S + BS] && !dense[BS][S] && dense[BS][2] && !dense[BS][3]);
}

/// `block_targets` produces exactly the §2.2-2.3 labels (same position), weights, noise ids
/// and positions, and those are what the drafter consumes.
#[test]
fn block_targets_follow_the_spec() {
    let p = problem(11);
    let sp = spec_targets(&p.seq, p.gamma, 0);
    assert_eq!(p.bt.labels, sp.labels);
    assert_eq!(p.bt.block_ids, sp.block_ids);
    assert_eq!(p.bt.positions, sp.positions);
    let same_weights = Tolerance {
        atol: 1e-7,
        rtol: 0.0,
        atol_unit: AtolUnit::Absolute,
        why: "the same gamma-decay weights computed in f32 by two transcriptions",
    };
    assert_close("block weights", &p.bt.weights, &sp.weights, &same_weights);
    // The problem is not degenerate: overlapping blocks, a hole, slots past the end.
    // Supervised slots: positions 3, 4 (block at 2; 5 is a hole), 4, 6 (block at 3), 10
    // (block at 9; 11 and 12 are past the end).
    assert_eq!(p.bt.weights.iter().filter(|&&w| w > 0.0).count(), 5);
    assert_eq!(
        p.bt.weights[2 * BS + 2],
        0.0,
        "slot at position 11 >= S has weight 0"
    );
}
