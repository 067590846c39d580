//! Fused linear cross-entropy against a frozen LM head, and chunked greedy argmax
//! (`shaders/loss.wgsl` between `gemm.wgsl` products). Never a `(T, V)` tensor:
//!
//! - the rows that take part (weight > 0, checked on the host exactly as the reference checks
//!   them) are gathered in chunks of up to 1024 into `xc (n, H)`;
//! - the vocabulary is walked in chunks of `vc` ids (one chunk where the whole vocabulary
//!   fits) so that a chunk's logits `(n, vc)` and its slice of the head `(vc, H)` stay within
//!   the budget and one binding; per chunk
//!   `logits = xc @ w[v0..v0+vc]^T` is folded into a running (max, sum of exps, argmax, label
//!   logit) per row (`ce_stats`, an online log-sum-exp);
//! - the backward turns each chunk's logits into `grad_scale * w * (softmax - onehot)` in place
//!   (`ce_dlogits`) and accumulates `dxc += dlogits @ w[v0..v0+vc]`; with more than one chunk
//!   the logits are recomputed for it (one more GEMM per chunk instead of keeping `(n, V)`);
//! - `dxc` is scattered back into the rows of `dx` (skipped rows stay exactly 0), and the row
//!   states are read back once at the end: `CE = max + ln(sum) - logit[label]` in f64.
//!
//! The head may be f16 (a frozen LM head in the compute format): both GEMMs widen it on load.

use dflash_core::{LossDims, LossOps, LossStats, Result, Tensor, Transpose};

use crate::WgpuBackend;
use crate::gemm::Operand;
use crate::pipelines::{Family, Kernel};
use crate::storage::{DType, WgpuStorage, storage, storage_any};

const STATS: Kernel<'static> = Kernel::new(Family::Loss, "ce_stats");
const DLOGITS: Kernel<'static> = Kernel::new(Family::Loss, "ce_dlogits");

/// The fewest rows of a whole-vocabulary chunk, and its granularity (the GEMM's 128-row
/// tile).
const ROW_CHUNK: usize = 128;
/// Most rows per chunk: the `dx` product of a chunk `(n, H) = dlogits (n, V) @ w (V, H)` has
/// only `n / 128 * H / 128` workgroups, so `n` must be large for it to fill a GPU (n = 128
/// and H = 4096 gave 32 workgroups: most of the 8B drafter step's time on the H200).
const MAX_ROWS: usize = 1024;
/// Elements of one chunk of logits (640 MiB of f32: 1024 rows of a 152K vocabulary), within
/// the adapter's binding limit.
const LOGITS_BUDGET: usize = 160 << 20;
/// Words of running state per row (loss.wgsl).
const STATE: usize = 8;

/// One chunk of rows: their indices, labels and weights on the device.
struct RowChunk {
    n: usize,
    idx: WgpuStorage,
    labels: WgpuStorage,
    weights: WgpuStorage,
    state: WgpuStorage,
}

impl WgpuBackend {
    /// Ids per vocabulary chunk for `n` rows of width `h` against a head stored as `head`.
    fn vocab_chunk(&self, n: usize, h: usize, v: usize, head: DType) -> usize {
        let budget = LOGITS_BUDGET.min(self.span_elems());
        let by_logits = budget / n.max(1);
        let by_head = self.span_elems_of(head) / h.max(1);
        by_logits.min(by_head).min(v).max(1)
    }

    /// Rows per chunk and ids per vocabulary chunk for `rows` active rows: whole-vocabulary
    /// chunks (the backward reuses the forward's logits) of as many rows as the budget holds,
    /// a multiple of [`ROW_CHUNK`] up to [`MAX_ROWS`]; where the whole vocabulary does not
    /// fit (its logits for [`ROW_CHUNK`] rows, or the head's rows in one binding: a 152K x
    /// 4096 head is 2.5 GB in f32, 1.25 GB in f16), [`MAX_ROWS`] rows and vocabulary chunks
    /// (the backward then recomputes each chunk's logits: one more product, against 8x
    /// fewer workgroups in every `dx` product with 128-row chunks).
    fn ce_chunks(&self, rows: usize, h: usize, v: usize, head: DType) -> (usize, usize) {
        let full_rows = LOGITS_BUDGET.min(self.span_elems()) / v.max(1);
        let whole = full_rows >= ROW_CHUNK && self.span_elems_of(head) / h.max(1) >= v;
        let n = if whole {
            full_rows.min(MAX_ROWS) / ROW_CHUNK * ROW_CHUNK
        } else {
            MAX_ROWS
        };
        let n = n.min(rows).max(1);
        (n, self.vocab_chunk(n, h, v, head))
    }

