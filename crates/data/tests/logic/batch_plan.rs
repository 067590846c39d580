//! Batch plans: token budget, buckets, every sample once, determinism in seed and epoch,
//! edge cases and the bucket summary table.

use std::collections::BTreeSet;

use dflash_data::*;

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
