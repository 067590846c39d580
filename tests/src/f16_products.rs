//! The CPU twin of a tensor-core attention forward whose two products take f16 operands
//! (wgpu's `attention_fwd_coop.wgsl`): the same roundings at the same points, in plain loops,
//! so that the device kernel can be held to its own numerics (a bound set by f32 summation
//! order, not by f16 rounding) and so that what those numerics do to a drafter step shows on
//! any machine. The backward is the reference's f32-input one on the twin's `out` and `lse`,
//! as the device backward runs on the tensor-core forward's.
//!
//! Per query row and head, the forward the twin copies:
//! 1. q, k and v rounded to f16 (nearest even); each score `s = scale * (q . k)`, the product
//!    exact in f32 and summed in f32 (the twin sums in f64, then rounds once: the device's
//!    order is its own, a few f32 ulps apart);
//! 2. the row's keys visited in tiles of `key_tile` aligned keys, ascending (the tile lists'
//!    order); a tile's visible scores give its max `mx`; the reference max `m` is set by the
//!    first tile with a visible key and moves only when `mx > m + rescale_above` (the lazy
//!    rescale: `O` and `l` times `exp(m - mx)`);
//! 3. `p = exp(s - m)` in f32, rounded to f16 (the P V product's operand); `l` sums the
//!    rounded `p`, `O` sums `p * v` (f16 values, f32 accumulation on the device, f64 here);
//! 4. `out = O / l`, `lse = m + ln l` in f32; a row that sees no key: `out` 0, `lse` -inf;
//!    a visible score that is NaN or +inf: the row's `out` and `lse` NaN.
//!
//! A NaN or infinity in v reaches whole device tiles (0 x NaN inside the product), which the
//! twin does not copy: compare it on finite v.

use dflash_core::{AttnBackward, AttnForward, HostAttentionKernel};
use rayon::prelude::*;

use crate::ops::Format;

/// The twin of a forward with f16 products and lazy rescaling over tiles of `key_tile` keys.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct F16ProductsForward {
    /// Keys per tile of the device kernel's key loop (its `BK`).
    pub key_tile: usize,
    /// How far a tile's max may pass the reference max before the row is rescaled (its
    /// `TAU`; `exp(rescale_above)` must fit f16's 65504).
    pub rescale_above: f32,
    /// How a score's products are summed.
    pub scores: ScoreSum,
}

/// How the twin sums a score's (exact) f16 x f16 products.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScoreSum {
    /// In f64, rounded once to f32: the exact score to f32 precision, no order of its own.
    F64,
    /// In f32, dim by dim: one order a device might take, to show what the twin bounds must
    /// allow for summation order alone.
    F32InOrder,
}

/// wgpu's `attention_fwd_coop.wgsl`: 32-key tiles, `TAU = 10`.
pub const WGPU_COOP_FORWARD: F16ProductsForward = F16ProductsForward {
    key_tile: 32,
    rescale_above: 10.0,
    scores: ScoreSum::F64,
};

fn f16(x: f32) -> f32 {
    Format::F16.round(x)
}

/// Whether a score makes its row NaN (NaN or +inf), as the device kernels flag it.
fn poisons(s: f32) -> bool {
    s.is_nan() || s == f32::INFINITY
}

/// One query row and head of a call: its f16-rounded query (D), the f16-rounded k and v of
/// every key (Tk, Hkv, D), and where its kv head starts in them.
struct RowInputs<'a> {
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    hkv: usize,
    kh: usize,
}

impl RowInputs<'_> {
    /// Key `j`'s row of `x` (k or v).
    fn of<'x>(&self, x: &'x [f32], j: usize) -> &'x [f32] {
        let d = self.q.len();
        &x[(j * self.hkv + self.kh) * d..][..d]
    }
}

impl F16ProductsForward {
    fn dot(&self, q: &[f32], k: &[f32]) -> f32 {
        match self.scores {
            ScoreSum::F64 => q
                .iter()
                .zip(k)
                .map(|(&a, &b)| a as f64 * b as f64)
                .sum::<f64>() as f32,
            ScoreSum::F32InOrder => q.iter().zip(k).fold(0.0f32, |s, (&a, &b)| s + a * b),
        }
    }

    /// One row and head over `keys`, its visible keys ascending (`scores`: scratch). Writes
    /// `o (D)`, returns `lse`.
    fn row(
        &self,
        x: &RowInputs<'_>,
        keys: &[usize],
        scale: f32,
        scores: &mut Vec<f32>,
        o: &mut [f32],
    ) -> f32 {
        let mut m = f32::NEG_INFINITY;
        let mut l = 0.0f64;
        let mut acc = vec![0.0f64; o.len()];
        let mut bad = false;
        for tile in keys.chunk_by(|&a, &b| a / self.key_tile == b / self.key_tile) {
            scores.clear();
            for &j in tile {
                let s = scale * self.dot(x.q, x.of(x.k, j));
                bad |= poisons(s);
                scores.push(if poisons(s) { f32::NEG_INFINITY } else { s });
            }
            let mx = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            if m == f32::NEG_INFINITY {
                m = mx;
            } else if mx > m + self.rescale_above {
                let alpha = (m - mx).exp() as f64;
                acc.iter_mut().for_each(|a| *a *= alpha);
                l *= alpha;
                m = mx;
            }
            for (&s, &j) in scores.iter().zip(tile) {
                if s == f32::NEG_INFINITY {
                    continue;
                }
                let p = f16((s - m).exp()) as f64;
                l += p;
                for (a, &v) in acc.iter_mut().zip(x.of(x.v, j)) {
                    *a += p * v as f64;
                }
            }
        }
        if bad {
            o.fill(f32::NAN);
            return f32::NAN;
        }
        if l == 0.0 {
            o.fill(0.0);
            return f32::NEG_INFINITY;
        }
        for (o, a) in o.iter_mut().zip(&acc) {
            *o = (a / l) as f32;
        }
        m + (l as f32).ln()
    }
}

impl HostAttentionKernel for F16ProductsForward {
    fn name(&self) -> &str {
        "f16-products-twin"
    }

    fn forward(&self, call: AttnForward<'_>) -> Result<(), String> {
        let (x, out, lse) = (call.input, call.out, call.lse);
        let dims = x.dims;
        let (hq, hkv, d, group) = (dims.q_heads, dims.kv_heads, dims.head_dim, dims.group());
        let round = |xs: &[f32]| -> Vec<f32> { xs.iter().map(|&v| f16(v)).collect() };
        let (k, v) = (round(x.k), round(x.v));
        out.par_chunks_mut(hq * d)
            .zip(lse.par_chunks_mut(hq))
            .enumerate()
            .for_each(|(i, (o_row, l_row))| {
                let mut keys: Vec<usize> = x
                    .mask
                    .row(i)
                    .iter()
                    .flat_map(|iv| iv.start as usize..iv.end as usize)
                    .collect();
                keys.sort_unstable(); // the tiles ascending, as the device lists them
                let mut scores = Vec::with_capacity(self.key_tile);
                for h in 0..hq {
                    let q = round(&x.q[(i * hq + h) * d..][..d]);
                    let row = RowInputs {
                        q: &q,
                        k: &k,
                        v: &v,
                        hkv,
                        kh: h / group,
                    };
                    let o = &mut o_row[h * d..(h + 1) * d];
                    l_row[h] = self.row(&row, &keys, x.scale, &mut scores, o);
                }
            });
        Ok(())
    }

    fn backward(&self, call: AttnBackward<'_>) -> Result<(), String> {
        dflash_backend_reference::ReferenceAttention.backward(call)
    }
}
