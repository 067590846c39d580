//! Anchor sampling (docs/design.md §2.3): an anchor is a position `i` in `[0, S-2]` with
//! `loss_mask[i] == 1 && loss_mask[i+1] == 1`; up to `num_anchors` are drawn without
//! replacement, re-drawn every epoch, returned sorted ascending.

use crate::rng::{DOMAIN_ANCHOR, DOMAIN_DOC, choose_prefix, combine, rng};

/// The seed of one sample's anchors in one epoch. Depends only on `(seed, epoch, sample_id)`,
/// never on which worker or in which batch the sample is processed.
pub fn anchor_seed(seed: u64, epoch: u64, sample_id: u64) -> u64 {
    combine(combine(combine(DOMAIN_ANCHOR, seed), epoch), sample_id)
}

/// Positions `i` of `loss_mask[lo..hi]` (absolute) with `i + 1 < hi` and both supervised.
fn candidates(loss_mask: &[u8], lo: usize, hi: usize) -> Vec<i32> {
    (lo..hi.saturating_sub(1))
        .filter(|&i| loss_mask[i] != 0 && loss_mask[i + 1] != 0)
        .map(|i| i as i32)
        .collect()
}

fn draw(mut cands: Vec<i32>, num_anchors: usize, seed: u64) -> Vec<i32> {
    if cands.len() > num_anchors {
        choose_prefix(&mut cands, num_anchors, &mut rng(seed));
        cands.truncate(num_anchors);
        cands.sort_unstable();
    }
    cands
}

/// `min(num_anchors, #candidates)` distinct anchors, sorted ascending, deterministic in
/// `rng_seed` (use [`anchor_seed`]). When there are at most `num_anchors` candidates, all of
/// them are returned.
pub fn sample_anchors(loss_mask: &[u8], num_anchors: usize, rng_seed: u64) -> Vec<i32> {
    draw(
        candidates(loss_mask, 0, loss_mask.len()),
        num_anchors,
        rng_seed,
    )
}

/// Anchors for a packed row of documents of lengths `doc_lens` laid end to end: up to
/// `num_anchors_per_doc` per document, where anchor `i` and `i + 1` are always in the same
/// document (a document's last token is never an anchor). Document `d` draws from the seed
/// `combine(combine(DOMAIN_DOC, seed), d)`. Documents reaching past `loss_mask.len()` are
/// clipped to it; positions after the last document (padding) get no anchors. Sorted.
pub fn sample_anchors_per_document(
    doc_lens: &[usize],
    loss_mask: &[u8],
    num_anchors_per_doc: usize,
    seed: u64,
) -> Vec<i32> {
    let s = loss_mask.len();
    let base = combine(DOMAIN_DOC, seed);
    let mut out = Vec::new();
    let mut lo = 0usize;
    for (d, &len) in doc_lens.iter().enumerate() {
        if lo >= s {
            break;
        }
        let hi = lo.saturating_add(len).min(s);
        out.extend(draw(
            candidates(loss_mask, lo, hi),
            num_anchors_per_doc,
            combine(base, d as u64),
        ));
        lo = hi;
    }
    out
}
