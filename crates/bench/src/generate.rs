//! Decoding with the target, as `dflash regenerate` runs it: `dflash_models::generate` (KV
//! cache, continuous batching, greedy) on a random Qwen3-8B-shaped target, all 36 layers and
//! the LM head, at batch 1, 16 and 64: prompts of 512 tokens, 128 new tokens each, no EOS (so
//! every sequence runs to its length). The figure is the decode phase's new tokens per second
//! (each sequence's first token comes from its prefill, timed apart and reported in `detail`).
//!
//! Baseline: HF transformers `generate` on the same shapes, measured in the same device call
//! by `bench/hf_generate.py` and passed in with `--baselines FILE`. Without that file the
//! HBM roofline stands in (see `baselines.rs`): every decode step reads the weights once and
//! each sequence's bf16 KV cache.

use dflash_models::Qwen3Target;
use dflash_models::generate::{GenerateOptions, GenerateStats, Prompt, Sampling, generate};

use crate::util::SplitMix;
use crate::{Result, Scale, Suite};

const SEED: u64 = 0x6E6E_0DEC;
pub const BATCHES: [usize; 3] = [1, 16, 64];

pub fn name(batch: usize) -> String {
    format!("generate.8b.b{batch}")
}

pub fn figure_names() -> Vec<String> {
    BATCHES.iter().map(|&b| name(b)).collect()
}

/// `(prompt tokens, new tokens)` per sequence.
pub fn lengths(scale: Scale) -> (usize, usize) {
    match scale {
        Scale::Full => (512, 128),
        Scale::Smoke => (16, 6),
    }
}

/// One generation of `batch` sequences; its statistics.
fn run_once(target: &Qwen3Target, batch: usize, scale: Scale, seed: u64) -> Result<GenerateStats> {
    let (prompt, new) = lengths(scale);
    let vocab = target.config().vocab_size;
    let mut rng = SplitMix::new(seed);
    let prompts: Vec<Prompt> = (0..batch as u64)
        .map(|id| Prompt {
            id,
            ids: rng.tokens(prompt, vocab),
        })
        .collect();
    let opts = GenerateOptions {
        batch,
        capacity: prompt + new,
        max_new_tokens: new,
        // All prompts of a batch in one prefill call, as regenerate does within its budget.
        prefill_tokens: batch * prompt,
        eos: Vec::new(),
        sampling: Sampling::default(),
    };
    let mut finished = 0usize;
    let stats = generate(target, &opts, &mut prompts.into_iter(), &mut |g, _| {
        debug_assert_eq!(g.tokens.len(), new);
        finished += 1;
        Ok(())
    })?;
    if finished != batch || stats.decode_tokens as usize != batch * (new - 1) {
        return Err(crate::BenchError::Invalid {
            bench: name(batch),
            detail: format!(
                "{finished} of {batch} sequences finished, {} decode tokens (want {})",
                stats.decode_tokens,
                batch * (new - 1)
            ),
        });
    }
    Ok(stats)
}

pub(crate) fn run(s: &mut Suite<'_>) -> Result<()> {
    if !s.wants_any(&figure_names()) {
        return Ok(());
    }
    let cfg = crate::target::config(s.opts.scale);
    let last = cfg.num_hidden_layers - 1;
    let detail_shape = format!(
        "hidden {}, {} layers, {}/{} heads, d={}, MLP {}, vocab {}",
        cfg.hidden_size,
        cfg.num_hidden_layers,
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim,
        cfg.intermediate_size,
        cfg.vocab_size
    );
    let target = Qwen3Target::random(s.backend.clone(), cfg, &[last], SEED)?;
    let (prompt, new) = lengths(s.opts.scale);
    let timing = s.timing(crate::Timing { warmup: 1, runs: 1 });
    for batch in BATCHES {
        let n = name(batch);
        if !s.wants(&n) {
            continue;
        }
        for w in 0..timing.warmup {
            run_once(&target, batch, s.opts.scale, SEED ^ w as u64)?;
        }
        let mut runs: Vec<GenerateStats> = (0..timing.runs)
            .map(|r| run_once(&target, batch, s.opts.scale, SEED + 1 + r as u64))
            .collect::<Result<_>>()?;
        runs.sort_by(|a, b| a.decode_tokens_per_s().total_cmp(&b.decode_tokens_per_s()));
        let st = &runs[runs.len() / 2];
        let decode_s = st.decode_time.as_secs_f64();
        let detail = format!(
            "batch {batch} x ({prompt} prompt + {new} new tokens), greedy, KV cache; \
             decode {:.3} s in {} steps ({:.2} ms/step), prefill {:.3} s ({:.0} tok/s); {}; \
             baseline: {}",
            decode_s,
            st.decode_steps,
            1e3 * decode_s / st.decode_steps.max(1) as f64,
            st.prefill_time.as_secs_f64(),
            st.prompt_tokens as f64 / st.prefill_time.as_secs_f64().max(1e-9),
            detail_shape,
            if s.opts.measured_baseline(&n).is_some() {
                "HF generate in this run"
            } else {
                "HBM roofline (no --baselines file)"
            }
        );
        s.record(&n, st.decode_tokens_per_s(), decode_s, detail)?;
    }
    Ok(())
}
