//! Rotary position embedding in the HF "rotate half" layout. For `i < D/2`, with angle
//! `p * theta^(-2i/D)` (computed in f64, sin/cos rounded to f32):
//! `y_i = x_i cos - x_{i+D/2} sin`, `y_{i+D/2} = x_{i+D/2} cos + x_i sin`.
//! The backward is the same rotation by `-angle` (a rotation's transpose).

use dflash_core::{Result, RopeDims, RopeOps, Tensor};
use rayon::prelude::*;

use crate::storage::{host_tensor, slice};
use crate::{DEVICE, ReferenceBackend};

/// `(cos, sin)` tables `(T, D/2)` for the given positions, one position per task.
fn tables(positions: &[i32], half: usize, theta: f32) -> (Vec<f32>, Vec<f32>) {
    let d = (2 * half) as f64;
    let inv_freq: Vec<f64> = (0..half)
        .map(|i| (theta as f64).powf(-((2 * i) as f64) / d))
        .collect(); // (D/2)
    let mut cos = vec![0.0f32; positions.len() * half];
    let mut sin = vec![0.0f32; positions.len() * half];
    if half > 0 {
        cos.par_chunks_mut(half)
            .zip(sin.par_chunks_mut(half))
            .zip(positions.par_iter())
            .for_each(|((c_row, s_row), &p)| {
                for ((c, s), &f) in c_row.iter_mut().zip(s_row.iter_mut()).zip(&inv_freq) {
                    let angle = p as f64 * f;
                    *c = angle.cos() as f32;
                    *s = angle.sin() as f32;
                }
            });
    }
    (cos, sin)
}

/// Rotates `x (T, heads, D)` by `sign * angle`.
fn rotate(
    be: &ReferenceBackend,
    op: &'static str,
    x: &Tensor,
    positions: &[i32],
    theta: f32,
    sign: f32,
) -> Result<Tensor> {
    let xs = slice(op, x)?;
    let RopeDims {
        tokens: t,
        head_dim: d,
        ..
    } = RopeDims::of(op, DEVICE, x, positions, theta)?;
    let mut y = vec![0.0f32; xs.len()];
    if y.is_empty() {
        return Ok(host_tensor(y, x.shape().clone()));
    }
    let half = d / 2;
    let per_token = xs.len() / t; // heads * D
    be.run(|| {
        let (cos, sin) = tables(positions, half, theta);
        y.par_chunks_mut(per_token)
            .zip(xs.par_chunks(per_token))
            .enumerate()
            .for_each(|(tok, (y_tok, x_tok))| {
                let (c_row, s_row) = (
                    &cos[tok * half..(tok + 1) * half],
                    &sin[tok * half..(tok + 1) * half],
                );
                for (y_h, x_h) in y_tok.chunks_mut(d).zip(x_tok.chunks(d)) {
                    for i in 0..half {
                        let (c, s) = (c_row[i], sign * s_row[i]);
                        let (x1, x2) = (x_h[i], x_h[i + half]);
                        y_h[i] = x1 * c - x2 * s;
                        y_h[i + half] = x2 * c + x1 * s;
                    }
                }
            })
    });
    Ok(host_tensor(y, x.shape().clone()))
}

impl RopeOps for ReferenceBackend {
    fn rope(&self, x: &Tensor, positions: &[i32], theta: f32) -> Result<Tensor> {
        rotate(self, "rope", x, positions, theta, 1.0)
    }

    fn rope_backward(&self, dy: &Tensor, positions: &[i32], theta: f32) -> Result<Tensor> {
        rotate(self, "rope_backward", dy, positions, theta, -1.0)
    }
}
