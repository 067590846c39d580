//! The dense f64 attention oracle the conformance suite compares kernels against.
//!
//! Deliberately naive and independent of every kernel: visibility comes from
//! [`BlockMask::to_dense_oracle`] (a `[q][k]` boolean matrix, fine at test sizes and forbidden
//! anywhere else), every sum is a plain f64 loop over all keys, and the backward is the
//! textbook softmax gradient, not the FlashAttention recompute identity kernels use:
//! `dP = dO V^T`, `dS_ij = P_ij (dP_ij - sum_k P_ik dP_ik)`, `dQ = scale dS K`,
//! `dK = scale dS^T Q`, `dV = P^T dO`.
//!
//! Layouts are those of [`dflash_core::ops::attention`]: `q (Tq, Hq, D)`, `k`/`v (Tk, Hkv, D)`,
//! GQA query head `h` uses kv head `h / (Hq / Hkv)`; a row with no visible key has `out = 0`,
//! `lse = -inf` and zero gradients.

use dflash_core::AttnDims;
use dflash_core::mask::BlockMask;

/// Forward results in f64: `out (Tq, Hq, D)`, `lse (Tq, Hq)`.
#[derive(Debug, Clone)]
pub struct Forward {
    pub out: Vec<f64>,
    pub lse: Vec<f64>,
}

/// Gradients in f64, shaped like `q`, `k`, `v`.
#[derive(Debug, Clone)]
pub struct Grads {
    pub dq: Vec<f64>,
    pub dk: Vec<f64>,
    pub dv: Vec<f64>,
}

struct View<'a> {
    dims: AttnDims,
    q: &'a [f32],
    k: &'a [f32],
    dense: Vec<Vec<bool>>,
    scale: f64,
}

impl View<'_> {
    fn kv_head(&self, h: usize) -> usize {
        h / self.dims.group()
    }
    fn qi(&self, i: usize, h: usize) -> usize {
        (i * self.dims.q_heads + h) * self.dims.head_dim
    }
    fn kj(&self, j: usize, kvh: usize) -> usize {
        (j * self.dims.kv_heads + kvh) * self.dims.head_dim
    }
    /// Scaled score of (row i, query head h) against key j, in f64.
    fn score(&self, i: usize, h: usize, j: usize) -> f64 {
        let (qi, kj) = (self.qi(i, h), self.kj(j, self.kv_head(h)));
        let d = self.dims.head_dim;
        let s: f64 = (0..d)
            .map(|x| self.q[qi + x] as f64 * self.k[kj + x] as f64)
            .sum();
        self.scale * s
    }
    /// Softmax probabilities of (row i, head h) over all keys (0 where invisible), and the lse.
    fn probs(&self, i: usize, h: usize) -> (Vec<f64>, f64) {
        let tk = self.dims.kv_rows;
        let s: Vec<f64> = (0..tk)
            .map(|j| {
                if self.dense[i][j] {
                    self.score(i, h, j)
                } else {
                    f64::NEG_INFINITY
                }
            })
            .collect();
        let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if m == f64::NEG_INFINITY {
            return (vec![0.0; tk], f64::NEG_INFINITY);
        }
        let sum: f64 = s.iter().map(|&x| (x - m).exp()).sum();
        let lse = m + sum.ln();
        (s.iter().map(|&x| (x - lse).exp()).collect(), lse)
    }
}

fn view<'a>(dims: &AttnDims, q: &'a [f32], k: &'a [f32], mask: &BlockMask, scale: f32) -> View<'a> {
    View {
        dims: *dims,
        q,
        k,
        dense: mask.to_dense_oracle(),
        scale: scale as f64,
    }
}

/// Dense f64 forward.
pub fn forward(
    dims: &AttnDims,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    mask: &BlockMask,
    scale: f32,
) -> Forward {
    let w = view(dims, q, k, mask, scale);
    let (tq, hq, d) = (dims.q_rows, dims.q_heads, dims.head_dim);
    let mut out = vec![0.0; tq * hq * d];
    let mut lse = vec![f64::NEG_INFINITY; tq * hq];
    for i in 0..tq {
        for h in 0..hq {
            let (p, l) = w.probs(i, h);
            lse[i * hq + h] = l;
            let o = w.qi(i, h);
            for (j, &pj) in p.iter().enumerate() {
                if pj == 0.0 {
                    continue;
                }
                let vj = w.kj(j, w.kv_head(h));
                for x in 0..d {
                    out[o + x] += pj * v[vj + x] as f64;
                }
            }
        }
    }
    Forward { out, lse }
}

/// Dense f64 backward of `out = softmax(scale q k^T + mask) v` with upstream gradient `d_out`.
#[allow(clippy::too_many_arguments)]
pub fn backward(
    dims: &AttnDims,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    mask: &BlockMask,
    scale: f32,
    d_out: &[f32],
) -> Grads {
    let w = view(dims, q, k, mask, scale);
    let (tq, tk, hq, hkv, d) = (
        dims.q_rows,
        dims.kv_rows,
        dims.q_heads,
        dims.kv_heads,
        dims.head_dim,
    );
    let mut dq = vec![0.0; tq * hq * d];
    let mut dk = vec![0.0; tk * hkv * d];
    let mut dv = vec![0.0; tk * hkv * d];
    let sc = scale as f64;
    for i in 0..tq {
        for h in 0..hq {
            let (p, _) = w.probs(i, h);
            let kvh = w.kv_head(h);
            let o = w.qi(i, h);
            // dP_ij = dO_i . v_j over the visible keys.
            let dp: Vec<f64> = (0..tk)
                .map(|j| {
                    if p[j] == 0.0 {
                        return 0.0;
                    }
                    let vj = w.kj(j, kvh);
                    (0..d).map(|x| d_out[o + x] as f64 * v[vj + x] as f64).sum()
                })
                .collect();
            let pdp: f64 = p.iter().zip(&dp).map(|(a, b)| a * b).sum();
            for j in 0..tk {
                if p[j] == 0.0 {
                    continue;
                }
                let ds = p[j] * (dp[j] - pdp);
                let kj = w.kj(j, kvh);
                for x in 0..d {
                    dq[o + x] += sc * ds * k[kj + x] as f64;
                    dk[kj + x] += sc * ds * q[o + x] as f64;
                    dv[kj + x] += p[j] * d_out[o + x] as f64;
                }
            }
        }
    }
    Grads { dq, dk, dv }
}
