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

/// Blocks ready for [`dflash_models::Drafter::forward_backward`]: one sequence's, or a
/// packed micro-batch's — the sequences' features end to end as one context and every
/// sequence's blocks in one list, each bounded by its own document. A packed batch's anchors,
/// labels and weights are exactly those of [`PreparedBatch::new`] on each sequence alone
/// (shifted to packed rows), so the loss is the same sum of `w * CE` however the micro-batch
/// was packed.
#[derive(Debug)]
pub struct PreparedBatch {
    /// `(sum S, k*H)`.
    pub features: Features,
    /// `(N)` anchors as (packed) context rows; negative = padding block.
    pub anchors: Vec<i32>,
    /// `(N)` first context row of each block's sequence (all 0 for one sequence).
    pub doc_starts: Vec<i32>,
    /// `(sum S)` position of each context row within its sequence (`0..S` for one sequence).
    pub ctx_positions: Vec<i32>,
    pub block_ids: Vec<u32>,
    /// `(N*bs)` positions within the block's own sequence.
    pub positions: Vec<i32>,
    pub labels: Vec<u32>,
    pub weights: Vec<f32>,
}

/// One sequence's blocks (a batch of one document).
pub type PreparedSeq = PreparedBatch;

/// Anchors of `(sample_id, loss_mask)` in `epoch`.
fn anchors_of(sample_id: u64, loss_mask: &[u8], epoch: u64, spec: &BlockSpec) -> Vec<i32> {
    let seed = dflash_data::anchor_seed(spec.seed, epoch, sample_id);
    dflash_data::sample_anchors(loss_mask, spec.num_anchors, seed)
}

impl PreparedBatch {
    /// Samples anchors for `seq` in `epoch` and builds its blocks.
    pub fn new(seq: HiddenSeq, epoch: u64, spec: &BlockSpec) -> Self {
        let anchors = anchors_of(seq.sample_id, &seq.loss_mask, epoch, spec);
        Self::with_anchors(seq, anchors, spec)
    }

    /// Builds one sequence's blocks for given anchors (negative = padding block).
    pub fn with_anchors(seq: HiddenSeq, anchors: Vec<i32>, spec: &BlockSpec) -> Self {
        let mut p = Self::empty(seq.features);
        p.push_doc(&seq.ids, &seq.loss_mask, &anchors, 0, spec);
        p
    }

    /// Samples anchors for every sequence of `batch` and packs their blocks; `None` when
    /// the micro-batch holds no sequence.
    pub fn packed(batch: HiddenBatch, spec: &BlockSpec) -> Option<Self> {
        let mut p = Self::empty(batch.features?);
        let mut start = 0i32;
        for seq in &batch.seqs {
            let anchors = anchors_of(seq.sample_id, &seq.loss_mask, batch.epoch, spec);
            p.push_doc(&seq.ids, &seq.loss_mask, &anchors, start, spec);
            start += seq.ids.len() as i32;
        }
        Some(p)
    }

    fn empty(features: Features) -> Self {
        PreparedBatch {
            features,
            anchors: Vec::new(),
            doc_starts: Vec::new(),
            ctx_positions: Vec::new(),
            block_ids: Vec::new(),
            positions: Vec::new(),
            labels: Vec::new(),
            weights: Vec::new(),
        }
    }

    /// Appends the blocks of one document whose context rows start at `start`.
    fn push_doc(
        &mut self,
        ids: &[u32],
        loss_mask: &[u8],
        anchors: &[i32],
        start: i32,
        spec: &BlockSpec,
    ) {
        let t = dflash_data::block_targets(
            ids,
            loss_mask,
            anchors,
            spec.block_size,
            spec.gamma,
            spec.mask_token_id,
        );
        self.anchors
            .extend(anchors.iter().map(|&a| if a < 0 { a } else { a + start }));
        self.doc_starts
            .extend(std::iter::repeat_n(start, anchors.len()));
        self.ctx_positions.extend(0..ids.len() as i32);
        self.block_ids.extend(t.block_ids);
        self.positions.extend(t.positions);
        self.labels.extend(t.labels);
        self.weights.extend(t.weights);
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
