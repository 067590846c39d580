//! Attention over a block-sparse mask: the backend op ([`AttentionOps`]) and the plain
//! reference kernel ([`ReferenceAttention`]) it dispatches to by default.
//!
//! Layouts: `q (Tq, Hq, D)`, `k`/`v (Tk, Hkv, D)`, `out (Tq, Hq, D)`, `lse (Tq, Hq)`; query
//! head `h` reads kv head `h / (Hq / Hkv)`. The kernel walks each query row's (at most two)
//! key intervals, so work is proportional to the visible pairs and no dense score matrix
//! exists. Scores, softmax sums and every dot product are f64.

use std::ops::Range;

use dflash_core::mask::BlockMask;
use dflash_core::{
    AttentionOps, AttnBackward, AttnDims, AttnForward, AttnInputs, Error, HostAttentionKernel,
    Result, Tensor,
};
use rayon::prelude::*;

use crate::storage::{host_tensor, shape_err, slice};
use crate::{DEVICE, ReferenceBackend};

/// Keys per dk/dv task in the backward: each task owns the keys `[k0, k0 + KEY_BLOCK)` of
/// one kv head and accumulates into them alone, so no two tasks write the same element.
const KEY_BLOCK: usize = 64;

/// The plain reference kernel (registered as attention kernel `"reference"`).
#[derive(Debug, Default, Clone, Copy)]
pub struct ReferenceAttention;

fn dot(a: &[f32], b: &[f32]) -> f64 {
    a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum()
}

impl HostAttentionKernel for ReferenceAttention {
    fn name(&self) -> &str {
        "reference"
    }

    fn forward(&self, call: AttnForward<'_>) -> std::result::Result<(), String> {
        let (x, out, lse) = (call.input, call.out, call.lse);
        let dims = x.dims;
        let (hq, hkv, d, group) = (dims.q_heads, dims.kv_heads, dims.head_dim, dims.group());
        let scale = x.scale as f64;
        // One query row (all its heads) per task.
        out.par_chunks_mut(hq * d)
            .zip(lse.par_chunks_mut(hq))
            .enumerate()
            .for_each(|(i, (o_row, l_row))| {
                let ivs = x.mask.row(i);
                let mut s = Vec::new(); // scaled scores of this (row, head), visible keys only
                let mut acc = vec![0.0f64; d];
                for h in 0..hq {
                    let kh = h / group;
                    let qi = &x.q[(i * hq + h) * d..][..d]; // (D)
                    let kv_at = |j: usize| (j * hkv + kh) * d..(j * hkv + kh + 1) * d;
                    s.clear();
                    for iv in ivs {
                        for j in iv.start as usize..iv.end as usize {
                            s.push(scale * dot(qi, &x.k[kv_at(j)]));
                        }
                    }
                    let o = &mut o_row[h * d..(h + 1) * d];
                    if s.is_empty() {
                        o.fill(0.0);
                        l_row[h] = f32::NEG_INFINITY;
                        continue;
                    }
                    let max = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                    acc.fill(0.0);
                    let mut sum = 0.0f64;
                    let mut n = 0;
                    for iv in ivs {
                        for j in iv.start as usize..iv.end as usize {
                            let p = (s[n] - max).exp();
                            n += 1;
                            sum += p;
                            for (a, &vv) in acc.iter_mut().zip(&x.v[kv_at(j)]) {
                                *a += p * vv as f64;
                            }
                        }
                    }
                    let l = (max + sum.ln()) as f32;
                    if !l.is_finite() {
                        // Scores past the f32 range (the f64 sum is fine, its f32 lse is
                        // +-inf): the backward's exp(s - lse) would be 0 or inf, so a finite out
                        // would come with silently zero gradients. NaN policy: say so instead.
                        // (CUDA's kernels score in f32, so there the scores themselves overflow
                        // and inf - inf in the online softmax gives NaN the same way.)
                        o.fill(f32::NAN);
                        l_row[h] = f32::NAN;
                        continue;
                    }
                    for (o, a) in o.iter_mut().zip(&acc) {
                        *o = (a / sum) as f32;
                    }
                    l_row[h] = l;
                }
            });
        Ok(())
    }

