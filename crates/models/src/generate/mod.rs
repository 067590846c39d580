//! Autoregressive generation with the target: a KV cache of fixed slots ([`cache`]) filled
//! by continuous batching, and next-token choice ([`sample`]).
//!
//! Each round prefills the prompts that got a free slot (up to a token budget) in one call,
//! then runs one decode step for every other active slot: one new token per sequence, each
//! attending to its own slot ([`dflash_core::AttentionOps::attention_rows`]). A sequence
//! stops at an EOS token (kept in its output, as HF `generate` keeps it), after
//! `max_new_tokens`, or when its slot is full; its slot then takes the next prompt. What a
//! sequence generates does not depend on what it is batched with, up to the rounding of
//! batched GEMMs (greedy), and sampling draws from a stream of its own ([`Sampling`]).

pub mod cache;
pub mod sample;

use std::time::{Duration, Instant};

use rand_chacha::ChaCha8Rng;

use crate::error::{ModelError, Result};
use crate::target::Qwen3Target;

pub use cache::KvCache;
pub use sample::{Sampling, argmax};

/// What to generate and how.
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    /// Sequences decoded together (the cache's slots).
    pub batch: usize,
    /// Tokens a sequence may hold, prompt and output together (the cache's slot size).
    pub capacity: usize,
    pub max_new_tokens: usize,
    /// Prompt tokens prefilled in one call, at most (a single longer prompt goes alone):
    /// bounds the activations of a prefill.
    pub prefill_tokens: usize,
    /// Tokens that end a sequence.
    pub eos: Vec<u32>,
    pub sampling: Sampling,
}

/// One prompt; `id` names it in the output and seeds its sampling stream.
#[derive(Debug, Clone)]
pub struct Prompt {
    pub id: u64,
    pub ids: Vec<u32>,
}

/// Why a sequence stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// It produced an EOS token (the last of its tokens).
    Eos,
    /// It reached `max_new_tokens`.
    MaxNewTokens,
    /// Its slot is full: prompt and output together reached `capacity` tokens.
    Capacity,
}

impl Finish {
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Eos => "eos",
            Finish::MaxNewTokens => "max_new_tokens",
            Finish::Capacity => "capacity",
        }
    }
}

/// One finished sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generated {
    pub id: u64,
    pub prompt_len: usize,
    /// The new tokens, EOS included where it ended the sequence.
    pub tokens: Vec<u32>,
    pub finish: Finish,
}

/// What a generation did, by phase.
#[derive(Debug, Clone, Default)]
pub struct GenerateStats {
    pub sequences: u64,
    pub prompt_tokens: u64,
    /// Tokens chosen from a prefill's logits (each sequence's first).
    pub prefill_new_tokens: u64,
    /// Tokens chosen by decode steps.
    pub decode_tokens: u64,
    pub prefill_calls: u64,
    pub decode_steps: u64,
    pub prefill_time: Duration,
    pub decode_time: Duration,
}

impl GenerateStats {
    pub fn new_tokens(&self) -> u64 {
        self.prefill_new_tokens + self.decode_tokens
    }
    /// Tokens per second of the decode steps alone.
    pub fn decode_tokens_per_s(&self) -> f64 {
        self.decode_tokens as f64 / self.decode_time.as_secs_f64().max(1e-9)
    }
}

/// A sequence in a slot.
struct Active {
    id: u64,
    prompt_len: usize,
    tokens: Vec<u32>,
    rng: ChaCha8Rng,
}

impl GenerateOptions {
    /// Checks the knobs (what [`generate`] checks first): every count at least 1, a
    /// capacity of at least 2 (one prompt token and one new token), valid sampling.
    pub fn validate(&self) -> Result<()> {
        if self.batch == 0
            || self.capacity < 2
            || self.max_new_tokens == 0
            || self.prefill_tokens == 0
        {
            return Err(ModelError::Input(format!(
                "generation: batch ({}), max_new_tokens ({}) and prefill_tokens ({}) must each \
                 be at least 1, and capacity ({}) at least 2",
                self.batch, self.max_new_tokens, self.prefill_tokens, self.capacity
            )));
        }
        self.sampling.validate()
    }
}

