//! Anchor sampling (docs/design.md §2.3): an anchor is a position `i` in `[0, S-2]` with
//! `loss_mask[i] == 1 && loss_mask[i+1] == 1`; up to `num_anchors` are drawn without
//! replacement, re-drawn every epoch, returned sorted ascending.

use crate::rng::{DOMAIN_ANCHOR, choose_prefix, combine, rng};

/// The seed of one sample's anchors in one epoch. Depends only on `(seed, epoch, sample_id)`,
/// never on which worker or in which batch the sample is processed.
pub fn anchor_seed(seed: u64, epoch: u64, sample_id: u64) -> u64 {
    combine(combine(combine(DOMAIN_ANCHOR, seed), epoch), sample_id)
}

/// `min(num_anchors, #candidates)` distinct anchors, sorted ascending, deterministic in
/// `rng_seed` (use [`anchor_seed`]). When there are at most `num_anchors` candidates, all of
/// them are returned. A packed row is sampled one document at a time, each document's mask
/// with its own sample's [`anchor_seed`] (`dflash_training`'s `PreparedBatch::packed`), so
/// packing changes no anchor.
pub fn sample_anchors(loss_mask: &[u8], num_anchors: usize, rng_seed: u64) -> Vec<i32> {
    let mut cands: Vec<i32> = (0..loss_mask.len().saturating_sub(1))
        .filter(|&i| loss_mask[i] != 0 && loss_mask[i + 1] != 0)
        .map(|i| i as i32)
        .collect();
    if cands.len() > num_anchors {
        choose_prefix(&mut cands, num_anchors, &mut rng(rng_seed));
        cands.truncate(num_anchors);
        cands.sort_unstable();
    }
    cands
}
