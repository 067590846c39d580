//! Length-bucketed, token-budgeted batching.
//!
//! Sequences go to the first bucket whose bound is `>=` their length (lengths past the last
//! bound go to an overflow bucket). Within a bucket the order is shuffled, then sequences are
//! packed greedily into batches with `max_len_in_batch * num_seqs <= token_budget` (a single
//! sequence longer than the budget gets a batch of its own). Finally the batch order is
//! shuffled. Every random choice comes from ChaCha8 streams seeded by `(seed, epoch)`, so
//! the same inputs always give the same plan.

use std::fmt;

use crate::rng::{DOMAIN_BUCKET, DOMAIN_ORDER, combine, rng, shuffle};

/// Statistics of one length bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketStats {
    /// Upper bound (inclusive) on the lengths in this bucket; `None` for the overflow bucket
    /// (lengths past the last bound).
    pub bound: Option<usize>,
    pub sequences: usize,
    /// Sum of the sequence lengths.
    pub tokens: usize,
    pub batches: usize,
    /// Sum over batches of `max_len_in_batch * num_seqs` (tokens incl. padding).
    pub padded_tokens: usize,
}

/// Per-bucket statistics of a [`BatchPlan`]; `Display` prints a small table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketSummary {
    pub buckets: Vec<BucketStats>,
    pub token_budget: usize,
    /// Zero-length entries (excluded from the plan).
    pub excluded: usize,
    /// Sequences longer than the token budget (each alone in its batch).
    pub over_budget: usize,
}

impl fmt::Display for BucketSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let fill = |t: usize, p: usize| {
            if p == 0 {
                "-".to_string()
            } else {
                format!("{:.1}%", 100.0 * t as f64 / p as f64)
            }
        };
        writeln!(
            f,
            "{:>10} {:>10} {:>12} {:>8} {:>6}",
            "bucket", "sequences", "tokens", "batches", "fill"
        )?;
        let mut prev = 0usize;
        let (mut s, mut t, mut b, mut p) = (0, 0, 0, 0);
        for k in &self.buckets {
            let label = match k.bound {
                Some(x) => format!("<={x}"),
                None if prev == 0 => "all".to_string(),
                None => format!(">{prev}"),
            };
            if let Some(x) = k.bound {
                prev = x;
            }
            writeln!(
                f,
                "{:>10} {:>10} {:>12} {:>8} {:>6}",
                label,
                k.sequences,
                k.tokens,
                k.batches,
                fill(k.tokens, k.padded_tokens)
            )?;
            s += k.sequences;
            t += k.tokens;
            b += k.batches;
            p += k.padded_tokens;
        }
        write!(
            f,
            "{:>10} {:>10} {:>12} {:>8} {:>6}",
            "total",
            s,
            t,
            b,
            fill(t, p)
        )?;
        write!(f, "\n(token budget {} per batch", self.token_budget)?;
        if self.excluded > 0 {
            write!(f, "; {} empty/skipped sequences excluded", self.excluded)?;
        }
        if self.over_budget > 0 {
            write!(
                f,
                "; {} sequences longer than the budget, one per batch",
                self.over_budget
            )?;
        }
        write!(f, ")")
    }
}

/// One epoch's batches: each batch is a list of sample indices (indices into `lengths`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchPlan {
    batches: Vec<Vec<usize>>,
    summary: BucketSummary,
    seed: u64,
    epoch: u64,
}

