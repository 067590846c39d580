//! Acceptance length tau (docs/design.md §2.5), teacher-forced on data the target generated
//! greedily. Per cycle the drafter sees the features of committed tokens (positions < a),
//! takes the block `[token at a, MASK, ...]`, and the accepted count is the prefix of its
//! greedy predictions equal to the data tokens at `a+1..`; tau = accepted + 1, and the next
//! anchor is `a + accepted + 1`.
//!
//! A drafter's prediction for anchor `a` depends only on `a` (context `< a` and its own
//! block), so predictions for every possible anchor are computed in a few batched forwards
//! and the acceptance chain is then walked on the host.

use dflash_core::pipeline::HiddenSeq;
use dflash_models::{DraftInput, Drafter, ModelError};

use crate::error::{NonFiniteSource, Result, TrainError};

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TauReport {
    /// Mean over sequences of each sequence's mean tau per cycle.
    pub tau: f64,
    pub sequences: usize,
    pub cycles: usize,
    /// Per-sequence mean tau, in input order.
    pub per_sequence: Vec<f64>,
}

/// Anchors per batched forward: bounds the drafter's activation memory during evaluation.
const ANCHORS_PER_FORWARD: usize = 256;

/// Greedy predictions for the blocks anchored at `anchors`, each `len` slots long.
fn predict_blocks(
    drafter: &Drafter,
    seq: &HiddenSeq,
    anchors: &[i32],
    len: usize,
) -> Result<Vec<Vec<u32>>> {
    let mask_id = drafter.config().mask_token_id;
    let mut out = Vec::with_capacity(anchors.len());
    for chunk in anchors.chunks(ANCHORS_PER_FORWARD) {
        let rows = chunk.len() * len;
        let mut block_ids = vec![mask_id; rows];
        let mut positions = vec![0i32; rows];
        for (n, &a) in chunk.iter().enumerate() {
            block_ids[n * len] = seq.ids[a as usize];
            for j in 0..len {
                positions[n * len + j] = a + j as i32;
            }
        }
        let (labels, weights) = (vec![0u32; rows], vec![0f32; rows]);
        let input = DraftInput {
            features: seq.features.as_ref(),
            anchors: chunk,
            block_ids: &block_ids,
            positions: &positions,
            labels: &labels,
            weights: &weights,
            doc_starts: &[],
            ctx_positions: &[],
        };
        let pred = drafter.predict(&input).map_err(|e| match e {
            ModelError::NonFiniteOutput { .. } => non_finite(seq),
            e => e.into(),
        })?;
        out.extend(pred.chunks(len).map(|c| c.to_vec()));
    }
    Ok(out)
}

/// The error for a sequence whose predictions were non-finite, with where the NaN came from
/// (the features are scanned here only, on this error path).
fn non_finite(seq: &HiddenSeq) -> TrainError {
    let origin = match seq.features.to_host() {
        Ok(f) if f.iter().all(|x| x.is_finite()) => NonFiniteSource::Drafter,
        Ok(_) => NonFiniteSource::TargetFeatures,
        Err(e) => return e.into(),
    };
    TrainError::NonFiniteEval {
        sample_id: seq.sample_id,
        origin,
    }
}

/// Per-cycle committed-token counts for one sequence (the target's features are in
/// `seq.features`), counted as the serving loop counts them:
/// - a cycle commits `accepted + 1` tokens (the bonus token), but never more than the tokens
///   still to generate, so the last cycle is not over-counted;
/// - generation stops at the first stop token (EOS) of the completion, which is committed;
/// - blocks are whole (`block_size` slots) while generation ends at a stop token, as the loop
///   drafts them not knowing where it will stop (slots past the stop are compared with
///   nothing); where the data ends without one (a generation cut at its length limit) the
///   block is shortened to the tokens left (`min(block_size, S - a)` slots), as the loop
///   bounded by that limit drafts it.
pub fn sequence_cycles(
    drafter: &Drafter,
    seq: &HiddenSeq,
    stop_tokens: &[u32],
) -> Result<Vec<usize>> {
    let bs = drafter.config().block_size;
    let Some(p0) = seq.loss_mask.iter().position(|&m| m != 0) else {
        return Ok(Vec::new()); // no completion to draft
    };
    // The sequence as the loop would generate it: up to and including the first stop token.
    let stop = seq.ids[p0..].iter().position(|t| stop_tokens.contains(t));
    let s = stop.map_or(seq.ids.len(), |i| p0 + i + 1);
    if p0 + 1 >= s {
        return Ok(Vec::new());
    }
    // predictions[a - p0][j] = drafter's greedy token for position a + j
    let whole = |a: usize| stop.is_some() || a + bs <= s;
    let full: Vec<i32> = (p0..s - 1)
        .filter(|&a| whole(a))
        .map(|a| a as i32)
        .collect();
    let mut predictions = predict_blocks(drafter, seq, &full, bs)?;
    for a in (p0..s - 1).filter(|&a| !whole(a)) {
        predictions.extend(predict_blocks(drafter, seq, &[a as i32], s - a)?);
    }
    let mut cycles = Vec::new();
    let mut a = p0;
    while a + 1 < s {
        let pred = &predictions[a - p0];
        let accepted = (1..pred.len())
            .take_while(|&j| a + j < s && pred[j] == seq.ids[a + j])
            .count();
        cycles.push((accepted + 1).min(s - 1 - a));
        a += accepted + 1;
    }
    Ok(cycles)
}

/// Mean tau over sequences (each sequence weighted equally, as published numbers are); an
/// error when no sequence has a completion to draft (tau is never reported as NaN).
/// `stop_tokens` end generation like the serving loop's EOS (pass the target's EOS ids).
pub fn evaluate_tau(
    drafter: &Drafter,
    seqs: &[HiddenSeq],
    stop_tokens: &[u32],
) -> Result<TauReport> {
    let mut per_sequence = Vec::new();
    let mut cycles = 0;
    for seq in seqs {
        let c = sequence_cycles(drafter, seq, stop_tokens)?;
        if c.is_empty() {
            continue;
        }
        cycles += c.len();
        per_sequence.push(c.iter().sum::<usize>() as f64 / c.len() as f64);
    }
    if per_sequence.is_empty() {
        return Err(TrainError::NoEvalSequence { given: seqs.len() });
    }
    let tau = per_sequence.iter().sum::<f64>() / per_sequence.len() as f64;
    Ok(TauReport {
        tau,
        sequences: per_sequence.len(),
        cycles,
        per_sequence,
    })
}
