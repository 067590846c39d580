//! `wgpu-tiled`'s forward and backward dispatches (the kernels and tile lists: [`super::tiled`]).
//!
//! Operands indexed by query row (q, out, lse, d_out and dq) larger than one storage binding
//! are split by query rows: each chunk of rows is bound from its first row, with the mask's
//! rows sliced to it, and runs as a call of its own. k, v, dk and dv stay whole (every chunk
//! reads all keys); the dk/dv kernel carries its sums across the chunks as it does across
//! passes, so it starts on the first chunk and scales on the last.

use std::borrow::Cow;

use dflash_core::mask::BlockMask;
use dflash_core::{AttnDims, Result};

use super::plan::{FIRST, LAST};
use super::tiled::AttnKind;
use crate::storage::WgpuStorage;
use crate::{WgpuBackend, groups};

/// Query rows a chunk holds, a multiple of: every kernel's tile rows (at most 128), and the
/// binding offset alignment (at most 256 bytes: 256 rows of lse are 1 KiB a head).
const CHUNK_ROWS: usize = 256;

/// Query rows `[q0, q1)` and the mask's rows sliced to them.
struct Chunk<'m> {
    q0: usize,
    q1: usize,
    mask: Cow<'m, BlockMask>,
}

impl Chunk<'_> {
    fn rows(&self) -> usize {
        self.q1 - self.q0
    }

    /// The dims of the chunk's call.
    fn dims(&self, dims: &AttnDims) -> AttnDims {
        AttnDims {
            q_rows: self.rows(),
            ..*dims
        }
    }

    /// The chunk's part of a `(Tq, width)` operand.
    fn bind<'a>(&self, s: &'a WgpuStorage, width: usize) -> crate::pipelines::Bind<'a> {
        s.bind_elems(self.q0 * width, self.rows() * width)
    }
}

