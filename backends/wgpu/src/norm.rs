//! RMSNorm forward and backward (`shaders/norm.wgsl`): one workgroup per row for the row
//! statistics and `dx`; `dw` as column sums over 64-row blocks, then the blocks added in
//! order (deterministic, no atomics). Rows are processed in chunks that fit one binding.

use dflash_core::{NormDims, NormOps, Result, Tensor};

use crate::pipelines::{Family, Kernel};
use crate::storage::storage;
use crate::{WgpuBackend, groups};

const FWD: Kernel<'static> = Kernel::new(Family::Norm, "rms_norm");
const DX: Kernel<'static> = Kernel::new(Family::Norm, "rms_norm_dx");
const DW_PARTIAL: Kernel<'static> = Kernel::new(Family::Norm, "rms_norm_dw_partial");
const DW_SUM: Kernel<'static> = Kernel::new(Family::Norm, "rms_norm_dw_sum");

/// Rows per `dw` partial (norm.wgsl's `DW_BLOCK`).
const DW_BLOCK: usize = 64;

impl WgpuBackend {
    /// Rows per chunk for rows of `cols` elements (a multiple of [`DW_BLOCK`] when the rows
    /// do not all fit one binding), or an error naming `op` when not even those fit.
    fn norm_rows_per_chunk(&self, op: &'static str, rows: usize, cols: usize) -> Result<usize> {
        let fit = self.span_elems() / cols.max(1);
        if fit >= rows {
            return Ok(rows.max(1));
        }
        let per = fit / DW_BLOCK * DW_BLOCK;
        if per == 0 {
            return Err(self.err(
                op,
                format!("{DW_BLOCK} rows of {cols} elements exceed one storage binding"),
            ));
        }
        Ok(per)
    }
}

impl NormOps for WgpuBackend {
    fn rms_norm(&self, x: &Tensor, w: &Tensor, eps: f32) -> Result<(Tensor, Tensor)> {
        let op = "rms_norm";
        let NormDims { rows, cols } = NormDims::of(op, self.tag(), x, w)?;
        let (xs, ws) = (storage(op, &self.ctx, x)?, storage(op, &self.ctx, w)?);
        if cols == 0 {
            let rstd = self.ctx.alloc(op, rows)?;
            let y = self.ctx.alloc(op, 0)?;
            return Ok((self.tensor(y, x.shape().clone()), self.tensor(rstd, [rows])));
        }
        let y = self.out(op, rows * cols)?;
        let rstd = self.out(op, rows)?;
        let per = self.norm_rows_per_chunk(op, rows, cols)?;
        for r0 in (0..rows).step_by(per) {
            let rc = per.min(rows - r0);
            let (xb, xsh) = self.span(xs, r0 * cols, rc * cols);
            let (yb, ysh) = self.span(&y, r0 * cols, rc * cols);
            let (rb, rsh) = self.span(&rstd, r0, rc);
            let p = [rc as u32, cols as u32, eps.to_bits(), xsh, 0, ysh, rsh];
            self.ctx.dispatch(
                op,
                &self.reducing(&FWD),
                &p,
                &[xb, ws.bind()],
                &[yb, rb],
                rc as u64,
            )?;
        }
        Ok((self.tensor(y, x.shape().clone()), self.tensor(rstd, [rows])))
    }

    fn rms_norm_backward(
        &self,
        dy: &Tensor,
        x: &Tensor,
        w: &Tensor,
        rstd: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        let op = "rms_norm_backward";
        let NormDims { rows, cols } = NormDims::of_backward(op, self.tag(), dy, x, w, rstd)?;
        let (gs, xs) = (storage(op, &self.ctx, dy)?, storage(op, &self.ctx, x)?);
        let (ws, rs) = (storage(op, &self.ctx, w)?, storage(op, &self.ctx, rstd)?);
        if cols == 0 || rows == 0 {
            let dx = self.ctx.alloc(op, rows * cols)?;
            let dw = self.ctx.alloc(op, cols)?;
            return Ok((
                self.tensor(dx, x.shape().clone()),
                self.tensor(dw, w.shape().clone()),
            ));
        }
        let dx = self.out(op, rows * cols)?;
        let dw = self.out(op, cols)?;
        let blocks = rows.div_ceil(DW_BLOCK);
        let part = self.ctx.alloc(op, blocks * cols)?;
        if blocks * cols > self.max_binding_elems() {
            return Err(self.err(
                op,
                format!("{blocks} x {cols} dw partials exceed a binding"),
            ));
        }
        let per = self.norm_rows_per_chunk(op, rows, cols)?;
        let col_groups = cols.div_ceil(256);
        for r0 in (0..rows).step_by(per) {
            let rc = per.min(rows - r0);
            let (gb, gsh) = self.span(gs, r0 * cols, rc * cols);
            let (xb, xsh) = self.span(xs, r0 * cols, rc * cols);
            let (rb, rsh) = self.span(rs, r0, rc);
            let (db, dsh) = self.span(&dx, r0 * cols, rc * cols);
            let p = [rc as u32, cols as u32, 0, gsh, xsh, rsh, dsh];
            let reads = [gb, xb, ws.bind(), rb];
            self.ctx
                .dispatch(op, &self.reducing(&DX), &p, &reads, &[db], rc as u64)?;
            // r0 is a multiple of DW_BLOCK whenever there is more than one chunk.
            let p = [
                rc as u32,
                cols as u32,
                0,
                gsh,
                xsh,
                rsh,
                (r0 / DW_BLOCK) as u32,
            ];
            let g = (rc.div_ceil(DW_BLOCK) * col_groups) as u64;
            self.ctx
                .dispatch(op, &DW_PARTIAL, &p, &[gb, xb, rb], &[part.bind()], g)?;
        }
        let p = [blocks as u32, cols as u32];
        self.ctx.dispatch(
            op,
            &DW_SUM,
            &p,
            &[part.bind()],
            &[dw.bind()],
            groups(cols, 256),
        )?;
        Ok((
            self.tensor(dx, x.shape().clone()),
            self.tensor(dw, w.shape().clone()),
        ))
    }
}
