//! Validation, batch plans, anchors and loss weights.

use std::collections::{BTreeSet, HashSet};

use dflash_data::*;

fn sample(id: u64, ids: Vec<u32>, loss_mask: Vec<u8>) -> Sample {
    Sample { id, ids, loss_mask }
}

// ---------------------------------------------------------------- validation

#[test]
fn validate_keeps_truncates_and_skips_with_reasons() {
    let ok = sample(0, vec![1, 2, 3, 4], vec![0, 1, 1, 0]);
    assert_eq!(
        validate(ok.clone(), 10, 100, 2, TooLongPolicy::Truncate),
        Verdict::Keep(ok.clone())
    );

    // too long: truncate (default) or skip
    let long = sample(1, (0..10).collect(), vec![1; 10]);
    match validate(long.clone(), 10, 6, 2, TooLongPolicy::default()) {
        Verdict::Truncated {
            sample,
            original_len,
        } => {
            assert_eq!(original_len, 10);
            assert_eq!(sample.ids, vec![0, 1, 2, 3, 4, 5]);
            assert_eq!(sample.loss_mask, vec![1; 6]);
            assert_eq!(sample.id, 1);
        }
        v => panic!("{v:?}"),
    }
    assert_eq!(
        validate(long.clone(), 10, 6, 2, TooLongPolicy::Skip),
        Verdict::Skip {
            id: 1,
            reason: SkipReason::TooLong {
                len: 10,
                max_len: 6
            }
        }
    );

    // too few supervised: no two adjacent supervised positions
    let sparse = sample(2, vec![1; 6], vec![1, 0, 1, 0, 1, 0]);
    let v = validate(sparse, 10, 100, 2, TooLongPolicy::Truncate);
    assert!(
        matches!(
            v,
            Verdict::Skip {
                id: 2,
                reason: SkipReason::TooFewSupervised {
                    supervised: 3,
                    anchor_candidates: 0,
                    ..
                }
            }
        ),
        "{v:?}"
    );
    // ...or fewer than min_supervised
    let few = sample(3, vec![1; 6], vec![0, 0, 1, 1, 1, 0]);
    assert!(
        validate(few.clone(), 10, 100, 3, TooLongPolicy::Truncate)
            .into_sample()
            .is_some()
    );
    assert!(validate(few.clone(), 10, 100, 4, TooLongPolicy::Truncate).is_skip());
    // truncation can remove the supervision: counted as too few supervised, not truncated
    let v = validate(few, 10, 3, 2, TooLongPolicy::Truncate);
    assert!(
        matches!(
            v,
            Verdict::Skip {
                reason: SkipReason::TooFewSupervised { supervised: 1, .. },
                ..
            }
        ),
        "{v:?}"
    );
    // empty sample
    assert!(
        validate(
            sample(4, vec![], vec![]),
            10,
            100,
            0,
            TooLongPolicy::Truncate
        )
        .is_skip()
    );

    // id out of vocab: first offending position kept
    let oov = sample(5, vec![1, 2, 264, 300], vec![1; 4]);
    assert_eq!(
        validate(oov, 264, 100, 2, TooLongPolicy::Truncate),
        Verdict::Skip {
            id: 5,
            reason: SkipReason::IdOutOfVocab {
                position: 2,
                id: 264,
                vocab_size: 264
            }
        }
    );
    assert!(
        validate(
            sample(6, vec![263, 0], vec![1, 1]),
            264,
            100,
            2,
            TooLongPolicy::Truncate
        )
        .into_sample()
        .is_some()
    );

    // length mismatch (hand-built sample)
    let v = validate(
        sample(7, vec![1, 2], vec![1]),
        10,
        100,
        2,
        TooLongPolicy::Truncate,
    );
    assert_eq!(
        v,
        Verdict::Skip {
            id: 7,
            reason: SkipReason::LengthMismatch {
                ids_len: 2,
                mask_len: 1
            }
        }
    );
}

