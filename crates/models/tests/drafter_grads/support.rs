//! The tiny drafter problem every test runs on, its gradients, and the candle oracle run on
//! it.

use std::sync::Arc;

use dflash_config::{DrafterConfig, default_gamma};
use dflash_core::Backend;
use dflash_core::mask::BlockMask;
use dflash_data::{BlockTargets, block_targets};
use dflash_models::{DraftInput, Drafter, DrafterParams};

use crate::common::*;
use crate::oracle;

/// Everything of one tiny drafter problem, host copies included.
pub(crate) struct Problem {
    pub(crate) b: Arc<dyn Backend>,
    pub(crate) cfg: DrafterConfig,
    pub(crate) frozen: Frozen,
    pub(crate) seq: Sequence,
    pub(crate) bt: BlockTargets,
    pub(crate) gamma: f32,
    pub(crate) drafter: Drafter,
    /// Parameters in `DrafterParams::layout` order.
    pub(crate) host: Vec<Vec<f32>>,
}

pub(crate) fn problem(seed: u64) -> Problem {
    let b = backend();
    let cfg = tiny_drafter_cfg();
    let params = random_params(b.as_ref(), &cfg, seed);
    let host = params
        .tensors()
        .iter()
        .map(|t| b.download(t).unwrap())
        .collect();
    let frozen = random_frozen(b.as_ref(), V, H, seed + 1);
    let seq = random_sequence(cfg.target_layer_ids.len(), seed + 2);
    let gamma = default_gamma(BS) as f32;
    let bt = block_targets(
        &seq.ids,
        &seq.loss_mask,
        &ANCHORS,
        BS,
        gamma,
        cfg.mask_token_id,
    );
    let drafter = Drafter::new(b.clone(), cfg.clone(), params, frozen.tensors.clone()).unwrap();
    Problem {
        b,
        cfg,
        frozen,
        seq,
        bt,
        gamma,
        drafter,
        host,
    }
}

pub(crate) fn input<'a>(seq: &'a Sequence, bt: &'a BlockTargets) -> DraftInput<'a> {
    DraftInput {
        features: (&seq.features).into(),
        anchors: &ANCHORS,
        block_ids: &bt.block_ids,
        positions: &bt.positions,
        labels: &bt.labels,
        weights: &bt.weights,
        doc_starts: &[],
        ctx_positions: &[],
    }
}

pub(crate) fn grads_of(p: &Problem, recompute: bool) -> Vec<Vec<f32>> {
    let mut g = DrafterParams::zeros(p.b.as_ref(), &p.cfg).unwrap();
    p.drafter
        .forward_backward(&input(&p.seq, &p.bt), 1.0, &mut g, recompute)
        .unwrap();
    g.tensors()
        .iter()
        .map(|t| p.b.download(t).unwrap())
        .collect()
}

pub(crate) fn run_oracle(p: &Problem, labels: &[u32], weights: &[f32]) -> oracle::Output {
    let mask = BlockMask::dflash(S, BS, &ANCHORS)
        .unwrap()
        .to_dense_oracle();
    oracle::run(
        &p.cfg,
        &p.host,
        &oracle::Inputs {
            features: &p.seq.features,
            embed: &p.frozen.embed,
            lm_head: &p.frozen.lm_head,
            vocab: V,
            block_ids: &p.bt.block_ids,
            positions: &p.bt.positions,
            labels,
            weights,
            mask: &mask,
        },
    )
    .expect("the candle oracle runs")
}
