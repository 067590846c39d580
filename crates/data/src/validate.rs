//! Validation of samples against the target's vocabulary and the run's length limits. Bad
//! samples are skipped and counted per reason, never fatal; [`SkipCounts`] keeps the first
//! offender of each kind for the warning message.

use std::fmt;

use crate::Sample;
use crate::error::DataError;

/// What to do with a sample longer than `max_len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TooLongPolicy {
    /// Keep the first `max_len` tokens (default).
    #[default]
    Truncate,
    /// Drop the sample.
    Skip,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SkipReason {
    /// Longer than `max_len` under [`TooLongPolicy::Skip`].
    TooLong { len: usize, max_len: usize },
    /// Fewer supervised tokens than required, or no two adjacent supervised positions (no
    /// anchor possible). Counted after truncation.
    TooFewSupervised {
        supervised: usize,
        anchor_candidates: usize,
        min_supervised: usize,
    },
    /// A token id `>= vocab_size` (the first one in the sample).
    IdOutOfVocab {
        position: usize,
        id: u32,
        vocab_size: usize,
    },
    /// `ids` and `loss_mask` differ in length (only possible for hand-built samples).
    LengthMismatch { ids_len: usize, mask_len: usize },
    /// Kept (after truncation) longer than the target's `max_position_embeddings`: its
    /// positions would lie past what the RoPE was trained for.
    BeyondMaxPositions { len: usize, max_positions: usize },
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SkipReason::TooLong { len, max_len } => {
                write!(f, "{len} tokens > max_len {max_len} (policy: skip)")
            }
            SkipReason::TooFewSupervised {
                supervised,
                anchor_candidates,
                min_supervised,
            } => {
                write!(
                    f,
                    "too few supervised tokens: {supervised} supervised (need >= {min_supervised}), \
                     {anchor_candidates} adjacent supervised pairs (need >= 1 for an anchor)"
                )
            }
            SkipReason::IdOutOfVocab {
                position,
                id,
                vocab_size,
            } => {
                write!(
                    f,
                    "token id {id} at position {position} >= vocab_size {vocab_size}"
                )
            }
            SkipReason::LengthMismatch { ids_len, mask_len } => {
                write!(f, "{ids_len} ids but {mask_len} loss-mask entries")
            }
            SkipReason::BeyondMaxPositions { len, max_positions } => {
                write!(f, "{len} tokens > max_position_embeddings {max_positions}")
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// Usable as is.
    Keep(Sample),
    /// Usable after truncation to `max_len` (already applied to `sample`).
    Truncated { sample: Sample, original_len: usize },
    /// Not usable.
    Skip { id: u64, reason: SkipReason },
}

impl Verdict {
    /// A kept sample longer than `max_positions` becomes a
    /// [`SkipReason::BeyondMaxPositions`] skip; every other verdict is unchanged.
    pub fn within_positions(self, max_positions: usize) -> Verdict {
        let len = match &self {
            Verdict::Keep(s) | Verdict::Truncated { sample: s, .. } => s.ids.len(),
            Verdict::Skip { .. } => return self,
        };
        if len <= max_positions {
            return self;
        }
        let id = match &self {
            Verdict::Keep(s) | Verdict::Truncated { sample: s, .. } => s.id,
            Verdict::Skip { id, .. } => *id,
        };
        Verdict::Skip {
            id,
            reason: SkipReason::BeyondMaxPositions { len, max_positions },
        }
    }

    /// The sample to train on, if any.
    pub fn into_sample(self) -> Option<Sample> {
        match self {
            Verdict::Keep(s) | Verdict::Truncated { sample: s, .. } => Some(s),
            Verdict::Skip { .. } => None,
        }
    }

    pub fn is_skip(&self) -> bool {
        matches!(self, Verdict::Skip { .. })
    }
}

/// Number of anchor candidates: positions `i` with `mask[i] == 1 && mask[i+1] == 1`.
pub fn anchor_candidates(loss_mask: &[u8]) -> usize {
    loss_mask
        .windows(2)
        .filter(|w| w[0] != 0 && w[1] != 0)
        .count()
}

/// Checks one sample, in this order:
/// 1. `ids.len() != loss_mask.len()` -> skip ([`SkipReason::LengthMismatch`]);
/// 2. any id `>= vocab_size` (whole sample, before truncation: such ids mean a tokenizer
///    mismatch) -> skip ([`SkipReason::IdOutOfVocab`], first offending position);
/// 3. longer than `max_len` -> truncate to `max_len` or skip, per `policy`;
/// 4. (after truncation) fewer than `max(min_supervised, 2)` supervised tokens, or no two
///    adjacent supervised positions -> skip ([`SkipReason::TooFewSupervised`]).
pub fn validate(
    sample: Sample,
    vocab_size: usize,
    max_len: usize,
    min_supervised: usize,
    policy: TooLongPolicy,
) -> Verdict {
    let id = sample.id;
    if sample.ids.len() != sample.loss_mask.len() {
        let reason = SkipReason::LengthMismatch {
            ids_len: sample.ids.len(),
            mask_len: sample.loss_mask.len(),
        };
        return Verdict::Skip { id, reason };
    }
    if let Some(position) = sample.ids.iter().position(|&t| t as usize >= vocab_size) {
        let reason = SkipReason::IdOutOfVocab {
            position,
            id: sample.ids[position],
            vocab_size,
        };
        return Verdict::Skip { id, reason };
    }
    let original_len = sample.ids.len();
    let mut sample = sample;
    let truncated = original_len > max_len;
    if truncated {
        match policy {
            TooLongPolicy::Skip => {
                return Verdict::Skip {
                    id,
                    reason: SkipReason::TooLong {
                        len: original_len,
                        max_len,
                    },
                };
            }
            TooLongPolicy::Truncate => {
                sample.ids.truncate(max_len);
                sample.loss_mask.truncate(max_len);
            }
        }
    }
    let supervised = sample.loss_mask.iter().filter(|&&m| m != 0).count();
    let candidates = anchor_candidates(&sample.loss_mask);
    if supervised < min_supervised.max(2) || candidates == 0 {
        let reason = SkipReason::TooFewSupervised {
            supervised,
            anchor_candidates: candidates,
            min_supervised: min_supervised.max(2),
        };
        return Verdict::Skip { id, reason };
    }
    if truncated {
        Verdict::Truncated {
            sample,
            original_len,
        }
    } else {
        Verdict::Keep(sample)
    }
}

/// The first out-of-vocabulary id seen (smallest sample index after [`SkipCounts::merge`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OutOfVocab {
    pub sample: u64,
    pub position: usize,
    pub id: u32,
    pub vocab_size: usize,
}

