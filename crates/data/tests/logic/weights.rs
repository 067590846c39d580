//! Block targets and loss weights against the docs/design.md §2.3 formula, the label and
//! padding regressions, and the decay factor (the default gamma is dflash-config's
//! `default_gamma`, tested there).

use dflash_data::*;

use crate::support::random_mask;

/// Direct transcription of docs/design.md §2.3:
/// `w = 1[a+k < S] * 1[k>0] * loss_mask[a+k] * exp(-(k-1)/gamma)`, label = ids[a+k].
fn reference(
    ids: &[u32],
    mask: &[u8],
    anchors: &[i32],
    bs: usize,
    gamma: f32,
) -> (Vec<u32>, Vec<f32>) {
    let s = ids.len() as i64;
    let mut labels = vec![];
    let mut weights = vec![];
    for &a in anchors {
        for k in 0..bs as i64 {
            if a < 0 {
                labels.push(0);
                weights.push(0.0);
                continue;
            }
            let p = a as i64 + k;
            let in_range = (p < s) as u8 as f32;
            let not_first = (k > 0) as u8 as f32;
            let m = if p < s { mask[p as usize] as f32 } else { 0.0 };
            labels.push(if p < s { ids[p as usize] } else { 0 });
            weights.push(in_range * not_first * m * (-((k - 1) as f32) / gamma).exp());
        }
    }
    (labels, weights)
}

#[test]
fn weights_match_the_formula() {
    for (s, bs, seed) in [
        (64usize, 16usize, 0u64),
        (300, 10, 1),
        (33, 8, 2),
        (7, 16, 3),
        (500, 12, 4),
    ] {
        let ids: Vec<u32> = (0..s as u32).map(|i| 1000 + i).collect();
        let mask = random_mask(s, seed, 70);
        let mut anchors = sample_anchors(&mask, 24, seed);
        anchors.extend([-1, -1]); // padding blocks
        anchors.push(s as i32 - 3); // near the end: slots past S
        // Any positive decay will do here; the recipe's is dflash-config's `default_gamma`.
        let gamma = bs as f32 / 2.0;
        let t = block_targets(&ids, &mask, &anchors, bs, gamma, 151_669);
        let (labels, weights) = reference(&ids, &mask, &anchors, bs, gamma);
        assert_eq!(t.labels, labels);
        assert_eq!(t.weights.len(), weights.len());
        for (i, (&w, &r)) in t.weights.iter().zip(&weights).enumerate() {
            assert!(
                (w - r).abs() <= 1e-7 * r.abs().max(1.0),
                "slot {i}: {w} vs {r}"
            );
        }
        assert_eq!(
            t.num_supervised(),
            weights.iter().filter(|&&w| w > 0.0).count()
        );
        assert!((t.weight_sum() - weights.iter().map(|&w| w as f64).sum::<f64>()).abs() < 1e-4);
        for (n, &a) in anchors.iter().enumerate() {
            let blk = &t.block_ids[n * bs..(n + 1) * bs];
            let pos = &t.positions[n * bs..(n + 1) * bs];
            if a < 0 {
                assert!(blk.iter().all(|&x| x == 151_669));
                assert!(pos.iter().all(|&p| p == 0));
            } else {
                assert_eq!(blk[0], ids[a as usize]);
                assert!(blk[1..].iter().all(|&x| x == 151_669));
                assert_eq!(pos, (0..bs as i32).map(|j| a + j).collect::<Vec<_>>());
            }
        }
    }
}

#[test]
fn regression_labels_shifted_by_one() {
    let ids: Vec<u32> = (10..40).collect();
    let mask = vec![1u8; 30];
    let t = block_targets(&ids, &mask, &[2, 20], 4, 7.0, 99);
    // slot k of the block anchored at a is labelled with the token AT a+k, not a+k+1.
    assert_eq!(&t.labels[..4], &[12, 13, 14, 15]);
    assert_eq!(&t.labels[4..], &[30, 31, 32, 33]);
    assert_eq!(&t.block_ids[..4], &[12, 99, 99, 99]);
    // slot 0 (the anchor token itself, given as input) carries no loss; slot 1 has weight 1.
    assert_eq!(t.weights[0], 0.0);
    assert_eq!(t.weights[1], 1.0);
    assert!((t.weights[2] - (-1.0f32 / 7.0).exp()).abs() < 1e-7);
}

#[test]
fn regression_anchor_lookup_out_of_range_when_padded() {
    // S = 5, block 16: every block runs past the end; padding and absurd anchors included.
    let ids = vec![1u32, 2, 3, 4, 5];
    let mask = vec![1u8; 5];
    let anchors = [3, -1, 4, 100, i32::MIN, 0];
    let t = block_targets(&ids, &mask, &anchors, 16, 7.0, 7);
    assert_eq!(t.labels.len(), anchors.len() * 16);
    // anchor 3: slot 1 -> position 4 (the last token) supervised, slots 2.. past S
    assert_eq!(&t.labels[..3], &[4, 5, 0]);
    assert_eq!(t.weights[1], 1.0);
    assert!(t.weights[2..16].iter().all(|&w| w == 0.0));
    assert_eq!(t.positions[15], 18);
    // anchor 4 (last position): nothing to predict
    assert!(t.weights[32..48].iter().all(|&w| w == 0.0));
    // padding, out-of-range and negative anchors: all zero
    for n in [1, 3, 4] {
        assert!(t.weights[n * 16..(n + 1) * 16].iter().all(|&w| w == 0.0));
        assert!(t.labels[n * 16..(n + 1) * 16].iter().all(|&l| l == 0));
        assert!(t.positions[n * 16..(n + 1) * 16].iter().all(|&p| p == 0));
    }
    // anchor 0: slots 1..4 supervised
    assert_eq!(
        t.weights[5 * 16..5 * 16 + 6]
            .iter()
            .filter(|&&w| w > 0.0)
            .count(),
        4
    );
    // A loss mask shorter than ids counts as unsupervised, never out of bounds.
    let t = block_targets(&ids, &mask[..2], &[0], 4, 7.0, 7);
    assert_eq!(t.weights, vec![0.0, 1.0, 0.0, 0.0]);
    // Degenerate block size.
    assert_eq!(
        block_targets(&ids, &mask, &[0, 1], 0, 7.0, 7),
        BlockTargets::default()
    );
}

#[test]
fn decay_is_one_at_the_first_slot_and_without_a_positive_gamma() {
    assert_eq!(decay(1, 7.0), 1.0);
    assert_eq!(decay(3, 0.0), 1.0); // non-positive gamma: no decay
    assert_eq!(decay(3, f32::NAN), 1.0);
    assert_eq!(decay(3, f32::INFINITY), 1.0);
}
