use crate::{Result, Tensor};

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
