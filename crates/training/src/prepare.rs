//! From a target's [`HiddenSeq`] (one sequence) or [`HiddenBatch`] (a packed micro-batch) to
//! the drafter's input: anchors sampled per (seed, epoch, sample) — never per worker or per
//! packing, so any split of the work samples the same blocks — then block ids, positions,
//! labels and weights (docs/design.md §2.3).

use dflash_core::pipeline::{Features, HiddenBatch, HiddenSeq};
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
            doc_starts: &[],
            ctx_positions: &[],
        }
    }

    pub fn weight_sum(&self) -> f64 {
        self.weights.iter().map(|&w| w as f64).sum()
    }
}

/// A packed micro-batch ready for [`dflash_models::Drafter::forward_backward`]: the
/// sequences' features end to end as one context, and every sequence's blocks in one list,
/// each bounded by its own document. Its anchors, labels and weights are exactly those of
/// [`PreparedSeq::new`] on each sequence alone (shifted to packed rows), so the loss is the
/// same sum of `w * CE` however the micro-batch was packed.
#[derive(Debug)]
pub struct PreparedBatch {
    /// `(sum S, k*H)`.
    pub features: Features,
    /// `(N)` anchors as packed context rows.
    pub anchors: Vec<i32>,
    /// `(N)` first context row of each block's sequence.
    pub doc_starts: Vec<i32>,
    /// `(sum S)` position of each context row within its sequence.
    pub ctx_positions: Vec<i32>,
    pub block_ids: Vec<u32>,
    /// `(N*bs)` positions within the block's own sequence.
    pub positions: Vec<i32>,
    pub labels: Vec<u32>,
    pub weights: Vec<f32>,
}

impl PreparedBatch {
    /// Samples anchors for every sequence of `batch` and packs their blocks; `None` when
    /// the micro-batch holds no sequence.
    pub fn new(batch: HiddenBatch, spec: &BlockSpec) -> Option<Self> {
        let features = batch.features?;
        let total: usize = batch.seqs.iter().map(|s| s.ids.len()).sum();
        let mut p = PreparedBatch {
            features,
            anchors: Vec::new(),
            doc_starts: Vec::new(),
            ctx_positions: Vec::with_capacity(total),
            block_ids: Vec::new(),
            positions: Vec::new(),
            labels: Vec::new(),
            weights: Vec::new(),
        };
        let mut start = 0i32;
        for seq in &batch.seqs {
            let seed = dflash_data::anchor_seed(spec.seed, batch.epoch, seq.sample_id);
            let anchors = dflash_data::sample_anchors(&seq.loss_mask, spec.num_anchors, seed);
            let t = dflash_data::block_targets(
                &seq.ids,
                &seq.loss_mask,
                &anchors,
                spec.block_size,
                spec.gamma,
                spec.mask_token_id,
            );
            p.anchors.extend(anchors.iter().map(|&a| a + start));
            p.doc_starts
                .extend(std::iter::repeat_n(start, anchors.len()));
            p.ctx_positions.extend(0..seq.ids.len() as i32);
            p.block_ids.extend(t.block_ids);
            p.positions.extend(t.positions);
            p.labels.extend(t.labels);
            p.weights.extend(t.weights);
            start += seq.ids.len() as i32;
        }
        Some(p)
    }

    pub fn as_input(&self) -> DraftInput<'_> {
        DraftInput {
            features: self.features.as_ref(),
            anchors: &self.anchors,
            block_ids: &self.block_ids,
            positions: &self.positions,
            labels: &self.labels,
            weights: &self.weights,
            doc_starts: &self.doc_starts,
            ctx_positions: &self.ctx_positions,
        }
    }

    pub fn weight_sum(&self) -> f64 {
        self.weights.iter().map(|&w| w as f64).sum()
    }
}