impl BatchPlan {
    /// Plans one epoch. `lengths[i]` is the length of sample `i`; a length of 0 excludes the
    /// sample (use it for samples that validation skipped). `bucket_bounds` need not be sorted
    /// (they are sorted and de-duplicated; a 0 bound is ignored); empty bounds = one bucket.
    pub fn new(
        lengths: &[usize],
        bucket_bounds: &[usize],
        token_budget: usize,
        seed: u64,
        epoch: u64,
    ) -> Self {
        let bounds = sorted_bounds(bucket_bounds);
        let (members, excluded) = bucket_members(lengths, &bounds);

        let base = combine(combine(seed, epoch), DOMAIN_BUCKET);
        let mut batches = Vec::new();
        let mut stats = Vec::new();
        let mut over_budget = 0;
        for (b, mut idx) in members.into_iter().enumerate() {
            let bound = bounds.get(b).copied();
            if bound.is_none() && idx.is_empty() {
                continue;
            }
            shuffle(&mut idx, &mut rng(combine(base, b as u64)));
            let packed = pack_bucket(lengths, bound, idx, token_budget, &mut batches);
            over_budget += packed.over_budget;
            stats.push(packed.stats);
        }
        shuffle(
            &mut batches,
            &mut rng(combine(combine(seed, epoch), DOMAIN_ORDER)),
        );
        let summary = BucketSummary {
            buckets: stats,
            token_budget,
            excluded,
            over_budget,
        };
        BatchPlan {
            batches,
            summary,
            seed,
            epoch,
        }
    }

    pub fn batches(&self) -> &[Vec<usize>] {
        &self.batches
    }

    pub fn into_batches(self) -> Vec<Vec<usize>> {
        self.batches
    }

    pub fn len(&self) -> usize {
        self.batches.len()
    }

    pub fn is_empty(&self) -> bool {
        self.batches.is_empty()
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Per-bucket statistics (print it at start-up: `println!("{}", plan.bucket_summary())`).
    pub fn bucket_summary(&self) -> &BucketSummary {
        &self.summary
    }
}

/// The bucket bounds in increasing order, without duplicates or 0.
fn sorted_bounds(bucket_bounds: &[usize]) -> Vec<usize> {
    let mut bounds: Vec<usize> = bucket_bounds.iter().copied().filter(|&b| b > 0).collect();
    bounds.sort_unstable();
    bounds.dedup();
    bounds
}

/// The sample indices of each bucket in index order (one list per bound, then the overflow
/// bucket's), and the number of zero-length samples left out.
fn bucket_members(lengths: &[usize], bounds: &[usize]) -> (Vec<Vec<usize>>, usize) {
    // bucket index per sample; last index = overflow
    let mut members: Vec<Vec<usize>> = vec![Vec::new(); bounds.len() + 1];
    let mut excluded = 0;
    for (i, &len) in lengths.iter().enumerate() {
        if len == 0 {
            excluded += 1;
            continue;
        }
        let b = bounds.partition_point(|&x| x < len);
        members[b].push(i);
    }
    (members, excluded)
}

/// What packing one bucket gave besides its batches.
struct PackedBucket {
    stats: BucketStats,
    /// Sequences of the bucket longer than the token budget.
    over_budget: usize,
}

/// Packs the (shuffled) samples `idx` of the bucket with bound `bound` greedily, in order, into
/// batches with `max_len_in_batch * num_seqs <= token_budget` (a sequence over the budget
/// alone), appending them to `batches`; returns the bucket's statistics.
fn pack_bucket(
    lengths: &[usize],
    bound: Option<usize>,
    idx: Vec<usize>,
    token_budget: usize,
    batches: &mut Vec<Vec<usize>>,
) -> PackedBucket {
    let mut st = BucketStats {
        bound,
        sequences: idx.len(),
        tokens: 0,
        batches: 0,
        padded_tokens: 0,
    };
    let mut over_budget = 0;
    let mut cur: Vec<usize> = Vec::new();
    let mut cur_max = 0usize;
    for i in idx {
        let len = lengths[i];
        st.tokens += len;
        if len > token_budget {
            over_budget += 1;
        }
        let new_max = cur_max.max(len);
        if !cur.is_empty() && new_max.saturating_mul(cur.len() + 1) > token_budget {
            st.padded_tokens += cur_max * cur.len();
            st.batches += 1;
            batches.push(std::mem::take(&mut cur));
            cur_max = len;
        } else {
            cur_max = new_max;
        }
        cur.push(i);
    }
    if !cur.is_empty() {
        st.padded_tokens += cur_max * cur.len();
        st.batches += 1;
        batches.push(cur);
    }
    PackedBucket {
        stats: st,
        over_budget,
    }
}
