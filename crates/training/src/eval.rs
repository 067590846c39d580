//! Acceptance length tau (DESIGN.md §2.5), teacher-forced on data the target generated
//! greedily. Per cycle the drafter sees the features of committed tokens (positions < a),
//! takes the block `[token at a, MASK, ...]`, and the accepted count is the prefix of its
//! greedy predictions equal to the data tokens at `a+1..`; tau = accepted + 1, and the next
//! anchor is `a + accepted + 1`.
//!
//! A drafter's prediction for anchor `a` depends only on `a` (context `< a` and its own
//! block), so predictions for every possible anchor are computed in a few batched forwards
//! and the acceptance chain is then walked on the host.

use dflash_core::pipeline::HiddenSeq;
use dflash_models::{DraftInput, Drafter};

use crate::error::Result;

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

/// Per-cycle acceptance for one sequence (the target's features are in `seq.features`).
pub fn sequence_cycles(drafter: &Drafter, seq: &HiddenSeq) -> Result<Vec<usize>> {
    let cfg = drafter.config();
    let bs = cfg.block_size;
    let s = seq.ids.len();
    let Some(p0) = seq.loss_mask.iter().position(|&m| m != 0) else {
        return Ok(Vec::new()); // no completion to draft
    };
    if p0 + 1 >= s {
        return Ok(Vec::new());
    }
    // predictions[a - p0][j] = drafter's greedy token for position a + j
    let all: Vec<i32> = (p0 as i32..(s - 1) as i32).collect();
    let mut predictions: Vec<Vec<u32>> = Vec::with_capacity(all.len());
    for chunk in all.chunks(ANCHORS_PER_FORWARD) {
        let rows = chunk.len() * bs;
        let mut block_ids = vec![cfg.mask_token_id; rows];
        let mut positions = vec![0i32; rows];
        for (n, &a) in chunk.iter().enumerate() {
            block_ids[n * bs] = seq.ids[a as usize];
            for j in 0..bs {
                positions[n * bs + j] = a + j as i32;
            }
        }
        let (labels, weights) = (vec![0u32; rows], vec![0f32; rows]);
        let input = DraftInput {
            features: &seq.features,
            anchors: chunk,
            block_ids: &block_ids,
            positions: &positions,
            labels: &labels,
            weights: &weights,
        };
        let pred = drafter.predict(&input)?;
        predictions.extend(pred.chunks(bs).map(|c| c.to_vec()));
    }
    let mut cycles = Vec::new();
    let mut a = p0;
    while a + 1 < s {
        let pred = &predictions[a - p0];
        let mut accepted = 0;
        for j in 1..bs {
            if a + j < s && pred[j] == seq.ids[a + j] {
                accepted += 1;
            } else {
                break;
            }
        }
        cycles.push(accepted + 1);
        a += accepted + 1;
    }
    Ok(cycles)
}

/// Mean tau over sequences (each sequence weighted equally, as published numbers are).
pub fn evaluate_tau(drafter: &Drafter, seqs: &[HiddenSeq]) -> Result<TauReport> {
    let mut per_sequence = Vec::new();
    let mut cycles = 0;
    for seq in seqs {
        let c = sequence_cycles(drafter, seq)?;
        if c.is_empty() {
            continue;
        }
        cycles += c.len();
        per_sequence.push(c.iter().sum::<usize>() as f64 / c.len() as f64);
    }
    let tau = if per_sequence.is_empty() {
        f64::NAN
    } else {
        per_sequence.iter().sum::<f64>() / per_sequence.len() as f64
    };
    Ok(TauReport {
        tau,
        sequences: per_sequence.len(),
        cycles,
        per_sequence,
    })
}