/// A kept sample holding the drafter's mask token id: a warning, not a skip (the sample
/// trains, but in its context the drafter cannot tell that token from a masked position).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MaskTokenInData {
    pub sample: u64,
    pub position: usize,
    pub id: u32,
}

/// Per-reason counters. `kept + skipped() == seen`. A checkpoint carries its run's counts
/// as JSON (serde), so a resumed run can report the run's next to its own.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SkipCounts {
    pub seen: u64,
    pub kept: u64,
    /// Kept, but cut to `max_len` (included in `kept`).
    pub too_long_truncated: u64,
    pub too_long_skipped: u64,
    pub too_few_supervised: u64,
    pub id_out_of_vocab: u64,
    pub beyond_max_positions: u64,
    /// Unreadable samples ([`DataError`] from `Dataset::get`) and length mismatches.
    pub malformed: u64,
    pub first_out_of_vocab: Option<OutOfVocab>,
    /// `(sample index, message)` of the first malformed sample.
    pub first_malformed: Option<(u64, String)>,
    /// Kept samples holding the mask token id (included in `kept`; a warning).
    pub mask_token_in_data: u64,
    /// The first of them (smallest sample index after [`SkipCounts::merge`]).
    pub first_mask_token: Option<MaskTokenInData>,
}

impl SkipCounts {
    pub fn record(&mut self, verdict: &Verdict) {
        self.seen += 1;
        match verdict {
            Verdict::Keep(_) => self.kept += 1,
            Verdict::Truncated { .. } => {
                self.kept += 1;
                self.too_long_truncated += 1;
            }
            Verdict::Skip { id, reason } => match reason {
                SkipReason::TooLong { .. } => self.too_long_skipped += 1,
                SkipReason::TooFewSupervised { .. } => self.too_few_supervised += 1,
                SkipReason::IdOutOfVocab {
                    position,
                    id: tok,
                    vocab_size,
                } => {
                    self.id_out_of_vocab += 1;
                    let oov = OutOfVocab {
                        sample: *id,
                        position: *position,
                        id: *tok,
                        vocab_size: *vocab_size,
                    };
                    if self
                        .first_out_of_vocab
                        .is_none_or(|f| oov.sample < f.sample)
                    {
                        self.first_out_of_vocab = Some(oov);
                    }
                }
                SkipReason::LengthMismatch { .. } => self.note_malformed(*id, reason.to_string()),
                SkipReason::BeyondMaxPositions { .. } => self.beyond_max_positions += 1,
            },
        }
    }