    /// Recomputes `P = exp(scale * q.k - lse)` per visible pair, then with
    /// `dP = dO.v`, `D_i = dO_i.O_i`, `dS = P * (dP - D_i)`:
    /// `dq_i += scale * dS * k_j`, `dk_j += scale * dS * q_i`, `dv_j += P * dO_i`.
    /// dq is parallel over query rows; dk/dv over (kv head, key block), each task owning
    /// its keys and visiting query rows in order, so the result is bit-deterministic.
    fn backward(&self, call: AttnBackward<'_>) -> std::result::Result<(), String> {
        let pairs = BackwardPairs::new(call.input, call.out, call.lse, call.d_out);
        pairs.write_dq(call.dq);
        pairs.write_dk_dv(call.dk, call.dv);
        Ok(())
    }
}

/// What the backward reads for every visible pair `(i, h, j)`: the forward's inputs, its
/// `lse`, the cotangent `dO`, and `D (Tq, Hq) = rowwise dO . O`, computed once up front.
struct BackwardPairs<'a> {
    x: AttnInputs<'a>,
    /// `(Tq, Hq)`.
    lse: &'a [f32],
    /// `(Tq, Hq, D)`.
    d_out: &'a [f32],
    /// `D (Tq, Hq)`, in f64.
    d_sum: Vec<f64>,
    /// `x.scale` in f64.
    scale: f64,
}

impl<'a> BackwardPairs<'a> {
    /// Computes `D (Tq, Hq) = rowwise dO . O` (parallel over rows) and keeps the rest.
    fn new(x: AttnInputs<'a>, out: &'a [f32], lse: &'a [f32], d_out: &'a [f32]) -> Self {
        let dims = x.dims;
        let (tq, hq, d) = (dims.q_rows, dims.q_heads, dims.head_dim);
        // D (Tq, Hq) = rowwise dO . O
        let d_sum: Vec<f64> = (0..tq * hq)
            .into_par_iter()
            .map(|r| dot(&d_out[r * d..][..d], &out[r * d..][..d]))
            .collect();
        BackwardPairs {
            x,
            lse,
            d_out,
            d_sum,
            scale: x.scale as f64,
        }
    }

    /// The `(D)` range of query row `i`, head `h` in `q`, `dO` and `dq (Tq, Hq, D)`.
    fn q_at(&self, i: usize, h: usize) -> Range<usize> {
        let (hq, d) = (self.x.dims.q_heads, self.x.dims.head_dim);
        (i * hq + h) * d..(i * hq + h + 1) * d
    }

    /// The `(D)` range of key `j`, kv head `kh` in `k`, `v`, `dk` and `dv (Tk, Hkv, D)`.
    fn kv_at(&self, j: usize, kh: usize) -> Range<usize> {
        let (hkv, d) = (self.x.dims.kv_heads, self.x.dims.head_dim);
        (j * hkv + kh) * d..(j * hkv + kh + 1) * d
    }

    /// `(P, dS)` of one visible pair `(i, h, j)`: `P = exp(scale * q.k - lse)`,
    /// `dS = P * (dO.v - D_i)`.
    fn p_ds(&self, i: usize, h: usize, j: usize) -> (f64, f64) {
        let (x, hq) = (&self.x, self.x.dims.q_heads);
        let kh = h / x.dims.group();
        let s = self.scale * dot(&x.q[self.q_at(i, h)], &x.k[self.kv_at(j, kh)]);
        let p = (s - self.lse[i * hq + h] as f64).exp();
        let dp = dot(&self.d_out[self.q_at(i, h)], &x.v[self.kv_at(j, kh)]);
        (p, p * (dp - self.d_sum[i * hq + h]))
    }