impl WgpuBackend {
    /// The query-row chunks of a call: one (the whole mask, borrowed) when the row-indexed
    /// operands fit one binding.
    fn row_chunks<'m>(
        &self,
        op: &'static str,
        dims: &AttnDims,
        mask: &'m BlockMask,
    ) -> Result<Vec<Chunk<'m>>> {
        let max = self.max_binding_elems();
        let kv = dims.kv_rows * dims.kv_heads * dims.head_dim;
        if kv > max {
            return Err(self.err(
                op,
                format!(
                    "wgpu-tiled: k and v of {kv} elements exceed one storage binding ({max} \
                     elements); the query rows are split, the keys are not"
                ),
            ));
        }
        let row = (dims.q_heads * dims.head_dim).max(1);
        if dims.q_rows * row <= max {
            return Ok(vec![Chunk {
                q0: 0,
                q1: dims.q_rows,
                mask: Cow::Borrowed(mask),
            }]);
        }
        let rows = max / row / CHUNK_ROWS * CHUNK_ROWS;
        if rows == 0 {
            return Err(self.err(
                op,
                format!(
                    "wgpu-tiled: {CHUNK_ROWS} query rows of {row} elements exceed one storage \
                     binding ({max} elements)"
                ),
            ));
        }
        (0..dims.q_rows)
            .step_by(rows)
            .map(|q0| {
                let q1 = (q0 + rows).min(dims.q_rows);
                let sliced = BlockMask::from_intervals(
                    mask.kv_len(),
                    mask.first()[q0..q1].to_vec(),
                    mask.second()[q0..q1].to_vec(),
                )
                .map_err(|e| self.err(op, format!("rows {q0}..{q1} of the mask: {e}")))?;
                Ok(Chunk {
                    q0,
                    q1,
                    mask: Cow::Owned(sliced),
                })
            })
            .collect()
    }

    /// The forward into `out (Tq, Hq, D)` and `lse (Tq, Hq)`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn tiled_forward(
        &self,
        op: &'static str,
        dims: &AttnDims,
        mask: &BlockMask,
        scale: f32,
        [q, k, v]: [&WgpuStorage; 3],
        out: &WgpuStorage,
        lse: &WgpuStorage,
    ) -> Result<()> {
        let [cfg] = self.tiled_check(op, dims, &[q.len, k.len], [AttnKind::Fwd])?;
        if out.len == 0 {
            return Ok(());
        }
        let (bq, bk) = cfg.tiles();
        let (hq, d) = (dims.q_heads, dims.head_dim);
        let per = self.per_pass(&cfg);
        let fwd = cfg.kernel(cfg.fwd_entry());
        for c in self.row_chunks(op, dims, mask)? {
            let m = self.meta(op, &c.mask, bq, bk)?;
            let cd = c.dims(dims);
            let p = self.attn_params(&cd, scale, &m, &cfg);
            // The row state between passes: (max, sum, NaN seen) per (row, head).
            let state_len = if m.max_q_list > per {
                3 * c.rows() * hq
            } else {
                3
            };
            let state = self.ctx.alloc(op, state_len)?;
            let reads = [c.bind(q, hq * d), k.bind(), v.bind(), m.buf.bind()];
            let writes = [c.bind(out, hq * d), c.bind(lse, hq), state.bind()];
            let g = (c.rows().div_ceil(bq) * hq) as u64;
            let all = FIRST | LAST;
            self.passes(op, &fwd, p, per, m.max_q_list, &reads, &writes, g, all)?;
        }
        Ok(())
    }

    /// The backward into `dq`, `dk`, `dv` (shaped as `q`, `k`, `v`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn tiled_backward(
        &self,
        op: &'static str,
        dims: &AttnDims,
        mask: &BlockMask,
        scale: f32,
        [q, k, v, out, lse, d_out]: [&WgpuStorage; 6],
        [dq, dk, dv]: [&WgpuStorage; 3],
    ) -> Result<()> {
        let [cq, ckv] =
            self.tiled_check(op, dims, &[q.len, k.len], [AttnKind::Dq, AttnKind::Dkdv])?;
        let (hq, d) = (dims.q_heads, dims.head_dim);
        let dsum = self.ctx.alloc(op, lse.len)?;
        let chunks = self.row_chunks(op, dims, mask)?;
        let n = chunks.len();
        for (i, c) in chunks.iter().enumerate() {
            let cd = c.dims(dims);
            let mq = self.meta(op, &c.mask, cq.tiles().0, cq.tiles().1)?;
            let p = self.attn_params(&cd, scale, &mq, &cq);
            let (qc, dout_c) = (c.bind(q, hq * d), c.bind(d_out, hq * d));
            let (lse_c, dsum_c) = (c.bind(lse, hq), c.bind(&dsum, hq));
            let reads = [
                qc,
                k.bind(),
                v.bind(),
                mq.buf.bind(),
                dout_c,
                c.bind(out, hq * d),
            ];
            let dsum_k = cq.kernel("attn_dsum");
            let g = groups(c.rows() * hq, 128);
            self.ctx.dispatch(op, &dsum_k, &p, &reads, &[dsum_c], g)?;
            let rows_in = [qc, k.bind(), v.bind(), mq.buf.bind(), dout_c, lse_c, dsum_c];
            if dq.len > 0 {
                let g = (c.rows().div_ceil(cq.tiles().0) * hq) as u64;
                let per = self.per_pass(&cq);
                let kernel = cq.kernel(cq.dq_entry());
                let writes = [c.bind(dq, hq * d)];
                let all = FIRST | LAST;
                self.passes(
                    op,
                    &kernel,
                    p,
                    per,
                    mq.max_q_list,
                    &rows_in,
                    &writes,
                    g,
                    all,
                )?;
            }
            if dk.len > 0 {
                let mk = self.meta(op, &c.mask, ckv.tiles().0, ckv.tiles().1)?;
                let p = self.attn_params(&cd, scale, &mk, &ckv);
                let mut reads = rows_in;
                reads[3] = mk.buf.bind();
                let g = (dims.kv_rows.div_ceil(ckv.tiles().1) * dims.kv_heads) as u64;
                let len = mk.max_k_list * dims.group();
                let per = self.per_pass(&ckv);
                let writes = [dk.bind(), dv.bind()];
                let kernel = ckv.kernel(ckv.dkdv_entry());
                // dk and dv sum over every chunk's rows: started by the first, scaled by the
                // last.
                let keep = if i == 0 { FIRST } else { 0 } | if i + 1 == n { LAST } else { 0 };
                self.passes(op, &kernel, p, per, len, &reads, &writes, g, keep)?;
            }
        }
        Ok(())
    }
}