    /// Counts a kept `sample` that holds `mask_token_id`; `Some` with where, when it does.
    pub fn record_mask_token(
        &mut self,
        sample: &Sample,
        mask_token_id: u32,
    ) -> Option<MaskTokenInData> {
        let position = sample.ids.iter().position(|&t| t == mask_token_id)?;
        let seen = MaskTokenInData {
            sample: sample.id,
            position,
            id: mask_token_id,
        };
        self.mask_token_in_data += 1;
        if self.first_mask_token.is_none_or(|f| seen.sample < f.sample) {
            self.first_mask_token = Some(seen);
        }
        Some(seen)
    }

    /// Counts a sample that could not be read at all (`sample` is its index).
    pub fn record_error(&mut self, sample: u64, error: &DataError) {
        self.seen += 1;
        self.note_malformed(sample, error.to_string());
    }

    fn note_malformed(&mut self, sample: u64, msg: String) {
        self.malformed += 1;
        if self
            .first_malformed
            .as_ref()
            .is_none_or(|(s, _)| sample < *s)
        {
            self.first_malformed = Some((sample, msg));
        }
    }

    pub fn skipped(&self) -> u64 {
        self.too_long_skipped
            + self.too_few_supervised
            + self.id_out_of_vocab
            + self.beyond_max_positions
            + self.malformed
    }

    /// Adds another worker's counts (first offenders: the smaller sample index wins).
    pub fn merge(&mut self, o: &SkipCounts) {
        self.seen += o.seen;
        self.kept += o.kept;
        self.too_long_truncated += o.too_long_truncated;
        self.too_long_skipped += o.too_long_skipped;
        self.too_few_supervised += o.too_few_supervised;
        self.id_out_of_vocab += o.id_out_of_vocab;
        self.beyond_max_positions += o.beyond_max_positions;
        self.malformed += o.malformed;
        self.mask_token_in_data += o.mask_token_in_data;
        let earlier = o
            .first_mask_token
            .filter(|f| self.first_mask_token.is_none_or(|s| f.sample < s.sample));
        if earlier.is_some() {
            self.first_mask_token = earlier;
        }
        let earlier = o
            .first_out_of_vocab
            .filter(|f| self.first_out_of_vocab.is_none_or(|s| f.sample < s.sample));
        if earlier.is_some() {
            self.first_out_of_vocab = earlier;
        }
        let earlier = o
            .first_malformed
            .as_ref()
            .filter(|(s, _)| self.first_malformed.as_ref().is_none_or(|(t, _)| s < t));
        if let Some(m) = earlier {
            self.first_malformed = Some(m.clone());
        }
    }
}

impl fmt::Display for SkipCounts {
    /// One line, e.g. `kept 2398/2400 (3 truncated to max_len); skipped 2: 1 too few
    /// supervised, 1 id out of vocab (first: sample 17, position 5, id 300 >= vocab 264)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "kept {}/{}", self.kept, self.seen)?;
        if self.too_long_truncated > 0 {
            write!(f, " ({} truncated to max_len)", self.too_long_truncated)?;
        }
        if let Some(m) = self.first_mask_token {
            write!(
                f,
                " ({} holding the mask token id {}, first: sample {}, position {})",
                self.mask_token_in_data, m.id, m.sample, m.position
            )?;
        }
        if self.skipped() == 0 {
            return Ok(());
        }
        write!(f, "; skipped {}:", self.skipped())?;
        let mut parts = Vec::new();
        if self.too_long_skipped > 0 {
            parts.push(format!("{} too long", self.too_long_skipped));
        }
        if self.too_few_supervised > 0 {
            parts.push(format!(
                "{} too few supervised tokens",
                self.too_few_supervised
            ));
        }
        if self.id_out_of_vocab > 0 {
            let mut s = format!("{} with ids out of vocab", self.id_out_of_vocab);
            if let Some(o) = self.first_out_of_vocab {
                s += &format!(
                    " (first: sample {}, position {}, id {} >= vocab_size {})",
                    o.sample, o.position, o.id, o.vocab_size
                );
            }
            parts.push(s);
        }
        if self.beyond_max_positions > 0 {
            parts.push(format!(
                "{} longer than max_position_embeddings",
                self.beyond_max_positions
            ));
        }
        if self.malformed > 0 {
            let mut s = format!("{} malformed", self.malformed);
            if let Some((_, m)) = &self.first_malformed {
                s += &format!(" (first: {m})");
            }
            parts.push(s);
        }
        write!(f, " {}", parts.join(", "))
    }
}
