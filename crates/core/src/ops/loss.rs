use crate::{Error, Result, Tensor};

/// Statistics of a weighted cross-entropy over some rows. Sums, so they add across
/// micro-batches and ranks before the one global normalisation.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LossStats {
    /// `sum(w * CE)`.
    pub weighted_loss: f64,
    /// `sum(w)`.
    pub weight_sum: f64,
    /// Rows with `w > 0` whose argmax equals the label.
    pub correct: u64,
    /// Rows with `w > 0`.
    pub counted: u64,
}

impl LossStats {
    pub fn merge(&mut self, o: &LossStats) {
        self.weighted_loss += o.weighted_loss;
        self.weight_sum += o.weight_sum;
        self.correct += o.correct;
        self.counted += o.counted;
    }
    pub fn loss(&self) -> f64 {
        if self.weight_sum > 0.0 {
            self.weighted_loss / self.weight_sum
        } else {
            f64::NAN
        }
    }
    pub fn accuracy(&self) -> f64 {
        if self.counted > 0 {
            self.correct as f64 / self.counted as f64
        } else {
            f64::NAN
        }
    }
}

/// Fused linear cross-entropy against a frozen LM head: logits are produced and consumed in
/// row chunks, never as a whole `(T, V)` tensor, and rows with zero weight are skipped.
pub trait LossOps {
    /// `x (T, H)`, `w_head (V, H)`, one label and weight per row. Returns the stats and
    /// `dx = grad_scale * d(sum_t w_t * CE_t)/dx` (zero on skipped rows).
    fn linear_cross_entropy(
        &self,
        x: &Tensor,
        w_head: &Tensor,
        labels: &[u32],
        weights: &[f32],
        grad_scale: f32,
    ) -> Result<(LossStats, Tensor)>;

    /// Greedy tokens `argmax_v (x @ w_head^T)` per row, chunked like the loss.
    fn linear_argmax(&self, x: &Tensor, w_head: &Tensor) -> Result<Vec<u32>>;
}

/// The checked dims of a loss-head call: `x (T, H)` (leading dims folded into rows) against
/// `w_head (V, H)`. Every backend validates its operands here, so all report the same errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LossDims {
    /// `T`.
    pub rows: usize,
    /// `H`.
    pub hidden: usize,
    /// `V`.
    pub vocab: usize,
}

/// Rows per chunk of a fused loss that computes its f32 logits `(rows, V)` a chunk at a time
/// within `budget_bytes`: at most `max_rows`, and where at least `align` rows fit, a whole
/// number of `align` (the chunk is the row dimension of the products with the head, which
/// GEMM tiles round up). At least 1. Shared by a backend and the memory plan that models it.
pub fn logits_chunk_rows(
    budget_bytes: usize,
    vocab: usize,
    max_rows: usize,
    align: usize,
) -> usize {
    // Saturating: V is bounded only by usize (a (V, 0) head is empty), so V * 4 may not fit;
    // a row that cannot fit the budget gets the minimum chunk of 1 row.
    let rows = (budget_bytes / vocab.max(1).saturating_mul(4)).clamp(1, max_rows.max(1));
    if align > 0 && rows >= align {
        rows / align * align
    } else {
        rows
    }
}

impl LossDims {
    /// Checks `x (T, H)` against `w_head (V, H)`, and that the `(T, V)` logits have a
    /// representable element count; errors name `op` and `device`.
    pub fn of(op: &'static str, device: &str, x: &Tensor, w_head: &Tensor) -> Result<Self> {
        let (rows, hidden) = x.shape().as_matrix();
        let wd = w_head.dims();
        if wd.len() != 2 || wd[1] != hidden {
            return Err(Error::shape(
                op,
                device,
                format!(
                    "x {:?} has {hidden} columns but w_head {:?} must be (V, {hidden})",
                    x.shape(),
                    w_head.shape()
                ),
            ));
        }
        let vocab = wd[0];
        // x and w_head bound only T*H and V*H: with H = 0 both are empty whatever T and V, so
        // the (T, V) logits can be unrepresentable, and a wrapped count would size a chunk.
        crate::tensor::numel_or_overflow(&[rows, vocab]).map_err(|e| {
            Error::shape(
                op,
                device,
                format!(
                    "x {:?} @ w_head {:?}^T: logits ({rows}, {vocab}): {e}",
                    x.shape(),
                    w_head.shape()
                ),
            )
        })?;
        Ok(LossDims {
            rows,
            hidden,
            vocab,
        })
    }

    /// [`Self::of`] for [`LossOps::linear_cross_entropy`]: also one label and one weight per
    /// row of `x`.
    pub fn of_cross_entropy(
        op: &'static str,
        device: &str,
        x: &Tensor,
        w_head: &Tensor,
        labels: &[u32],
        weights: &[f32],
    ) -> Result<Self> {
        let dims = Self::of(op, device, x, w_head)?;
        if labels.len() != dims.rows || weights.len() != dims.rows {
            return Err(Error::shape(
                op,
                device,
                format!(
                    "x {:?} has {} rows but {} labels and {} weights",
                    x.shape(),
                    dims.rows,
                    labels.len(),
                    weights.len()
                ),
            ));
        }
        Ok(dims)
    }

    /// [`Self::of`] for [`LossOps::linear_argmax`]: an argmax needs at least one vocabulary row.
    pub fn of_argmax(op: &'static str, device: &str, x: &Tensor, w_head: &Tensor) -> Result<Self> {
        let dims = Self::of(op, device, x, w_head)?;
        if dims.vocab == 0 {
            return Err(Error::shape(
                op,
                device,
                format!("w_head {:?} has no rows", w_head.shape()),
            ));
        }
        Ok(dims)
    }

    /// The rows that take part in the loss, ascending: weight > 0, whose label must then lie
    /// inside the vocabulary. Every weight must be finite and >= 0. `labels` and `weights` are
    /// the ones [`Self::of_cross_entropy`] checked.
    pub fn active_rows(
        &self,
        op: &'static str,
        device: &str,
        labels: &[u32],
        weights: &[f32],
    ) -> Result<Vec<usize>> {
        let mut active = Vec::new();
        for (row, (&lab, &wt)) in labels.iter().zip(weights).enumerate() {
            if !(wt.is_finite() && wt >= 0.0) {
                return Err(Error::op(
                    op,
                    device,
                    format!("row {row}: weight {wt} must be finite and >= 0"),
                ));
            }
            if wt == 0.0 {
                continue;
            }
            if lab as usize >= self.vocab {
                return Err(Error::op(
                    op,
                    device,
                    format!(
                        "row {row}: label {lab} is out of range for vocab size V = {}",
                        self.vocab
                    ),
                ));
            }
            active.push(row);
        }
        Ok(active)
    }
}