#[test]
fn skip_counts_count_every_reason_and_keep_first_offender() {
    let mut a = SkipCounts::default();
    let samples = vec![
        sample(0, vec![1, 2, 3], vec![1, 1, 1]),    // keep
        sample(1, (0..20).collect(), vec![1; 20]),  // truncated
        sample(2, vec![1, 2, 3], vec![0, 0, 1]),    // too few supervised
        sample(9, vec![1, 999, 3], vec![1, 1, 1]),  // oov
        sample(4, vec![1, 1000, 3], vec![1, 1, 1]), // oov (earlier sample index)
        sample(5, vec![1, 2], vec![1]),             // malformed
    ];
    for s in samples {
        a.record(&validate(s, 500, 10, 2, TooLongPolicy::Truncate));
    }
    let err = DataError::IndexOutOfRange {
        name: "x".into(),
        index: 3,
        len: 1,
    };
    a.record_error(3, &err);
    assert_eq!(
        (
            a.seen,
            a.kept,
            a.too_long_truncated,
            a.too_few_supervised,
            a.id_out_of_vocab,
            a.malformed
        ),
        (7, 2, 1, 1, 2, 2)
    );
    assert_eq!(a.kept + a.skipped(), a.seen);
    let f = a.first_out_of_vocab.unwrap();
    assert_eq!(
        (f.sample, f.position, f.id, f.vocab_size),
        (4, 1, 1000, 500)
    );
    assert_eq!(a.first_malformed.as_ref().unwrap().0, 3);
    let line = a.to_string();
    assert!(
        line.contains("kept 2/7")
            && line.contains("sample 4, position 1, id 1000 >= vocab_size 500"),
        "{line}"
    );

    let mut b = SkipCounts::default();
    b.record(&validate(
        sample(1, vec![7; 30], vec![1; 30]),
        5,
        100,
        2,
        TooLongPolicy::Skip,
    ));
    b.record(&validate(
        sample(2, (0..30).collect(), vec![1; 30]),
        500,
        10,
        2,
        TooLongPolicy::Skip,
    ));
    assert_eq!((b.id_out_of_vocab, b.too_long_skipped), (1, 1));
    a.merge(&b);
    assert_eq!((a.seen, a.id_out_of_vocab, a.too_long_skipped), (9, 3, 1));
    assert_eq!(a.first_out_of_vocab.unwrap().sample, 1);
    assert_eq!(a.kept + a.skipped(), a.seen);
    assert_eq!(SkipCounts::default().to_string(), "kept 0/0");
}

// ---------------------------------------------------------------- batch plan

fn pseudo_lengths(n: usize, seed: u64) -> Vec<usize> {
    (0..n as u64)
        .map(|i| (dflash_data::rng::splitmix64(seed ^ i) % 5000) as usize)
        .collect()
}

#[test]
fn batch_plan_respects_budget_covers_every_sample_once_and_buckets() {
    let bounds = [256, 512, 1024, 2048, 4096];
    for (seed, budget) in [(0u64, 8192usize), (1, 4096), (2, 3000), (3, 100_000)] {
        let lengths = pseudo_lengths(3000, seed);
        let plan = BatchPlan::new(&lengths, &bounds, budget, seed, 0);
        let mut seen = vec![0u32; lengths.len()];
        let bucket_of = |l: usize| bounds.iter().position(|&b| l <= b).unwrap_or(bounds.len());
        for batch in plan.batches() {
            assert!(!batch.is_empty());
            let max = batch.iter().map(|&i| lengths[i]).max().unwrap();
            if batch.len() > 1 {
                assert!(
                    max * batch.len() <= budget,
                    "batch {batch:?} over budget {budget}"
                );
            }
            let b0 = bucket_of(lengths[batch[0]]);
            for &i in batch {
                seen[i] += 1;
                assert_eq!(bucket_of(lengths[i]), b0, "batch mixes buckets");
            }
        }
        for (i, &c) in seen.iter().enumerate() {
            assert_eq!(
                c,
                (lengths[i] > 0) as u32,
                "sample {i} (len {}) seen {c} times",
                lengths[i]
            );
        }
        let s = plan.bucket_summary();
        assert_eq!(
            s.buckets.iter().map(|b| b.batches).sum::<usize>(),
            plan.len()
        );
        assert_eq!(
            s.buckets.iter().map(|b| b.sequences).sum::<usize>() + s.excluded,
            lengths.len()
        );
        assert_eq!(
            s.buckets.iter().map(|b| b.tokens).sum::<usize>(),
            lengths.iter().sum::<usize>()
        );
        assert_eq!(s.excluded, lengths.iter().filter(|&&l| l == 0).count());
        assert_eq!(
            s.over_budget,
            lengths.iter().filter(|&&l| l > budget).count()
        );
        assert_eq!(s.buckets.last().unwrap().bound, None); // lengths up to 4999 > 4096
        for b in &s.buckets {
            assert!(b.padded_tokens >= b.tokens);
        }
    }
}