    /// `logits (n, vc) = xc (n, H) @ w[v0..v0+vc]^T`.
    #[allow(clippy::too_many_arguments)]
    fn chunk_logits(
        &self,
        op: &'static str,
        xc: Operand<'_>,
        w: &WgpuStorage,
        h: usize,
        (n, v0, vc): (usize, usize, usize),
        logits: &WgpuStorage,
    ) -> Result<()> {
        let wop = Operand {
            s: w,
            at: v0 * h,
            ld: h,
            t: Transpose::Yes,
        };
        self.gemm(op, xc, wop, logits, 0, (n, vc, h), 0.0)
    }

    /// Folds the logits of ids `[v0, v0 + vc)` into the chunk's row states.
    fn fold_stats(
        &self,
        op: &'static str,
        c: &RowChunk,
        logits: &WgpuStorage,
        (v0, vc): (usize, usize),
    ) -> Result<()> {
        let p = [c.n as u32, vc as u32, v0 as u32, (v0 == 0) as u32];
        let reads = [logits.bind_elems(0, c.n * vc), c.labels.bind()];
        self.ctx.dispatch(
            op,
            &self.reducing(&STATS),
            &p,
            &reads,
            &[c.state.bind()],
            c.n as u64,
        )
    }

    /// The forward over all vocabulary chunks of one row chunk; returns the logits buffer when
    /// there was a single chunk (still holding its logits, for the backward to reuse).
    fn forward_chunk(
        &self,
        op: &'static str,
        c: &RowChunk,
        xc: Operand<'_>,
        w: &WgpuStorage,
        (h, v, vc): (usize, usize, usize),
        logits: &WgpuStorage,
    ) -> Result<()> {
        for v0 in (0..v).step_by(vc) {
            let len = vc.min(v - v0);
            self.chunk_logits(op, xc, w, h, (c.n, v0, len), logits)?;
            self.fold_stats(op, c, logits, (v0, len))?;
        }
        Ok(())
    }

    fn upload_rows(
        &self,
        op: &'static str,
        rows: &[usize],
        labels: &[u32],
        weights: &[f32],
    ) -> Result<RowChunk> {
        let n = rows.len();
        let idx: Vec<u32> = rows.iter().map(|&r| r as u32).collect();
        let lab: Vec<u32> = rows.iter().map(|&r| labels[r]).collect();
        let wts: Vec<f32> = rows.iter().map(|&r| weights[r]).collect();
        let w = self.ctx.upload_f32(op, &wts)?;
        Ok(RowChunk {
            n,
            idx: self.ctx.upload_u32(op, &idx)?,
            labels: self.ctx.upload_u32(op, &lab)?,
            weights: w,
            state: self.ctx.alloc(op, n * STATE)?,
        })
    }
}

/// `(lse, best id, label logit)` of one row's state; NaN lse when a logit was NaN.
fn read_state(s: &[f32]) -> (f64, u32, f64) {
    let lse = if s[5] != 0.0 {
        f64::NAN
    } else {
        s[0] as f64 + (s[1] as f64).ln()
    };
    (lse, s[3].to_bits(), s[4] as f64)
}

