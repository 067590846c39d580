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

/// Forward FLOPs of one causal sequence of `len` tokens through the first `layers` layers of
/// `cfg`, and its LM head where `lm_head`: 2 per weight per token for the projections, the
/// MLP and the head, and 4 x heads x d per visible (query, key) pair for attention.
pub fn forward_flops(cfg: &Qwen3Config, layers: usize, len: usize, lm_head: bool) -> f64 {
    let (h, i) = (cfg.hidden_size as f64, cfg.intermediate_size as f64);
    let (q, kv) = (
        (cfg.num_attention_heads * cfg.head_dim) as f64,
        (cfg.num_key_value_heads * cfg.head_dim) as f64,
    );
    let weights = h * q + 2.0 * h * kv + q * h + 3.0 * h * i;
    let pairs = (len * (len + 1) / 2) as f64;
    let per_layer = 2.0 * weights * len as f64 + 4.0 * q * pairs;
    let head = if lm_head {
        2.0 * h * cfg.vocab_size as f64 * len as f64
    } else {
        0.0
    };
    layers as f64 * per_layer + head
}

/// What the figure adds about its work against its anchor's: HF's forward runs every layer
/// and the LM head, this one (as the job's target workers) stops at the last feature layer,
/// so the tok/s ratio flatters it; TFLOP/s against TFLOP/s does not.
fn work_note(scale: Scale, cfg: &Qwen3Config, n: usize, len: usize, secs: f64) -> String {
    let ours = forward_flops(cfg, LAYER_IDS[4] + 1, len, false);
    let full = forward_flops(cfg, cfg.num_hidden_layers, len, true);
    let tflops = n as f64 * ours / secs / 1e12;
    // The anchor was measured at the full shape only.
    let anchor = crate::baseline(NAME).filter(|_| scale == Scale::Full);
    let Some(anchor) = anchor else {
        return format!("; {tflops:.0} TFLOP/s");
    };
    // The anchor's K tok/s at the full model's work a token.
    let anchor_tflops = anchor.value * 1e3 * full / len as f64 / 1e12;
    format!(
        "; {tflops:.0} TFLOP/s on {:.2} GFLOP a token, where the anchor's forward (every layer \
         and the LM head) does {:.2}: like for like, {anchor_tflops:.0} TFLOP/s there, {:.2}x",
        ours / len as f64 / 1e9,
        full / len as f64 / 1e9,
        tflops / anchor_tflops
    )
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
        "{n} x {len} tokens, hidden {}, {} of {} layers, {}/{} heads, d={}, MLP {}, vocab {} (no LM \
         head)",
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
    let target = Qwen3Target::random(s.backend.clone(), cfg.clone(), &LAYER_IDS, SEED)?;
    let b = s.backend.clone();
    let t = crate::median_seconds(b.as_ref(), timing, || {
        for ids in &seqs {
            target.features(ids)?;
        }
        Ok(())
    })?;
    drop(target);
    let detail = detail + &work_note(s.opts.scale, &cfg, n, len, t);
    s.record(NAME, (n * len) as f64 / t / 1e3, t, detail)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Qwen3-8B forward of 4096 tokens, counted by hand: 36 layers of 192.9 M weights
    /// (q and o 16.8 M each, k and v 4.2 M each, MLP 151.0 M) and causal attention, and the
    /// 622.3 M-weight head. Its weights alone, 2 FLOP each a token, at the anchor's 30.5 K
    /// tok/s are the 461 TFLOP/s the anchor's description names (it leaves attention out).
    #[test]
    fn the_full_forward_is_the_anchors_work() {
        let cfg = config(Scale::Full);
        let full = forward_flops(&cfg, 36, 4096, true) / 4096.0;
        let weights = 36.0 * 192_937_984.0 + 4096.0 * 151_936.0;
        let by_hand = 2.0 * weights + 36.0 * 4.0 * 4096.0 * 4097.0 / 2.0;
        assert!(
            (full - by_hand).abs() / by_hand < 1e-12,
            "{full} vs {by_hand}"
        );
        let anchor_weights_only = 30.5e3 * 2.0 * weights / 1e12;
        assert!(
            (anchor_weights_only - 461.0).abs() < 2.0,
            "{anchor_weights_only}"
        );
        let ours = forward_flops(&cfg, 34, 4096, false) / 4096.0;
        assert!(ours < 0.9 * full, "{ours} vs {full}");
    }
}
