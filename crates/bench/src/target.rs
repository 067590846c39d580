//! The frozen target's forward at the Qwen3-8B shape: 4 sequences x 4096 tokens through
//! `Target::features` with the features of layers [1, 9, 17, 25, 33], so it stops after layer
//! 33 (34 of 36 layers) and never runs the LM head, as the pipeline's target workers do
//! (the features are downloaded to the host, which is part of what a worker does).

use dflash_config::Qwen3Config;
use dflash_core::pipeline::Target;
use dflash_models::Qwen3Target;

use crate::util::SplitMix;
use crate::{Result, Scale, Suite, Timing};

const SEED: u64 = 0x7A26_E7F0;
pub const NAME: &str = "target.forward.4x4096";
/// The drafter's default feature layers for a 36-layer target.
pub const LAYER_IDS: [usize; 5] = [1, 9, 17, 25, 33];

/// Qwen3-8B's shape (hidden 4096, 36 layers, 32/8 heads, d 128, MLP 12288, vocab 151936),
/// or a tiny model with the same layer count and head grouping.
pub fn config(scale: Scale) -> Qwen3Config {
    let (hidden, heads, kv_heads, head_dim, intermediate, vocab) = match scale {
        Scale::Full => (4096, 32, 8, 128, 12288, 151_936),
        Scale::Smoke => (64, 4, 1, 16, 192, 512),
    };
    Qwen3Config {
        model_type: "qwen3".into(),
        vocab_size: vocab,
        hidden_size: hidden,
        intermediate_size: intermediate,
        num_hidden_layers: 36,
        num_attention_heads: heads,
        num_key_value_heads: kv_heads,
        head_dim,
        rms_norm_eps: 1e-6,
        rope_theta: 1_000_000.0,
        max_position_embeddings: 40_960,
        tie_word_embeddings: false,
        bos_token_id: None,
        eos_token_id: None,
        dtype: Some("bfloat16".into()),
    }
}

/// `(sequences, tokens per sequence)`.
pub fn batch(scale: Scale) -> (usize, usize) {
    match scale {
        Scale::Full => (4, 4096),
        Scale::Smoke => (4, 64),
    }
}

pub fn figure_names() -> Vec<String> {
    vec![NAME.to_string()]
}

pub(crate) fn run(s: &mut Suite<'_>) -> Result<()> {
    if !s.wants(NAME) {
        return Ok(());
    }
    let timing = s.timing(match s.opts.scale {
        Scale::Full => Timing { warmup: 1, runs: 3 },
        Scale::Smoke => Timing { warmup: 1, runs: 3 },
    });
    let cfg = config(s.opts.scale);
    let (n, len) = batch(s.opts.scale);
    let detail = format!(
        "{n} x {len} tokens, hidden {}, {} of {} layers, {}/{} heads, d={}, MLP {}, vocab {}",
        cfg.hidden_size,
        LAYER_IDS[4] + 1,
        cfg.num_hidden_layers,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim,
        cfg.intermediate_size,
        cfg.vocab_size
    );
    let mut rng = SplitMix::new(SEED);
    let seqs: Vec<Vec<u32>> = (0..n).map(|_| rng.tokens(len, cfg.vocab_size)).collect();
    let target = Qwen3Target::random(s.backend.clone(), cfg, &LAYER_IDS, SEED)?;
    let b = s.backend.clone();
    let t = crate::median_seconds(b.as_ref(), timing, || {
        for ids in &seqs {
            target.features(ids)?;
        }
        Ok(())
    })?;
    drop(target);
    s.record(NAME, (n * len) as f64 / t / 1e3, t, detail)
}