    /// Writes `dq (Tq, Hq, D)`: `dq_i = sum_j scale * dS * k_j`, one query row per task.
    fn write_dq(&self, dq: &mut [f32]) {
        let (x, dims, scale) = (&self.x, self.x.dims, self.scale);
        let (hq, d, group) = (dims.q_heads, dims.head_dim, dims.group());
        dq.par_chunks_mut(hq * d)
            .enumerate()
            .for_each(|(i, dq_row)| {
                let mut acc = vec![0.0f64; d];
                for h in 0..hq {
                    acc.fill(0.0);
                    for iv in x.mask.row(i) {
                        for j in iv.start as usize..iv.end as usize {
                            let (_, ds) = self.p_ds(i, h, j);
                            for (a, &kv) in acc.iter_mut().zip(&x.k[self.kv_at(j, h / group)]) {
                                *a += scale * ds * kv as f64;
                            }
                        }
                    }
                    for (o, a) in dq_row[h * d..(h + 1) * d].iter_mut().zip(&acc) {
                        *o = *a as f32;
                    }
                }
            });
    }

    /// Writes `dk`, `dv (Tk, Hkv, D)`: one (kv head, key block) per task, accumulated in
    /// parallel by [`Self::key_block`], then rounded to f32 into place.
    fn write_dk_dv(&self, dk: &mut [f32], dv: &mut [f32]) {
        let dims = self.x.dims;
        let (tk, hkv, d) = (dims.kv_rows, dims.kv_heads, dims.head_dim);
        let blocks = tk.div_ceil(KEY_BLOCK);
        let tasks: Vec<(usize, usize)> = (0..hkv)
            .flat_map(|kh| (0..blocks).map(move |b| (kh, b)))
            .collect();
        let parts: Vec<(Vec<f64>, Vec<f64>)> = tasks
            .par_iter()
            .map(|&(kh, b)| self.key_block(kh, b))
            .collect();
        for (&(kh, b), (dk_acc, dv_acc)) in tasks.iter().zip(&parts) {
            let k0 = b * KEY_BLOCK;
            for (n, (dk_j, dv_j)) in dk_acc.chunks(d).zip(dv_acc.chunks(d)).enumerate() {
                let r = self.kv_at(k0 + n, kh);
                for ((o, &a), (o2, &a2)) in dk[r.clone()]
                    .iter_mut()
                    .zip(dk_j)
                    .zip(dv[r].iter_mut().zip(dv_j))
                {
                    *o = a as f32;
                    *o2 = a2 as f32;
                }
            }
        }
    }

    /// The f64 `(dk, dv)` of kv head `kh`'s keys `[k0, k1)` of block `b`, each `(keys, D)`:
    /// `dk_j = sum_i scale * dS * q_i`, `dv_j = sum_i P * dO_i` over the query rows in order.
    fn key_block(&self, kh: usize, b: usize) -> (Vec<f64>, Vec<f64>) {
        let (x, dims, scale) = (&self.x, self.x.dims, self.scale);
        let (tq, tk, d, group) = (dims.q_rows, dims.kv_rows, dims.head_dim, dims.group());
        let (k0, k1) = (b * KEY_BLOCK, ((b + 1) * KEY_BLOCK).min(tk));
        let mut dk_acc = vec![0.0f64; (k1 - k0) * d]; // (keys, D)
        let mut dv_acc = vec![0.0f64; (k1 - k0) * d];
        for i in 0..tq {
            for iv in x.mask.row(i) {
                let lo = (iv.start as usize).max(k0);
                let hi = (iv.end as usize).min(k1);
                for h in kh * group..(kh + 1) * group {
                    let (qi, doi) = (&x.q[self.q_at(i, h)], &self.d_out[self.q_at(i, h)]);
                    for j in lo..hi {
                        let (p, ds) = self.p_ds(i, h, j);
                        let off = (j - k0) * d;
                        for c in 0..d {
                            dk_acc[off + c] += scale * ds * qi[c] as f64;
                            dv_acc[off + c] += p * doi[c] as f64;
                        }
                    }
                }
            }
        }
        (dk_acc, dv_acc)
    }
}