/// Generates a continuation of every prompt `prompts` yields (pulled as slots free up, so a
/// dataset streams through) and hands each finished sequence to `done`, in the order they
/// finish. A sequence's prompt and new tokens together never exceed `capacity`, so a prompt
/// must be shorter than `capacity`: an empty prompt or a longer one is an error naming it
/// (callers skip those first). Non-finite logits are an error naming the sequence (greedy
/// decoding would otherwise pick token 0 of a NaN row and write it as an answer).
pub fn generate(
    target: &Qwen3Target,
    opts: &GenerateOptions,
    prompts: &mut dyn Iterator<Item = Prompt>,
    done: &mut dyn FnMut(Generated, &GenerateStats) -> Result<()>,
) -> Result<GenerateStats> {
    opts.validate()?;
    let mut run = Run {
        target,
        opts,
        cache: target.kv_cache(opts.batch, opts.capacity)?,
        slots: (0..opts.batch).map(|_| None).collect(),
        stats: GenerateStats::default(),
        held: None,
    };
    loop {
        let decoding: Vec<usize> = (0..run.slots.len())
            .filter(|&s| run.slots[s].is_some())
            .collect();
        let admitted = run.admit(prompts)?;
        if decoding.is_empty() && admitted.is_empty() {
            return Ok(run.stats);
        }
        if !admitted.is_empty() {
            run.prefill(admitted, done)?;
        }
        if !decoding.is_empty() {
            run.decode(&decoding, done)?;
        }
    }
}

/// The state of one [`generate`] call.
struct Run<'a> {
    target: &'a Qwen3Target,
    opts: &'a GenerateOptions,
    cache: KvCache,
    slots: Vec<Option<Active>>,
    stats: GenerateStats,
    /// A prompt pulled but left for the next round (the prefill budget was spent).
    held: Option<Prompt>,
}

