//! `dflash regenerate`: the target writes the answers it is to be drafted for.
//!
//! For each conversation of a chat dataset (what `dflash prepare` reads), the target
//! writes every assistant turn again, turn by turn, each conditioned on the conversation
//! before it with the earlier assistant turns already its own ([`prompt`]), and answers a
//! final user or tool turn; `prepare` supervises every assistant turn, so none may keep
//! another model's text. Generation uses a KV cache, batched across samples
//! ([`dflash_models::generate`]), greedy or sampled, stopping at EOS (the ids of
//! `generation_config.json`, else `config.json`, and `tokenizer_config.json`'s `eos_token`),
//! `max_new_tokens` or the capacity. An answer cut by `max_new_tokens` or the capacity
//! drops its sample unless `keep_truncated` is set (the chat template would close the
//! cut answer with an end of turn the target never wrote), except a later turn's answer cut
//! by the capacity: a conversation whose later turn no longer fits the capacity (earlier
//! answers count against it), its prompt or its answer, is written up to its last whole
//! answer. Each finished conversation is appended to a JSONL file in the OpenAI `messages`
//! form, and each dropped sample recorded beside it ([`output`]). A restart with the same
//! settings skips the samples already written or dropped. A reader thread renders and tokenizes
//! first-turn prompts ahead of the generation through a bounded channel; the dataset itself
//! is read as [`Input`] reads it (a JSONL file whole, Parquet and Arrow files a batch at a
//! time).

mod eos;
mod error;
mod memory;
pub mod output;
pub mod prompt;
mod run;
mod turns;

use std::fmt;
use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;

use dflash_config::Qwen3Config;
use dflash_core::Backend;
use dflash_models::Qwen3Target;
use dflash_models::generate::{GenerateOptions, GenerateStats, Sampling};
use dflash_prepare::{Input, Preparer};
use serde_json::{Value, json};

pub use error::RegenerateError;
use error::io_err;
use output::Output;

/// Prompt tokens the default capacity leaves room for, besides `max_new_tokens`: a bound
/// on the KV cache (which holds `batch x capacity` tokens of every layer in f32) that fits
/// an 8B target at batch 16 on one 80 GB GPU. Longer prompts need `--capacity`.
pub const DEFAULT_PROMPT_TOKENS: usize = 4096;

/// What to regenerate and how.
#[derive(Debug, Clone)]
pub struct RegenerateOptions {
    /// Target directory: `config.json`, weights, `tokenizer.json`, `tokenizer_config.json`,
    /// optionally `generation_config.json` (its `eos_token_id`, with `tokenizer_config.json`'s
    /// `eos_token`, ends answers).
    pub target: PathBuf,
    /// A chat template file to use instead of the target's.
    pub chat_template: Option<PathBuf>,
    /// The chat dataset (see [`Input::open`]).
    pub data: PathBuf,
    /// The output JSONL file; an existing one is continued (see [`output`]).
    pub out: PathBuf,
    /// Sequences decoded together.
    pub batch: usize,
    /// New tokens an answer may have (each turn's).
    pub max_new_tokens: usize,
    /// Tokens a sequence may hold, prompt and answer; `None`: [`default_capacity`]. A
    /// sample whose first prompt is longer is skipped; one whose later prompt is (the
    /// earlier answers are in it), or whose later answer it cuts, is written up to its
    /// last whole answer.
    pub capacity: Option<usize>,
    /// Prompt tokens prefilled in one call, at most.
    pub prefill_tokens: usize,
    pub sampling: Sampling,
    /// Write conversations with an answer cut by `max_new_tokens` or the capacity (their
    /// `finish_reason` says so) instead of dropping them.
    pub keep_truncated: bool,
    /// Draw a progress bar on the terminal.
    pub progress: bool,
}

/// The capacity when none is given: [`DEFAULT_PROMPT_TOKENS`] plus `max_new_tokens`, at
/// most the target's `max_position_embeddings`.
pub fn default_capacity(max_position_embeddings: usize, max_new_tokens: usize) -> usize {
    DEFAULT_PROMPT_TOKENS
        .saturating_add(max_new_tokens)
        .min(max_position_embeddings)
}

