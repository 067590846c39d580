//! RMSNorm over the last dim (`kernels/norm.cu`), f32 accumulation. `x` / `dy` are f32 or bf16
//! (each independently); `y` and `dx` are activations (`CudaOptions::activations`); `rstd` and
//! the weight gradient `dw` are always f32. A bf16 weight (not expected: norm weights are
//! parameters) is widened exactly first.

use cudarc::driver::{CudaSlice, LaunchConfig, PushKernelArg};
use dflash_core::{NormDims, NormOps, Result, Tensor};

use crate::CudaBackend;
use crate::kernels::pick;
use crate::storage::{CudaStorage, DType};

/// Rows per split of the dw column reduction (each thread then sums rps / 8 rows).
const DW_ROWS_PER_SPLIT: usize = 256;

/// 8-element vectors a thread holds per row on the kernels' vector path (`DF_NORM_NV` in
/// `kernels/norm.cu`).
const NORM_NV: usize = 4;

/// Threads per block when several rows share a block (groups of <= 32 lanes).
const NORM_BLOCK: usize = 256;

/// Most lanes for one (wide) row: the y / dx kernels use up to ~96 registers per thread, so a
/// block of 1024 cannot launch (64 K registers per SM); `__launch_bounds__(512)` in norm.cu
/// matches this.
const NORM_MAX_LANES: usize = 512;

/// The y / dx launch for `r` rows of `c` columns and its group size `G` (lanes per row): the
/// fewest lanes that hold the row in registers (`NORM_NV` vectors of 8 each): a power of two
/// <= 32 for rows of <= 1024 columns (`NORM_BLOCK / G` rows per block), else a warp multiple
/// <= `NORM_MAX_LANES` (one row per block; beyond 16384 columns the kernel takes its scalar
/// path). A function of `c` only, so the summation order is too.
fn norm_launch(r: usize, c: usize) -> (LaunchConfig, i32) {
    let per_lane = c.div_ceil(8).div_ceil(NORM_NV).max(1);
    let (g, rows_per_block) = if per_lane <= 32 {
        let g = per_lane.next_power_of_two();
        (g, NORM_BLOCK / g)
    } else {
        (per_lane.div_ceil(32).min(NORM_MAX_LANES / 32) * 32, 1)
    };
    let block = if g <= 32 { NORM_BLOCK } else { g };
    (
        LaunchConfig {
            grid_dim: (r.div_ceil(rows_per_block) as u32, 1, 1),
            block_dim: (block as u32, 1, 1),
            shared_mem_bytes: 0,
        },
        g as i32,
    )
}

impl NormOps for CudaBackend {
    fn rms_norm(&self, x: &Tensor, w: &Tensor, eps: f32) -> Result<(Tensor, Tensor)> {
        let op = "rms_norm";
        let NormDims { rows: r, cols: c } = NormDims::of(op, &self.tag, x, w)?;
        let (xs, ws) = (self.any(op, x)?, self.any(op, w)?);
        let ws = self.widen(op, ws)?;
        let od = self.opts.activations;
        let mut y = self.alloc(op, r * c, od)?;
        let mut rstd = self.alloc_f32(op, r)?;
        if c == 0 {
            // mean of nothing: the reference leaves rstd at 0
            self.fill(op, &mut rstd, r, 0.0)?;
        } else if r > 0 {
            let (c32, r64) = (c as i32, r as i64);
            let (cfg, g) = norm_launch(r, c);
            let k = self.k();
            let f = pick(
                &[
                    &k.rms_norm_fwd_ff,
                    &k.rms_norm_fwd_fb,
                    &k.rms_norm_fwd_bf,
                    &k.rms_norm_fwd_bb,
                ],
                &[od, xs.dtype],
            );
            let mut l = self.stream.launch_builder(f);
            l.arg(&mut y)
                .arg(&mut rstd)
                .arg(&xs.buf)
                .arg(ws.get())
                .arg(&r64)
                .arg(&c32)
                .arg(&eps)
                .arg(&g);
            self.launch(op, l, cfg)?;
        }
        Ok((
            self.tensor(y, od, x.shape().clone()),
            self.tensor(rstd, DType::F32, [r]),
        ))
    }

