//! Per-block labels, loss weights, block token ids and positions (docs/design.md §2.2, §2.3).

/// Flattened `(N * block_size)` targets of N blocks, block-major.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BlockTargets {
    /// Label of slot k of block n: the data token at `a_n + k` (same position, *not* shifted);
    /// 0 where `a_n + k >= S` and for padding blocks.
    pub labels: Vec<u32>,
    /// `1[a+k < S] * 1[k > 0] * loss_mask[a+k] * exp(-(k-1)/gamma)`; 0 for padding blocks.
    pub weights: Vec<f32>,
    /// Noise-embedding input: `[ids[a], MASK, ..., MASK]`; all MASK for padding blocks.
    pub block_ids: Vec<u32>,
    /// Absolute position of each slot: `a + k`; 0 for padding blocks.
    pub positions: Vec<i32>,
}

impl BlockTargets {
    /// Sum of the weights (the loss normalizer's contribution of this sequence).
    pub fn weight_sum(&self) -> f64 {
        self.weights.iter().map(|&w| w as f64).sum()
    }

    /// Number of slots with a positive weight (the accuracy denominator).
    pub fn num_supervised(&self) -> usize {
        self.weights.iter().filter(|&&w| w > 0.0).count()
    }
}

/// The decay factor of slot `k >= 1`: `exp(-(k-1)/gamma)`. A `gamma` that is not a positive
/// number (0, negative, NaN) means no decay (factor 1); `+inf` also gives 1.
pub fn decay(k: usize, gamma: f32) -> f32 {
    if gamma > 0.0 {
        (-(k.saturating_sub(1) as f32) / gamma).exp()
    } else {
        1.0
    }
}

/// Labels, weights, block ids and positions of the blocks anchored at `anchors`.
///
/// `ids` and `loss_mask` are the sequence (length S). A negative anchor is a padding block
/// (weights 0, labels 0, positions 0, block ids all `mask_token_id`); so is an anchor `>= S`.
/// Never indexes past S: slots with `a + k >= S` get label 0 and weight 0 (their position is
/// still `a + k`). If `loss_mask` is shorter than `ids`, missing entries count as 0.
pub fn block_targets(
    ids: &[u32],
    loss_mask: &[u8],
    anchors: &[i32],
    block_size: usize,
    gamma: f32,
    mask_token_id: u32,
) -> BlockTargets {
    let s = ids.len();
    let n = anchors.len() * block_size;
    let mut t = BlockTargets {
        labels: vec![0; n],
        weights: vec![0.0; n],
        block_ids: vec![mask_token_id; n],
        positions: vec![0; n],
    };
    let decays: Vec<f32> = (0..block_size)
        .map(|k| if k == 0 { 0.0 } else { decay(k, gamma) })
        .collect();
    if block_size == 0 {
        return t;
    }
    for (b, &a) in anchors.iter().enumerate() {
        if a < 0 || a as usize >= s {
            continue;
        }
        let a = a as usize;
        let o = b * block_size;
        t.block_ids[o] = ids[a];
        for (k, &dk) in decays.iter().enumerate() {
            let p = a + k;
            t.positions[o + k] = p as i32;
            if p < s {
                t.labels[o + k] = ids[p];
                // decays[0] == 0: slot 0 (the anchor token, given as input) is never a target.
                if loss_mask.get(p).is_some_and(|&m| m != 0) {
                    t.weights[o + k] = dk;
                }
            }
        }
    }
    t
}