#[test]
fn batch_plan_is_deterministic_in_seed_and_epoch() {
    let lengths = pseudo_lengths(2000, 7);
    let bounds = [256, 512, 1024, 2048, 4096];
    let a = BatchPlan::new(&lengths, &bounds, 8192, 42, 3);
    let b = BatchPlan::new(&lengths, &bounds, 8192, 42, 3);
    assert_eq!(a, b);
    let c = BatchPlan::new(&lengths, &bounds, 8192, 42, 4);
    let d = BatchPlan::new(&lengths, &bounds, 8192, 43, 3);
    assert_ne!(a.batches(), c.batches());
    assert_ne!(a.batches(), d.batches());
    // Same sets of samples, just planned differently.
    let set = |p: &BatchPlan| {
        p.batches()
            .iter()
            .flatten()
            .copied()
            .collect::<BTreeSet<_>>()
    };
    assert_eq!(set(&a), set(&c));
    assert_eq!((a.seed(), a.epoch()), (42, 3));
    // Unsorted / duplicated bounds mean the same thing.
    assert_eq!(
        BatchPlan::new(&lengths, &[4096, 256, 1024, 512, 2048, 512, 0], 8192, 42, 3),
        a
    );
}

#[test]
fn batch_plan_edge_cases_and_summary_table() {
    // A sequence longer than the budget gets its own batch.
    let plan = BatchPlan::new(&[10, 5000, 10, 0], &[16, 8192], 1000, 0, 0);
    assert_eq!(plan.bucket_summary().over_budget, 1);
    assert_eq!(plan.bucket_summary().excluded, 1);
    assert!(plan.batches().contains(&vec![1]));
    assert_eq!(plan.batches().iter().map(|b| b.len()).sum::<usize>(), 3);
    // Zero budget: one sequence per batch.
    assert_eq!(BatchPlan::new(&[3, 4, 5], &[], 0, 0, 0).len(), 3);
    // Empty input.
    let p = BatchPlan::new(&[], &[256], 100, 0, 0);
    assert!(p.is_empty());
    // Exact fit: 4 * 256 == 1024.
    let p = BatchPlan::new(&[256; 8], &[256], 1024, 0, 0);
    assert_eq!(p.len(), 2);
    assert!(p.batches().iter().all(|b| b.len() == 4));

    let lengths = pseudo_lengths(500, 1);
    let plan = BatchPlan::new(&lengths, &[256, 512, 1024, 2048, 4096], 8192, 0, 0);
    let table = plan.bucket_summary().to_string();
    eprintln!("{table}");
    for needle in [
        "bucket",
        "<=256",
        "<=4096",
        ">4096",
        "total",
        "token budget 8192",
    ] {
        assert!(table.contains(needle), "{needle} missing from\n{table}");
    }
    assert_eq!(plan.clone().into_batches(), plan.batches());
}

// ---------------------------------------------------------------- anchors

fn random_mask(s: usize, seed: u64, p_one: u64) -> Vec<u8> {
    (0..s as u64)
        .map(|i| (dflash_data::rng::splitmix64(seed.wrapping_mul(31) ^ i) % 100 < p_one) as u8)
        .collect()
}

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

