//! RMSNorm over the last dim: `y = x * rstd * w`, `rstd = 1/sqrt(mean(x^2) + eps)`.
//! Row statistics and the backward's row dot products accumulate in f64.

use dflash_core::{NormDims, NormOps, Result, Tensor};
use rayon::prelude::*;

use crate::storage::{host_tensor, slice};
use crate::{DEVICE, ReferenceBackend};

impl NormOps for ReferenceBackend {
    fn rms_norm(&self, x: &Tensor, w: &Tensor, eps: f32) -> Result<(Tensor, Tensor)> {
        let NormDims { rows: r, cols: c } = NormDims::of("rms_norm", DEVICE, x, w)?;
        let (xs, ws) = (slice("rms_norm", x)?, slice("rms_norm", w)?);
        let mut y = vec![0.0f32; r * c]; // (R, C)
        let mut rstd = vec![0.0f32; r]; // (R)
        if c > 0 {
            self.run(|| {
                y.par_chunks_mut(c)
                    .zip(rstd.par_iter_mut())
                    .zip(xs.par_chunks(c))
                    .for_each(|((y_row, rs), x_row)| {
                        let ms = x_row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / c as f64;
                        let r64 = 1.0 / (ms + eps as f64).sqrt();
                        for ((y, &xv), &wv) in y_row.iter_mut().zip(x_row).zip(ws) {
                            *y = (xv as f64 * r64 * wv as f64) as f32;
                        }
                        *rs = r64 as f32;
                    })
            });
        }
        Ok((host_tensor(y, x.shape().clone()), host_tensor(rstd, [r])))
    }

    /// With `xhat = x * rstd`: `dw = sum_rows dy * xhat`,
    /// `dx = rstd * (dy * w - xhat * mean(dy * w * xhat))`.
    fn rms_norm_backward(
        &self,
        dy: &Tensor,
        x: &Tensor,
        w: &Tensor,
        rstd: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        let op = "rms_norm_backward";
        let NormDims { rows: r, cols: c } = NormDims::of_backward(op, DEVICE, dy, x, w, rstd)?;
        let (dys, xs, ws, rs) = (
            slice(op, dy)?,
            slice(op, x)?,
            slice(op, w)?,
            slice(op, rstd)?,
        );
        let mut dx = vec![0.0f32; r * c]; // (R, C)
        let mut dw = vec![0.0f32; c]; // (C)
        if c == 0 {
            return Ok((
                host_tensor(dx, x.shape().clone()),
                host_tensor(dw, w.shape().clone()),
            ));
        }
        self.run(|| {
            // dx: one row per task.
            dx.par_chunks_mut(c)
                .zip(dys.par_chunks(c))
                .zip(xs.par_chunks(c))
                .zip(rs.par_iter())
                .for_each(|(((dx_row, dy_row), x_row), &rstd)| {
                    let rstd = rstd as f64;
                    // mean(dy * w * xhat) over the row, f64
                    let dot = dy_row
                        .iter()
                        .zip(x_row)
                        .zip(ws)
                        .map(|((&g, &xv), &wv)| g as f64 * wv as f64 * xv as f64 * rstd)
                        .sum::<f64>()
                        / c as f64;
                    for (((d, &g), &xv), &wv) in dx_row.iter_mut().zip(dy_row).zip(x_row).zip(ws) {
                        let xhat = xv as f64 * rstd;
                        *d = (rstd * (g as f64 * wv as f64 - xhat * dot)) as f32;
                    }
                });
            // dw: one column block per task, rows summed in order (deterministic).
            const COLS: usize = 256;
            dw.par_chunks_mut(COLS)
                .enumerate()
                .for_each(|(blk, dw_blk)| {
                    let c0 = blk * COLS;
                    let mut acc = vec![0.0f64; dw_blk.len()];
                    for (row, &rstd) in rs.iter().enumerate() {
                        let rstd = rstd as f64;
                        let base = row * c + c0;
                        for (j, a) in acc.iter_mut().enumerate() {
                            *a += dys[base + j] as f64 * xs[base + j] as f64 * rstd;
                        }
                    }
                    for (d, a) in dw_blk.iter_mut().zip(acc) {
                        *d = a as f32;
                    }
                });
        });
        Ok((
            host_tensor(dx, x.shape().clone()),
            host_tensor(dw, w.shape().clone()),
        ))
    }
}