/// What a regeneration did.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    /// Samples read.
    pub samples: usize,
    /// Samples an earlier run handled: written to the output, or dropped.
    pub resumed: usize,
    /// Of `resumed`, those an earlier run dropped (its record of drops says so).
    pub resumed_skipped: usize,
    /// Samples written by this run.
    pub generated: usize,
    /// `(sample index, reason)` of the samples written up to a turn whose prompt outgrew
    /// the capacity or whose answer it cut, without their later turns (also in
    /// `generated`), by index.
    pub shortened: Vec<(u64, String)>,
    /// Answers (assistant turns) generated, written or not, by how they ended.
    pub turns: usize,
    pub finished_eos: usize,
    pub finished_max_new_tokens: usize,
    pub finished_capacity: usize,
    /// Samples dropped because an answer was cut by `max_new_tokens` or the capacity (also
    /// in `skipped`; `keep_truncated` writes them instead).
    pub truncated: usize,
    /// `(sample index, reason)` of every skipped sample, by index.
    pub skipped: Vec<(u64, String)>,
    pub stats: GenerateStats,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.stats;
        write!(
            f,
            "samples: {} read, {} generated",
            self.samples, self.generated
        )?;
        if !self.shortened.is_empty() {
            write!(
                f,
                " ({} shortened: a later turn outgrew --capacity)",
                self.shortened.len()
            )?;
        }
        write!(f, ", {} already done", self.resumed)?;
        if self.resumed_skipped > 0 {
            write!(f, " ({} of them skipped before)", self.resumed_skipped)?;
        }
        write!(f, ", {} skipped", self.skipped.len())?;
        if self.truncated > 0 {
            write!(
                f,
                " ({} for an answer cut by max_new_tokens or capacity; --keep-truncated \
                 writes them)",
                self.truncated
            )?;
        }
        writeln!(f)?;
        writeln!(
            f,
            "answers: {}, ended by: eos {}, max_new_tokens {}, capacity {}",
            self.turns, self.finished_eos, self.finished_max_new_tokens, self.finished_capacity
        )?;
        writeln!(
            f,
            "tokens: {} prompt, {} new; prefill {:.2} s in {} calls, decode {:.2} s in {} steps \
             ({:.0} tok/s)",
            s.prompt_tokens,
            s.new_tokens(),
            s.prefill_time.as_secs_f64(),
            s.prefill_calls,
            s.decode_time.as_secs_f64(),
            s.decode_steps,
            s.decode_tokens_per_s()
        )?;
        for (i, r) in self.shortened.iter().take(10) {
            writeln!(f, "  shortened sample {i}: {r}")?;
        }
        for (i, r) in self.skipped.iter().take(10) {
            writeln!(f, "  skipped sample {i}: {r}")?;
        }
        Ok(())
    }
}

/// Regenerates `opts.data` with the target of `opts.target` on `backend`.
pub fn regenerate(
    backend: Arc<dyn Backend>,
    opts: &RegenerateOptions,
) -> Result<Summary, RegenerateError> {
    let preparer = Preparer::from_target_dir(&opts.target, opts.chat_template.as_deref())?;
    let cfg = Qwen3Config::from_file(opts.target.join("config.json"))?;
    let gen_opts = generate_options(opts, &cfg)?;
    let unchecked = memory::check_kv_cache(
        backend.as_ref(),
        &cfg,
        &gen_opts,
        " before the target loads",
    )?;
    // Said once: the check after the load has no more to go on.
    if let Some(note) = unchecked {
        eprintln!("regenerate: note: {note}");
    }
    let input = Input::open(&opts.data)?;
    let mut out = Output::open(&opts.out, &meta(opts, backend.name(), &input, &gen_opts)?)?;
    let last = cfg.num_hidden_layers.saturating_sub(1);
    let target = Qwen3Target::load(backend.clone(), &opts.target, &[last])?;
    memory::check_kv_cache(backend.as_ref(), &cfg, &gen_opts, " with the target loaded")?;
    let settings = run::Settings {
        capacity: gen_opts.capacity,
        keep_truncated: opts.keep_truncated,
        progress: opts.progress,
    };
    run::run(&target, &preparer, &input, &gen_opts, &mut out, &settings)
}

/// The generation knobs, checked, with the target's EOS ids and capacity filled in.
fn generate_options(
    opts: &RegenerateOptions,
    cfg: &Qwen3Config,
) -> Result<GenerateOptions, RegenerateError> {
    let max_pos = cfg.max_position_embeddings;
    let capacity = opts
        .capacity
        .unwrap_or_else(|| default_capacity(max_pos, opts.max_new_tokens));
    if capacity > max_pos {
        return Err(RegenerateError::Input(format!(
            "capacity {capacity} exceeds the target's max_position_embeddings {max_pos}"
        )));
    }
    let g = GenerateOptions {
        batch: opts.batch,
        capacity,
        max_new_tokens: opts.max_new_tokens,
        prefill_tokens: opts.prefill_tokens,
        eos: eos::eos_ids(&opts.target, cfg)?,
        sampling: opts.sampling,
    };
    g.validate()?;
    Ok(g)
}

/// What the output's results depend on: a restart must match it (see [`output`]).
fn meta(
    opts: &RegenerateOptions,
    backend: &str,
    input: &Input,
    g: &GenerateOptions,
) -> Result<Value, RegenerateError> {
    let canon = |p: &Path| {
        std::fs::canonicalize(p)
            .map(|p| p.display().to_string())
            .map_err(io_err(p))
    };
    Ok(json!({
        "target": canon(&opts.target)?,
        "chat_template": opts.chat_template.as_deref().map(canon).transpose()?,
        // The files read, not the path given: a pattern names no file of its own.
        "data": input.files().iter().map(|f| canon(f)).collect::<Result<Vec<_>, _>>()?,
        "turns": "all",
        // Backends round the logits differently (GEMM algorithms, precisions), so a near
        // tie can go another way on another one.
        "backend": backend,
        "capacity": g.capacity,
        "max_new_tokens": g.max_new_tokens,
        "eos_token_id": g.eos,
        "keep_truncated": opts.keep_truncated,
        "temperature": g.sampling.temperature,
        "top_k": g.sampling.top_k,
        "top_p": g.sampling.top_p,
        "seed": g.sampling.seed,
    }))
}