    fn rms_norm_backward(
        &self,
        dy: &Tensor,
        x: &Tensor,
        w: &Tensor,
        rstd: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        let op = "rms_norm_backward";
        let NormDims { rows: r, cols: c } = NormDims::of_backward(op, &self.tag, dy, x, w, rstd)?;
        let (dys, xs, ws, rs) = (
            self.any(op, dy)?,
            self.any(op, x)?,
            self.any(op, w)?,
            self.f32s(op, rstd)?,
        );
        let ws = self.widen(op, ws)?;
        let od = self.opts.activations;
        let mut dx = self.alloc(op, r * c, od)?;
        let mut dw = self.alloc_f32(op, c)?;
        if c == 0 {
            return Ok((
                self.tensor(dx, od, x.shape().clone()),
                self.tensor(dw, DType::F32, w.shape().clone()),
            ));
        }
        if r == 0 {
            self.fill(op, &mut dw, c, 0.0)?;
            return Ok((
                self.tensor(dx, od, x.shape().clone()),
                self.tensor(dw, DType::F32, w.shape().clone()),
            ));
        }
        self.rms_norm_backward_dx(op, [dys, xs, rs], ws.get(), (r, c), &mut dx)?;
        self.rms_norm_backward_dw(op, [dys, xs, rs], (r, c), &mut dw)?;
        Ok((
            self.tensor(dx, od, x.shape().clone()),
            self.tensor(dw, DType::F32, w.shape().clone()),
        ))
    }
}

impl CudaBackend {
    /// `dx (r, c)` of the RMSNorm backward, in the activation dtype: one lane group per row
    /// ([`norm_launch`]); `w` is the (f32) weight.
    fn rms_norm_backward_dx(
        &self,
        op: &'static str,
        [dys, xs, rs]: [&CudaStorage; 3],
        w: &CudaSlice<u8>,
        (r, c): (usize, usize),
        dx: &mut CudaSlice<u8>,
    ) -> Result<()> {
        let od = self.opts.activations;
        let (c32, r64) = (c as i32, r as i64);
        let (cfg, g) = norm_launch(r, c);
        let k = self.k();
        let f = pick(
            &[
                &k.rms_norm_bwd_dx_fff,
                &k.rms_norm_bwd_dx_ffb,
                &k.rms_norm_bwd_dx_fbf,
                &k.rms_norm_bwd_dx_fbb,
                &k.rms_norm_bwd_dx_bff,
                &k.rms_norm_bwd_dx_bfb,
                &k.rms_norm_bwd_dx_bbf,
                &k.rms_norm_bwd_dx_bbb,
            ],
            &[od, dys.dtype, xs.dtype],
        );
        let mut l = self.stream.launch_builder(f);
        l.arg(dx)
            .arg(&dys.buf)
            .arg(&xs.buf)
            .arg(w)
            .arg(&rs.buf)
            .arg(&r64)
            .arg(&c32)
            .arg(&g);
        self.launch(op, l, cfg)
    }

    /// The f32 weight gradient `dw (c)` of the RMSNorm backward: column sums over splits of
    /// `DW_ROWS_PER_SPLIT` rows into partials, then the partials summed in split order.
    fn rms_norm_backward_dw(
        &self,
        op: &'static str,
        [dys, xs, rs]: [&CudaStorage; 3],
        (r, c): (usize, usize),
        dw: &mut CudaSlice<u8>,
    ) -> Result<()> {
        let (c32, r64) = (c as i32, r as i64);
        let k = self.k();
        let splits = r.div_ceil(DW_ROWS_PER_SPLIT).min(4096);
        let rps = r.div_ceil(splits);
        let mut partial = self.alloc_f32(op, splits * c)?;
        let rps64 = rps as i64;
        let f = pick(
            &[
                &k.rms_norm_bwd_dw_partial_ff,
                &k.rms_norm_bwd_dw_partial_fb,
                &k.rms_norm_bwd_dw_partial_bf,
                &k.rms_norm_bwd_dw_partial_bb,
            ],
            &[dys.dtype, xs.dtype],
        );
        let mut l = self.stream.launch_builder(f);
        l.arg(&mut partial)
            .arg(&dys.buf)
            .arg(&xs.buf)
            .arg(&rs.buf)
            .arg(&r64)
            .arg(&c32)
            .arg(&rps64);
        self.launch(
            op,
            l,
            LaunchConfig {
                grid_dim: (c.div_ceil(256) as u32, splits as u32, 1),
                block_dim: (32, 8, 1),
                shared_mem_bytes: 0,
            },
        )?;
        let s32 = splits as i32;
        let mut l = self.stream.launch_builder(&self.k().rms_norm_bwd_dw_final);
        l.arg(dw).arg(&partial).arg(&s32).arg(&c32);
        self.launch(
            op,
            l,
            LaunchConfig {
                grid_dim: (c.div_ceil(256) as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            },
        )
    }
}
