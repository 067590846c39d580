//! One drafter training step built and run on any backend, for memory measurements: the
//! memory plan (`dflash_pipeline::job::memory::DrafterPlan`) is checked against what a real
//! step takes, on the reference backend by counting the process's heap and on device
//! backends through their `memory_stats`. The step is the job's: `batch` micro-batches'
//! `DrafterReplica::accumulate`, then `finish_step`.

use std::sync::Arc;

use dflash_config::{DType, DrafterConfig, DrafterShape, Qwen3Config};
use dflash_core::pipeline::{Features, HiddenBatch, SeqMeta};
use dflash_core::{Backend, Communicator};
use dflash_models::drafter::FrozenTarget;
use dflash_models::{Drafter, DrafterParams};
use dflash_training::optimizer::{AdamW, AdamWHyper};
use dflash_training::{BlockSpec, DrafterReplica, PreparedBatch};

/// A 2-layer f32 drafter (block 8, 3 target features) for a small target with the 8B
/// recipe's proportions (8 layers, GQA 2:1, MLP 3x hidden 128) and a `vocab`-token
/// vocabulary, the last token its mask.
pub fn small_drafter(vocab: usize) -> DrafterConfig {
    let target = Qwen3Config {
        model_type: "qwen3".into(),
        vocab_size: vocab,
        hidden_size: 128,
        intermediate_size: 384,
        num_hidden_layers: 8,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 32,
        rms_norm_eps: 1e-6,
        rope_theta: 1_000_000.0,
        max_position_embeddings: 4096,
        tie_word_embeddings: false,
        bos_token_id: None,
        eos_token_id: None,
        dtype: None,
    };
    let shape = DrafterShape {
        num_layers: 2,
        block_size: 8,
        num_target_features: 3,
        dtype: DType::Float32,
        ..DrafterShape::standard(vocab as u32 - 1)
    };
    DrafterConfig::for_target(&target, &shape).expect("the small drafter's config")
}

/// The micro-batches of a step: `batch` sequences of `seq_len` tokens (one a micro-batch),
/// each with `anchors` blocks.
#[derive(Debug, Clone, Copy)]
pub struct StepShape {
    pub seq_len: usize,
    pub anchors: usize,
    pub batch: usize,
    pub recompute: bool,
}

/// Builds on `b` everything a replica holds (frozen embedding and head, parameters, AdamW
/// moments) and the step's micro-batches (random features, every token supervised), calls
/// `start` (where the caller restarts its peak), then runs the step through `comm`. Panics on
/// any error: a test helper.
pub fn run_drafter_step(
    b: &Arc<dyn Backend>,
    cfg: &DrafterConfig,
    shape: StepShape,
    comm: &dyn Communicator,
    start: impl FnOnce(),
) {
    let (v, h, kh) = (
        cfg.vocab_size,
        cfg.hidden_size,
        cfg.num_target_features() * cfg.hidden_size,
    );
    let frozen = Arc::new(FrozenTarget::new(
        b.random_normal(&[v, h], 0.02, 1).unwrap(),
        b.random_normal(&[v, h], 0.02, 2).unwrap(),
    ));
    let params = DrafterParams::init_random(b.as_ref(), cfg, 0.02, 3).unwrap();
    let drafter = Drafter::new(b.clone(), cfg.clone(), params, frozen).unwrap();
    let hyper = AdamWHyper {
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
    };
    let opt = AdamW::new(b.as_ref(), cfg, hyper).unwrap();
    let mut replica = DrafterReplica::new(drafter, opt, shape.recompute, 1.0, u64::MAX).unwrap();
    let spec = BlockSpec {
        block_size: cfg.block_size,
        num_anchors: shape.anchors,
        gamma: 7.0,
        mask_token_id: cfg.mask_token_id,
        seed: 5,
    };
    let s = shape.seq_len;
    let micro: Vec<PreparedBatch> = (0..shape.batch)
        .map(|i| {
            let feats = b.random_normal(&[s, kh], 1.0, 10 + i as u64).unwrap();
            let seq = SeqMeta {
                sample_id: i as u64,
                ids: (0..s).map(|t| ((t * 7 + i) % (v - 1)) as u32).collect(),
                loss_mask: vec![1; s],
            };
            let mb = HiddenBatch {
                epoch: 0,
                step: 0,
                micro: i as u32,
                seqs: vec![seq],
                features: Some(Features::Tensor(feats)),
            };
            PreparedBatch::packed(mb, &spec).unwrap()
        })
        .collect();
    assert!(
        micro.iter().all(|p| p.anchors.len() == shape.anchors),
        "every sequence must give {} anchors",
        shape.anchors
    );
    start();
    for p in &micro {
        replica.accumulate(&p.as_input()).unwrap();
    }
    let summary = replica.finish_step(comm, 1e-3).unwrap();
    assert!(summary.applied, "the step was skipped: {summary:?}");
}
