//! Fused linear cross-entropy against a frozen LM head, and chunked greedy argmax.
//!
//! Rows are processed `CHUNK_ROWS` at a time: `logits (n, V) = x_chunk @ w^T` (sgemm), then
//! per row the log-sum-exp in f64, `CE = lse - logit[label]`, the argmax (ties: lowest index)
//! and `dlogits = grad_scale * w * (softmax - onehot)`, overwritten in the logits buffer;
//! finally `dx_chunk (n, H) = dlogits @ w`. Rows with weight 0 are never computed: they are
//! dropped before the GEMM and their `dx` row is exactly 0. No `(T, V)` tensor ever exists.

use dflash_core::{LossDims, LossOps, LossStats, Result, Tensor, Transpose};
use rayon::prelude::*;

use crate::gemm::{MatView, sgemm};
use crate::storage::{host_tensor, slice};
use crate::{DEVICE, ReferenceBackend};

/// Rows per logits chunk: the chunk buffer is `(CHUNK_ROWS, V)` f32.
const CHUNK_ROWS: usize = 64;

/// Index of the largest value; ties and NaNs resolve to the lowest index.
fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] || (row[best].is_nan() && !v.is_nan()) {
            best = i;
        }
    }
    best
}

/// Gathers rows `rows` of `x (T, H)` into a compact `(n, H)` buffer.
fn gather_rows(x: &[f32], h: usize, rows: &[usize]) -> Vec<f32> {
    let mut out = Vec::with_capacity(rows.len() * h);
    for &r in rows {
        out.extend_from_slice(&x[r * h..(r + 1) * h]);
    }
    out
}

/// `logits (n, V) = xc (n, H) @ w (V, H)^T`.
fn chunk_logits(xc: &[f32], w: &[f32], n: usize, h: usize, v: usize) -> Vec<f32> {
    let mut logits = vec![0.0f32; n * v];
    sgemm(
        xc,
        MatView::of(n, h, Transpose::No),
        w,
        MatView::of(v, h, Transpose::Yes),
        &mut logits,
        1.0,
        0.0,
    );
    logits
}

impl LossOps for ReferenceBackend {
    fn linear_cross_entropy(
        &self,
        x: &Tensor,
        w_head: &Tensor,
        labels: &[u32],
        weights: &[f32],
        grad_scale: f32,
    ) -> Result<(LossStats, Tensor)> {
        let op = "linear_cross_entropy";
        let dims = LossDims::of_cross_entropy(op, DEVICE, x, w_head, labels, weights)?;
        let (t, h, v) = (dims.rows, dims.hidden, dims.vocab);
        let (xs, ws) = (slice(op, x)?, slice(op, w_head)?);
        // The rows that take part: weight > 0, with a label inside the vocabulary.
        let active = dims.active_rows(op, DEVICE, labels, weights)?;

        let mut stats = LossStats::default();
        let mut dx = vec![0.0f32; t * h]; // (T, H); skipped rows stay exactly 0
        let gs = grad_scale as f64;
        for rows in active.chunks(CHUNK_ROWS) {
            let n = rows.len();
            let xc = gather_rows(xs, h, rows); // (n, H)
            // (ce, correct) per row; logits are overwritten by dlogits in place.
            let (logits, per_row) = self.run(|| {
                let mut logits = chunk_logits(&xc, ws, n, h, v); // (n, V)
                let per_row: Vec<(f64, bool)> = logits
                    .par_chunks_mut(v.max(1))
                    .zip(rows.par_iter())
                    .map(|(l, &row)| {
                        let label = labels[row] as usize;
                        let wt = weights[row] as f64;
                        let correct = argmax(l) == label;
                        let max = l.iter().fold(f64::NEG_INFINITY, |m, &z| m.max(z as f64));
                        let sum: f64 = l.iter().map(|&z| (z as f64 - max).exp()).sum();
                        let lse = max + sum.ln();
                        let ce = lse - l[label] as f64;
                        // dlogits = grad_scale * w * (softmax - onehot)
                        for (j, z) in l.iter_mut().enumerate() {
                            let p = (*z as f64 - lse).exp();
                            let onehot = if j == label { 1.0 } else { 0.0 };
                            *z = (gs * wt * (p - onehot)) as f32;
                        }
                        (ce, correct)
                    })
                    .collect();
                (logits, per_row)
            });
            for (&row, &(ce, correct)) in rows.iter().zip(&per_row) {
                let wt = weights[row] as f64;
                stats.weighted_loss += wt * ce;
                stats.weight_sum += wt;
                stats.counted += 1;
                stats.correct += correct as u64;
            }
            // dx_chunk (n, H) = dlogits (n, V) @ w (V, H)
            let mut dxc = vec![0.0f32; n * h];
            self.run(|| {
                sgemm(
                    &logits,
                    MatView::of(n, v, Transpose::No),
                    ws,
                    MatView::of(v, h, Transpose::No),
                    &mut dxc,
                    1.0,
                    0.0,
                )
            });
            for (i, &row) in rows.iter().enumerate() {
                dx[row * h..(row + 1) * h].copy_from_slice(&dxc[i * h..(i + 1) * h]);
            }
        }
        Ok((stats, host_tensor(dx, x.shape().clone())))
    }

    fn linear_argmax(&self, x: &Tensor, w_head: &Tensor) -> Result<Vec<u32>> {
        let op = "linear_argmax";
        let LossDims {
            rows: t,
            hidden: h,
            vocab: v,
        } = LossDims::of_argmax(op, DEVICE, x, w_head)?;
        let (xs, ws) = (slice(op, x)?, slice(op, w_head)?);
        let mut out = Vec::with_capacity(t);
        for r0 in (0..t).step_by(CHUNK_ROWS) {
            let n = CHUNK_ROWS.min(t - r0);
            let xc = &xs[r0 * h..(r0 + n) * h]; // (n, H), contiguous already
            let ids: Vec<u32> = self.run(|| {
                let logits = chunk_logits(xc, ws, n, h, v); // (n, V)
                logits.par_chunks(v).map(|l| argmax(l) as u32).collect()
            });
            out.extend(ids);
        }
        Ok(out)
    }
}
