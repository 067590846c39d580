//! Row gather from a frozen `(V, H)` table (`shaders/embedding.wgsl`), and the gather and
//! scatter of rows by an index list that the loss uses. Ids are checked on the host (an
//! out-of-range id is an error naming it and its position, never a read out of bounds);
//! tables and outputs larger than one binding are walked in row chunks. The table may be f16
//! (the compute format of a frozen embedding): `gather_h` widens its rows into f32.

use dflash_core::{EmbeddingOps, Result, Tensor};

use crate::pipelines::{Family, Kernel};
use crate::storage::{DType, WgpuStorage, storage_any};
use crate::{WgpuBackend, groups};

const GATHER: Kernel<'static> = Kernel::new(Family::Embedding, "gather");
const SCATTER: Kernel<'static> = Kernel::new(Family::Embedding, "scatter");
const GATHER_H: Kernel<'static> = Kernel::new(Family::F16, "gather_h");

impl WgpuBackend {
    /// `out (n, h)[t] = table (v, h)[idx[t]]` (gather) or `out (v, h)[idx[t]] = src (n, h)[t]`
    /// (scatter), every index `< v`: for each chunk of the `(n, h)` side, each chunk of the
    /// `(v, h)` side handles the indices inside it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gather_scatter(
        &self,
        op: &'static str,
        scatter: bool,
        big: &WgpuStorage,
        v: usize,
        h: usize,
        idx: &WgpuStorage,
        n: usize,
        small: &WgpuStorage,
    ) -> Result<()> {
        if n == 0 || h == 0 {
            return Ok(());
        }
        if small.dtype != DType::F32 || (scatter && big.dtype != DType::F32) {
            return Err(self.err(
                op,
                format!(
                    "{} into {} rows: only a gather's table may be f16",
                    if scatter { "scatter" } else { "gather" },
                    big.dtype.name()
                ),
            ));
        }
        let gather = if big.dtype == DType::F16 {
            &GATHER_H
        } else {
            &GATHER
        };
        let rows = (self.span_elems() / h).max(1);
        for t0 in (0..n).step_by(rows) {
            let tc = rows.min(n - t0);
            let (sb, ssh) = self.span(small, t0 * h, tc * h);
            let (ib, ish) = self.span(idx, t0, tc);
            for v0 in (0..v).step_by(rows) {
                let vc = rows.min(v - v0);
                let (bb, bsh) = self.span(big, v0 * h, vc * h);
                let g = groups(tc * h, 256);
                let (v0, v1) = (v0 as u32, (v0 + vc) as u32);
                if scatter {
                    let p = [tc as u32, h as u32, v0, v1, ssh, bsh, ish];
                    self.ctx.dispatch(op, &SCATTER, &p, &[sb, ib], &[bb], g)?;
                } else {
                    let p = [tc as u32, h as u32, v0, v1, bsh, ssh, ish];
                    self.ctx.dispatch(op, gather, &p, &[bb, ib], &[sb], g)?;
                }
            }
        }
        Ok(())
    }
}

impl EmbeddingOps for WgpuBackend {
    fn embedding(&self, table: &Tensor, ids: &[u32]) -> Result<Tensor> {
        let op = "embedding";
        let tab = storage_any(op, &self.ctx, table)?;
        let (v, h) = dflash_core::embedding_dims(op, &self.ctx.tag, table, ids)?;
        let out = self.out(op, ids.len() * h)?;
        let idx = self.ctx.upload_u32(op, ids)?;
        self.gather_scatter(op, false, tab, v, h, &idx, ids.len(), &out)?;
        Ok(self.tensor(out, [ids.len(), h]))
    }
}