#[test]
fn per_document_anchors_never_cross_a_boundary() {
    let doc_lens = [5usize, 1, 0, 40, 17, 33];
    let s: usize = doc_lens.iter().sum::<usize>() + 9; // 9 padding positions at the end
    let mut mask = random_mask(s, 3, 85);
    mask[s - 9..].iter_mut().for_each(|m| *m = 1); // padding marked supervised: still no anchors
    let mut starts = vec![0usize];
    for &l in &doc_lens {
        starts.push(starts.last().unwrap() + l);
    }
    let doc_of = |p: usize| starts.iter().rposition(|&st| st <= p && p < s).unwrap();
    for n in [0, 1, 3, 100] {
        for seed in 0..10u64 {
            let a = sample_anchors_per_document(&doc_lens, &mask, n, seed);
            assert_eq!(a, sample_anchors_per_document(&doc_lens, &mask, n, seed));
            for w in a.windows(2) {
                assert!(w[0] < w[1]);
            }
            let mut per_doc = vec![0usize; doc_lens.len()];
            for &x in &a {
                let x = x as usize;
                assert!(x + 1 < starts[doc_lens.len()], "anchor {x} in padding");
                assert_eq!(
                    doc_of(x),
                    doc_of(x + 1),
                    "anchor {x} crosses a document boundary"
                );
                assert!(mask[x] == 1 && mask[x + 1] == 1);
                per_doc[doc_of(x)] += 1;
            }
            for (d, &c) in per_doc.iter().enumerate() {
                let cands = (starts[d]..starts[d + 1].saturating_sub(1))
                    .filter(|&i| mask[i] == 1 && mask[i + 1] == 1)
                    .count();
                assert_eq!(c, n.min(cands), "doc {d}");
            }
        }
    }
    // All-supervised documents: the boundary position (last token of a doc) is never drawn.
    let ones = vec![1u8; 12];
    let a = sample_anchors_per_document(&[4, 4, 4], &ones, 10, 0);
    assert_eq!(a, vec![0, 1, 2, 4, 5, 6, 8, 9, 10]);
    // Documents longer than the row are clipped.
    assert_eq!(
        sample_anchors_per_document(&[4, 100], &ones[..6], 10, 0),
        vec![0, 1, 2, 4]
    );
}

// ---------------------------------------------------------------- loss weights

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
        let gamma = default_gamma(bs);
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
fn default_gamma_matches_the_recipes_and_is_monotone() {
    assert_eq!(default_gamma(16), 7.0);
    assert_eq!(default_gamma(10), 5.0);
    assert_eq!(default_gamma(8), 4.0);
    let mut prev = 0.0;
    for bs in 1..=64 {
        let g = default_gamma(bs);
        assert!(g > prev, "not increasing at {bs}");
        assert!(g - prev <= 0.5 + 1e-6, "jump at {bs}");
        prev = g;
    }
    assert_eq!(decay(1, 7.0), 1.0);
    assert_eq!(decay(3, 0.0), 1.0); // non-positive gamma: no decay
    assert_eq!(decay(3, f32::NAN), 1.0);
    assert_eq!(decay(3, f32::INFINITY), 1.0);
}

/// Samples kept longer than the target's `max_position_embeddings` (after truncation to
/// `max_len`) are skipped and counted under their own reason; shorter ones are untouched.
#[test]
fn samples_beyond_max_positions_are_skipped_and_counted() {
    let long = sample(3, vec![1; 10], vec![1; 10]);
    let v = validate(long.clone(), 10, 100, 2, TooLongPolicy::Truncate).within_positions(8);
    assert_eq!(
        v,
        Verdict::Skip {
            id: 3,
            reason: SkipReason::BeyondMaxPositions {
                len: 10,
                max_positions: 8
            }
        }
    );
    // Truncated to max_len 8 first: then it fits.
    let v = validate(long.clone(), 10, 8, 2, TooLongPolicy::Truncate).within_positions(8);
    assert!(!v.is_skip());
    let kept = validate(long, 10, 100, 2, TooLongPolicy::Truncate).within_positions(10);
    assert!(!kept.is_skip());
    let mut c = SkipCounts::default();
    c.record(&v);
    c.record(
        &validate(
            sample(4, vec![1; 9], vec![1; 9]),
            10,
            100,
            2,
            TooLongPolicy::Truncate,
        )
        .within_positions(8),
    );
    assert_eq!(
        (c.seen, c.kept, c.skipped(), c.beyond_max_positions),
        (2, 1, 1, 1)
    );
    assert!(
        c.to_string()
            .contains("1 longer than max_position_embeddings"),
        "{c}"
    );
}
