//! Anchor sampling: valid, sorted, unique, uniform over candidates, deterministic; and the
//! anchor seed's mixing. (Packed rows are sampled per document by the training crate,
//! `PreparedBatch::packed`, and tested there.)

use std::collections::HashSet;

use dflash_data::*;

use crate::support::random_mask;

#[test]
fn anchors_are_valid_sorted_unique_counted_and_deterministic() {
    for (s, n, p) in [
        (0usize, 4usize, 50u64),
        (1, 4, 100),
        (2, 4, 100),
        (50, 8, 70),
        (300, 16, 60),
        (4096, 512, 80),
        (4096, 512, 10),
        (100, 0, 100),
    ] {
        for seed in 0..5u64 {
            let mask = random_mask(s, seed, p);
            let cands: Vec<usize> = (0..s.saturating_sub(1))
                .filter(|&i| mask[i] == 1 && mask[i + 1] == 1)
                .collect();
            assert_eq!(anchor_candidates(&mask), cands.len());
            let a = sample_anchors(&mask, n, seed);
            assert_eq!(a.len(), n.min(cands.len()));
            for w in a.windows(2) {
                assert!(w[0] < w[1], "not sorted/unique: {a:?}");
            }
            for &x in &a {
                let x = x as usize;
                assert!(
                    x + 1 < s && mask[x] == 1 && mask[x + 1] == 1,
                    "invalid anchor {x}"
                );
            }
            assert_eq!(a, sample_anchors(&mask, n, seed));
            if n >= cands.len() {
                assert_eq!(a, cands.iter().map(|&c| c as i32).collect::<Vec<_>>());
            }
        }
    }
    // Different seeds give different draws when there is a choice.
    let mask = vec![1u8; 1000];
    assert_ne!(sample_anchors(&mask, 10, 1), sample_anchors(&mask, 10, 2));
}

#[test]
fn anchors_are_uniform_over_candidates() {
    // 20 candidates, 5 drawn: each candidate is chosen with probability 1/4.
    let mask = vec![1u8; 21];
    let trials = 8000;
    let mut hits = [0u32; 20];
    for t in 0..trials {
        for a in sample_anchors(&mask, 5, anchor_seed(9, 0, t)) {
            hits[a as usize] += 1;
        }
    }
    let expect = trials as f64 / 4.0; // 2000, sd ~ 39
    for (i, &h) in hits.iter().enumerate() {
        assert!(
            (h as f64 - expect).abs() < 200.0,
            "candidate {i}: {h} vs {expect}"
        );
    }
}

#[test]
fn anchor_seed_mixes_all_three_inputs() {
    let mut seen = HashSet::new();
    for seed in 0..8 {
        for epoch in 0..8 {
            for id in 0..64 {
                assert!(
                    seen.insert(anchor_seed(seed, epoch, id)),
                    "collision at {seed} {epoch} {id}"
                );
            }
        }
    }
    assert_ne!(anchor_seed(1, 2, 3), anchor_seed(1, 3, 2));
    assert_ne!(anchor_seed(1, 2, 3), anchor_seed(2, 1, 3));
    assert_eq!(anchor_seed(1, 2, 3), anchor_seed(1, 2, 3));
    // Avalanche: flipping one input bit flips about half of the output bits.
    let mut total = 0;
    for bit in 0..64 {
        total += (anchor_seed(5, 6, 7) ^ anchor_seed(5, 6, 7 ^ (1 << bit))).count_ones();
    }
    let mean = total as f64 / 64.0;
    assert!((mean - 32.0).abs() < 4.0, "mean flipped bits {mean}");
}