impl Run<'_> {
    /// Free slots take the next prompts, within the prefill budget: `(slot, prompt)`.
    fn admit(&mut self, prompts: &mut dyn Iterator<Item = Prompt>) -> Result<Vec<(usize, Prompt)>> {
        let mut admitted: Vec<(usize, Prompt)> = Vec::new();
        let mut budget = self.opts.prefill_tokens;
        for slot in 0..self.slots.len() {
            if self.slots[slot].is_some() {
                continue;
            }
            let Some(p) = self.held.take().or_else(|| prompts.next()) else {
                break;
            };
            if p.ids.is_empty() || p.ids.len() >= self.opts.capacity {
                return Err(ModelError::Sequence {
                    id: p.id,
                    detail: format!(
                        "its prompt has {} tokens: generation needs 1 to {} (the capacity {} \
                         less one, the room for an answer)",
                        p.ids.len(),
                        self.opts.capacity - 1,
                        self.opts.capacity
                    ),
                });
            }
            if !admitted.is_empty() && p.ids.len() > budget {
                self.held = Some(p);
                break;
            }
            budget = budget.saturating_sub(p.ids.len());
            self.cache.clear(slot)?;
            admitted.push((slot, p));
        }
        Ok(admitted)
    }

    fn prefill(
        &mut self,
        admitted: Vec<(usize, Prompt)>,
        done: &mut dyn FnMut(Generated, &GenerateStats) -> Result<()>,
    ) -> Result<()> {
        let t0 = Instant::now();
        let batch: Vec<(usize, &[u32])> = admitted.iter().map(|(s, p)| (*s, &p.ids[..])).collect();
        let hidden = self.target.extend(&mut self.cache, &batch)?;
        let slots: Vec<usize> = admitted.iter().map(|(s, _)| *s).collect();
        for (slot, p) in admitted {
            self.stats.prompt_tokens += p.ids.len() as u64;
            self.slots[slot] = Some(Active {
                id: p.id,
                prompt_len: p.ids.len(),
                tokens: Vec::new(),
                rng: self.opts.sampling.stream(p.id),
            });
        }
        let next = self.next_tokens(&hidden, &slots)?;
        self.stats.prefill_calls += 1;
        self.stats.prefill_new_tokens += slots.len() as u64;
        self.stats.prefill_time += t0.elapsed();
        self.advance(&slots, &next, done)
    }

    fn decode(
        &mut self,
        slots: &[usize],
        done: &mut dyn FnMut(Generated, &GenerateStats) -> Result<()>,
    ) -> Result<()> {
        let t0 = Instant::now();
        let last: Vec<u32> = slots
            .iter()
            .map(|&s| {
                *self
                    .active(s)
                    .tokens
                    .last()
                    .expect("an active sequence has a token")
            })
            .collect();
        let batch: Vec<(usize, &[u32])> = slots
            .iter()
            .zip(&last)
            .map(|(&s, t)| (s, std::slice::from_ref(t)))
            .collect();
        let hidden = self.target.extend(&mut self.cache, &batch)?;
        let next = self.next_tokens(&hidden, slots)?;
        self.stats.decode_steps += 1;
        self.stats.decode_tokens += slots.len() as u64;
        self.stats.decode_time += t0.elapsed();
        self.advance(slots, &next, done)
    }

    fn active(&mut self, slot: usize) -> &mut Active {
        self.slots[slot].as_mut().expect("slot holds a sequence")
    }

    /// The next token of each of `slots` from `hidden (n, H)`: greedy on the device (only
    /// the ids and a finiteness flag come back), else from the logits on the host.
    fn next_tokens(&mut self, hidden: &dflash_core::Tensor, slots: &[usize]) -> Result<Vec<u32>> {
        let b = self.target.backend().as_ref();
        let sampling = self.opts.sampling;
        if sampling.is_greedy() {
            // The argmax of a NaN row is some valid id (0 on the reference and CUDA
            // backends); finite hidden states give finite logits through finite weights
            // (the loader checks those).
            if !b.all_finite(hidden)? {
                return Err(self.non_finite_hidden(hidden, slots));
            }
            return Ok(b.linear_argmax(hidden, self.target.lm_head())?);
        }
        let logits = b.download(&self.target.head_logits(hidden)?)?;
        let vocab = logits.len() / slots.len().max(1);
        slots
            .iter()
            .zip(logits.chunks(vocab))
            .map(|(&s, row)| {
                let a = self.active(s);
                sampling
                    .pick(row, &mut a.rng)
                    .map_err(|e| ModelError::Sequence {
                        id: a.id,
                        detail: format!("generate: {e}"),
                    })
            })
            .collect()
    }

    /// The error for a non-finite `hidden (n, H)`, naming the first sequence whose row holds
    /// a NaN or infinity.
    fn non_finite_hidden(&mut self, hidden: &dflash_core::Tensor, slots: &[usize]) -> ModelError {
        let rows = match self.target.backend().download(hidden) {
            Ok(rows) => rows,
            Err(e) => return e.into(),
        };
        let width = rows.len() / slots.len().max(1);
        let bad = rows
            .chunks(width.max(1))
            .zip(slots)
            .find_map(|(row, &s)| Some((s, row.iter().copied().find(|x| !x.is_finite())?)));
        let why = "the target produced non-finite values, so its logits are non-finite and no \
                   token can be chosen";
        match bad {
            Some((s, x)) => ModelError::Sequence {
                id: self.active(s).id,
                detail: format!("generate: its final hidden state holds {x}: {why}"),
            },
            None => ModelError::Input(format!(
                "generate: a final hidden state holds a NaN or infinity: {why}"
            )),
        }
    }

    /// Appends each slot's token and hands over the sequences that finished.
    fn advance(
        &mut self,
        slots: &[usize],
        next: &[u32],
        done: &mut dyn FnMut(Generated, &GenerateStats) -> Result<()>,
    ) -> Result<()> {
        for (&slot, &t) in slots.iter().zip(next) {
            let held = self.cache.len(slot).ok_or_else(|| {
                ModelError::Input(format!("generate: slot {slot} is not in the cache"))
            })?;
            let (max_new, cap) = (self.opts.max_new_tokens, self.opts.capacity);
            let eos = self.opts.eos.contains(&t);
            let a = self.active(slot);
            a.tokens.push(t);
            let finish = if eos {
                Some(Finish::Eos)
            } else if a.tokens.len() >= max_new {
                Some(Finish::MaxNewTokens)
            } else if held + 1 >= cap {
                // `t` is not in the cache yet: the sequence is `held + 1` tokens long.
                Some(Finish::Capacity)
            } else {
                None
            };
            if let Some(finish) = finish {
                let a = self.slots[slot].take().expect("slot holds a sequence");
                self.stats.sequences += 1;
                let g = Generated {
                    id: a.id,
                    prompt_len: a.prompt_len,
                    tokens: a.tokens,
                    finish,
                };
                done(g, &self.stats)?;
            }
        }
        Ok(())
    }
}
