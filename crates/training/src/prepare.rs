//! From a target's [`HiddenSeq`] to the drafter's input: anchors sampled per (seed, epoch,
//! sample) — never per worker, so any split of the work samples the same blocks — then
//! block ids, positions, labels and weights (DESIGN.md §2.3).

use dflash_core::pipeline::{Features, HiddenSeq};
use dflash_models::DraftInput;

/// How blocks are drawn from a sequence.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BlockSpec {
    pub block_size: usize,
    pub num_anchors: usize,
    pub gamma: f32,
    pub mask_token_id: u32,
    pub seed: u64,
}

/// A sequence ready for [`dflash_models::Drafter::forward_backward`].
#[derive(Debug)]
pub struct PreparedSeq {
    pub features: Features,
    pub anchors: Vec<i32>,
    pub block_ids: Vec<u32>,
    pub positions: Vec<i32>,
    pub labels: Vec<u32>,
    pub weights: Vec<f32>,
}

impl PreparedSeq {
    /// Samples anchors for `seq` in `epoch` and builds its blocks.
    pub fn new(seq: HiddenSeq, epoch: u64, spec: &BlockSpec) -> Self {
        let seed = dflash_data::anchor_seed(spec.seed, epoch, seq.sample_id);
        let anchors = dflash_data::sample_anchors(&seq.loss_mask, spec.num_anchors, seed);
        Self::with_anchors(seq, anchors, spec)
    }

    /// Builds the blocks for given anchors (negative = padding block).
    pub fn with_anchors(seq: HiddenSeq, anchors: Vec<i32>, spec: &BlockSpec) -> Self {
        let t = dflash_data::block_targets(
            &seq.ids,
            &seq.loss_mask,
            &anchors,
            spec.block_size,
            spec.gamma,
            spec.mask_token_id,
        );
        PreparedSeq {
            features: seq.features,
            anchors,
            block_ids: t.block_ids,
            positions: t.positions,
            labels: t.labels,
            weights: t.weights,
        }
    }

    pub fn as_input(&self) -> DraftInput<'_> {
        DraftInput {
            features: self.features.as_ref(),
            anchors: &self.anchors,
            block_ids: &self.block_ids,
            positions: &self.positions,
            labels: &self.labels,
            weights: &self.weights,
        }
    }

    pub fn weight_sum(&self) -> f64 {
        self.weights.iter().map(|&w| w as f64).sum()
    }
}