impl LossOps for WgpuBackend {
    fn linear_cross_entropy(
        &self,
        x: &Tensor,
        w_head: &Tensor,
        labels: &[u32],
        weights: &[f32],
        grad_scale: f32,
    ) -> Result<(LossStats, Tensor)> {
        let op = "linear_cross_entropy";
        let dims = LossDims::of_cross_entropy(op, self.tag(), x, w_head, labels, weights)?;
        let (t, h, v) = (dims.rows, dims.hidden, dims.vocab);
        let xs = storage(op, &self.ctx, x)?;
        // The head may be f16 (a frozen LM head in the compute format): the GEMMs widen it.
        let ws = storage_any(op, &self.ctx, w_head)?;
        let active = dims.active_rows(op, self.tag(), labels, weights)?;
        // Skipped rows stay exactly 0: wgpu zero-initialises the buffer.
        let dx = self.ctx.alloc(op, t * h)?;
        let mut stats = LossStats::default();
        if active.is_empty() {
            return Ok((stats, self.tensor(dx, x.shape().clone())));
        }
        let (n_max, vc) = self.ce_chunks(active.len(), h, v, ws.dtype);
        let single = vc >= v;
        let xc = self.ctx.alloc(op, n_max * h)?;
        let dxc = self.ctx.alloc(op, n_max * h)?;
        let logits = self.ctx.alloc(op, n_max * vc)?;
        let mut chunks = Vec::new();
        for rows in active.chunks(n_max) {
            let c = self.upload_rows(op, rows, labels, weights)?;
            self.gather_scatter(op, false, xs, t, h, &c.idx, c.n, &xc)?;
            let xo = Operand {
                s: &xc,
                at: 0,
                ld: h,
                t: Transpose::No,
            };
            self.forward_chunk(op, &c, xo, ws, (h, v, vc), &logits)?;
            for (i, v0) in (0..v).step_by(vc).enumerate() {
                let len = vc.min(v - v0);
                if !single {
                    self.chunk_logits(op, xo, ws, h, (c.n, v0, len), &logits)?;
                }
                let p = [c.n as u32, len as u32, v0 as u32, 0, grad_scale.to_bits()];
                let reads = [c.labels.bind(), c.weights.bind(), c.state.bind()];
                let write = [logits.bind_elems(0, c.n * len)];
                let g = crate::groups(c.n * len, 256);
                self.ctx.dispatch(op, &DLOGITS, &p, &reads, &write, g)?;
                // dxc (n, H) (+)= dlogits (n, len) @ w[v0..v0+len] (len, H)
                let dl = Operand {
                    s: &logits,
                    at: 0,
                    ld: len,
                    t: Transpose::No,
                };
                let wo = Operand {
                    s: ws,
                    at: v0 * h,
                    ld: h,
                    t: Transpose::No,
                };
                let beta = if i == 0 { 0.0 } else { 1.0 };
                self.gemm(op, dl, wo, &dxc, 0, (c.n, h, len), beta)?;
            }
            self.gather_scatter(op, true, &dx, t, h, &c.idx, c.n, &dxc)?;
            chunks.push((rows, c));
        }
        for (rows, c) in &chunks {
            let s = self.ctx.download(&c.state.buf, 0, c.n * STATE)?;
            for (&row, st) in rows.iter().zip(s.chunks_exact(STATE)) {
                let (lse, best, label_logit) = read_state(st);
                let wt = weights[row] as f64;
                stats.weighted_loss += wt * (lse - label_logit);
                stats.weight_sum += wt;
                stats.counted += 1;
                stats.correct += (best == labels[row]) as u64;
            }
        }
        Ok((stats, self.tensor(dx, x.shape().clone())))
    }

    fn linear_argmax(&self, x: &Tensor, w_head: &Tensor) -> Result<Vec<u32>> {
        let op = "linear_argmax";
        let LossDims {
            rows: t,
            hidden: h,
            vocab: v,
        } = LossDims::of_argmax(op, self.tag(), x, w_head)?;
        let xs = storage(op, &self.ctx, x)?;
        // The head may be f16 (a frozen LM head in the compute format): the GEMMs widen it.
        let ws = storage_any(op, &self.ctx, w_head)?;
        if t == 0 {
            return Ok(Vec::new());
        }
        let (n_max, vc) = self.ce_chunks(t, h, v, ws.dtype);
        let logits = self.ctx.alloc(op, n_max * vc)?;
        let mut chunks = Vec::new();
        for r0 in (0..t).step_by(n_max) {
            let rows: Vec<usize> = (r0..(r0 + n_max).min(t)).collect();
            // No label: u32::MAX is inside no vocabulary chunk.
            let c = RowChunk {
                n: rows.len(),
                idx: self.ctx.alloc(op, 0)?,
                labels: self.ctx.upload_u32(op, &vec![u32::MAX; rows.len()])?,
                weights: self.ctx.alloc(op, 0)?,
                state: self.ctx.alloc(op, rows.len() * STATE)?,
            };
            // x's rows are contiguous already: the operand starts at row r0.
            let xo = Operand {
                s: xs,
                at: r0 * h,
                ld: h,
                t: Transpose::No,
            };
            self.forward_chunk(op, &c, xo, ws, (h, v, vc), &logits)?;
            chunks.push(c);
        }
        let mut out = Vec::with_capacity(t);
        for c in &chunks {
            let s = self.ctx.download(&c.state.buf, 0, c.n * STATE)?;
            out.extend(s.chunks_exact(STATE).map(|st| read_state(st).1));
        }
        Ok(out)
    }
}