/// Checks `q (Tq, Hq, D)`, `k`/`v (Tk, Hkv, D)` and builds the dims.
fn attn_dims(
    op: &'static str,
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    mask: &BlockMask,
) -> Result<AttnDims> {
    AttnDims::of_tensors(q, k, v, mask).map_err(|e| shape_err(op, e))
}

impl ReferenceBackend {
    fn kernel_err(&self, op: &'static str, e: String) -> Error {
        Error::op(
            op,
            DEVICE,
            format!("attention kernel {:?} failed: {e}", self.attention_name),
        )
    }

    /// The forward of `attention` and `attention_rows`: checks the operands, runs `kernel`
    /// into NaN-poisoned buffers (it must overwrite every element) and returns
    /// `(out (Tq, Hq, D), lse (Tq, Hq))`.
    fn forward_with(
        &self,
        op: &'static str,
        kernel: &dyn HostAttentionKernel,
        [q, k, v]: [&Tensor; 3],
        mask: &BlockMask,
        scale: f32,
    ) -> Result<(Tensor, Tensor)> {
        let dims = attn_dims(op, q, k, v, mask)?;
        let (qs, ks, vs) = (slice(op, q)?, slice(op, k)?, slice(op, v)?);
        let mut out = vec![f32::NAN; qs.len()];
        let mut lse = vec![f32::NAN; dims.q_rows * dims.q_heads];
        self.run(|| {
            let call = AttnForward::new(&dims, mask, scale, [qs, ks, vs], [&mut out, &mut lse])?;
            kernel.forward(call)
        })
        .map_err(|e| self.kernel_err(op, e))?;
        Ok((
            host_tensor(out, q.shape().clone()),
            host_tensor(lse, [dims.q_rows, dims.q_heads]),
        ))
    }
}

impl AttentionOps for ReferenceBackend {
    fn attention(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: &BlockMask,
        scale: f32,
    ) -> Result<(Tensor, Tensor)> {
        self.forward_with("attention", self.attention.as_ref(), [q, k, v], mask, scale)
    }

    /// Always the plain reference kernel, whatever kernel `attention` dispatches to: it
    /// walks each row's own intervals, which is the schedule this op asks for.
    fn attention_rows(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: &BlockMask,
        scale: f32,
    ) -> Result<Tensor> {
        let (out, _lse) = self.forward_with(
            "attention_rows",
            &ReferenceAttention,
            [q, k, v],
            mask,
            scale,
        )?;
        Ok(out)
    }

    fn attention_backward(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &Tensor,
        lse: &Tensor,
        d_out: &Tensor,
        mask: &BlockMask,
        scale: f32,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let op = "attention_backward";
        let dims =
            AttnDims::of_backward(q, k, v, out, lse, d_out, mask).map_err(|e| shape_err(op, e))?;
        let (qs, ks, vs) = (slice(op, q)?, slice(op, k)?, slice(op, v)?);
        let (os, ls, dos) = (slice(op, out)?, slice(op, lse)?, slice(op, d_out)?);
        // Poisoned: the kernel must overwrite every element.
        let mut dq = vec![f32::NAN; qs.len()];
        let mut dk = vec![f32::NAN; ks.len()];
        let mut dv = vec![f32::NAN; vs.len()];
        self.run(|| {
            let call = AttnBackward::new(
                &dims,
                mask,
                scale,
                [qs, ks, vs, os, ls, dos],
                [&mut dq, &mut dk, &mut dv],
            )?;
            self.attention.backward(call)
        })
        .map_err(|e| self.kernel_err(op, e))?;
        Ok((
            host_tensor(dq, q.shape().clone()),
            host_tensor(dk, k.shape().clone()),
            host_tensor(dv, v.shape().clone()),
        ))
    }
}
