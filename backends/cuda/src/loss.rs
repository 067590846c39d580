//! Fused linear cross-entropy against a frozen LM head, and chunked greedy argmax.
//!
//! Only active rows (weight > 0) take part: their indices, labels and weights are uploaded
//! once. Per chunk of up to `CHUNK_ROWS` active rows (fewer when the vocabulary is large, so
//! the logits chunk stays within `LOGITS_BYTES`): gather `x` rows into `xc (n, H)`; `logits
//! (n, V) = xc @ W^T` (cuBLASLt) into a reusable workspace; one block per row
//! (`kernels/loss.cu`) computes max/argmax, log-sum-exp and CE in one pass over the row and
//! writes `dlogits = grad_scale * w * (softmax - onehot)` in a second (as a separate bf16
//! matrix when the GEMMs are bf16: the next GEMM's operand, with no conversion pass; else
//! over the f32 logits in place); then
//! `dx_chunk (n, H) = dlogits @ W`
//! (cuBLASLt) is scattered into `dx`, which starts at zero (skipped rows stay exactly 0).
//! With `grad_scale == 0` (loss only) the second GEMM is skipped: `dx` is all zeros. The
//! per-row CE (f64) and correctness flags are downloaded once at the end (one sync) and
//! summed on the host in row order, like the reference. No `(T, V)` tensor ever exists.
//!
//! The head may be f32 or bf16 (`to_compute_format`); `x` may be f32 or bf16 (gathered in its
//! own dtype, so a bf16 `x` is a bf16 GEMM operand read in place); `dx` is an activation
//! gradient (`CudaOptions::activations`: the f32 `dx` chunk of the GEMM is rounded once when
//! scattered). Logits, dlogits and the per-row statistics stay f32. With bf16 GEMMs a bf16 head
//! is read in place (no copy at all) and an f32 head is rounded once per call; with TF32/FP32
//! GEMMs a bf16 head is widened once per call.

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};
use dflash_core::{LossDims, LossOps, LossStats, Result, Tensor};

use crate::gemm::{GemmPrecision, Operand, RowMajorGemm};
use crate::storage::{CudaStorage, DType, f32_bytes};
use crate::{CudaBackend, grid1d};

/// Most rows per logits chunk.
const CHUNK_ROWS: usize = 1024;
/// Largest f32 logits chunk (bytes): 320 MiB, i.e. 512 rows at a 152K vocabulary.
const LOGITS_BYTES: usize = 320 << 20;
/// Chunks of at least this many rows are a whole number of them: the chunk is the row
/// dimension of both products with the head, and cuBLASLt's tiles are 64-256 rows wide, so a
/// chunk of 441 rows would run 512 rows' worth of tiles.
const CHUNK_ALIGN: usize = 128;

/// Active rows per chunk for a `v`-row head.
fn chunk_rows(v: usize) -> usize {
    dflash_core::ops::loss::logits_chunk_rows(LOGITS_BYTES, v, CHUNK_ROWS, CHUNK_ALIGN)
}

/// One block of `threads` per row (the per-row kernels; `ce_rows` is built for <= 256).
fn row_cfg(rows: usize, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

impl CudaBackend {
    /// The LM head as the GEMMs of this call read it: `None` when its storage already is the
    /// GEMM mode's operand type (a bf16 head in `Bf16` mode, an f32 head otherwise: read in
    /// place, no copy), else one converted copy for every chunk's GEMMs (an f32 head rounded
    /// to bf16, or a bf16 head widened to f32 for TF32/FP32 GEMMs). Returns the copy and the
    /// dtype the GEMMs see.
    fn head_operand(
        &self,
        op: &'static str,
        w: &CudaStorage,
    ) -> Result<(Option<CudaSlice<u8>>, DType)> {
        let want = match self.opts.gemm {
            GemmPrecision::Bf16 => DType::Bf16,
            GemmPrecision::Tf32 | GemmPrecision::Fp32 => DType::F32,
        };
        if w.dtype == want || w.len == 0 {
            return Ok((None, w.dtype));
        }
        let mut out = self.alloc(op, w.len, want)?;
        let (p, _g) = w.ptr(&self.stream);
        self.convert_raw(op, &mut out, p, w.len, want)?;
        Ok((Some(out), want))
    }

    /// The loss workspace, grown to at least `bytes`.
    fn with_loss_ws<R>(
        &self,
        op: &'static str,
        bytes: usize,
        f: impl FnOnce(&mut CudaSlice<u8>) -> Result<R>,
    ) -> Result<R> {
        let mut guard = self.loss_ws.lock().unwrap_or_else(|p| p.into_inner());
        if guard.as_ref().is_none_or(|b| b.len() < bytes) {
            *guard = None; // free first
            // SAFETY: every region of the workspace is written before it is read.
            let buf = unsafe { self.stream.alloc::<u8>(bytes) }
                .map_err(|e| self.alloc_err(op, bytes, e))?;
            *guard = Some(buf);
        }
        f(guard.as_mut().expect("workspace just ensured"))
    }

    /// The device part of `linear_cross_entropy` for `na > 0` active rows and `H > 0`: runs
    /// every chunk (adding the scattered dx rows into `dx` unless `grad_scale == 0`) and
    /// returns the per-row CE and correctness flags, in active-row order (one sync).
    fn ce_active_rows(
        &self,
        op: &'static str,
        (xs, ws): (&CudaStorage, &CudaStorage),
        (rows, act_labels, act_weights): (&[i32], &[i32], &[f32]),
        (h, v): (usize, usize),
        grad_scale: f32,
        dx: &mut CudaSlice<u8>,
    ) -> Result<(Vec<f64>, Vec<i32>)> {
        let na = rows.len();
        // The head in the GEMMs' operand type: in place if it already is (a bf16 head with
        // bf16 GEMMs), else converted once for every chunk's two GEMMs.
        let (w_conv, w_dtype) = self.head_operand(op, ws)?;
        let w_buf = w_conv.as_ref().unwrap_or(&ws.buf);
        let rows_dev = self.upload_i32(op, rows)?;
        let labels_dev = self.upload_i32(op, act_labels)?;
        let mut weights_dev = self.alloc_f32(op, na)?;
        self.stream
            .memcpy_htod(f32_bytes(act_weights), &mut weights_dev)
            .map_err(|e| self.drv(op, e))?;
        let mut ce_dev = self.alloc(op, 2 * na, DType::F32)?; // na f64
        let mut correct_dev = self.alloc(op, na, DType::F32)?; // na i32

        // With bf16 GEMMs the dlogits are a bf16 matrix of their own, which the dX GEMM reads
        // unconverted; else they overwrite the f32 logits.
        let dl_dtype = match self.opts.gemm {
            GemmPrecision::Bf16 => DType::Bf16,
            GemmPrecision::Tf32 | GemmPrecision::Fp32 => DType::F32,
        };
        let call = CeChunkInputs {
            x: xs,
            w: w_buf,
            w_dtype,
            rows: &rows_dev,
            labels: &labels_dev,
            weights: &weights_dev,
            h,
            v,
            grad_scale,
            layout: CeWorkspace::plan(h, v, dl_dtype),
        };
        let chunk = call.layout.chunk;
        self.with_loss_ws(op, call.layout.bytes, |wsb| {
            for c0 in (0..na).step_by(chunk) {
                let n = chunk.min(na - c0);
                self.ce_chunk_logits(op, &call, wsb, c0, n)?;
                self.ce_chunk_rows(op, &call, wsb, c0, n, [&mut ce_dev, &mut correct_dev])?;
                if grad_scale != 0.0 {
                    self.ce_chunk_dx(op, &call, wsb, c0, n, dx)?;
                }
            }
            Ok(())
        })?;
        let ce: Vec<f64> = self.download_pod(op, &ce_dev, na)?;
        let ok: Vec<i32> = self.download_pod(op, &correct_dev, na)?;
        Ok((ce, ok))
    }

    /// Gathers the chunk's `n` active rows (from `c0`) of `x` into the workspace's `xc` and
    /// computes their logits `(n, V) = xc @ W^T` into its f32 logits region.
    fn ce_chunk_logits(
        &self,
        op: &'static str,
        call: &CeChunkInputs<'_>,
        wsb: &mut CudaSlice<u8>,
        c0: usize,
        n: usize,
    ) -> Result<()> {
        let (xs, h, v) = (call.x, call.h, call.v);
        let (h64, n64) = (h as i64, n as i64);
        // xc = x[rows[c0..c0+n]], in x's dtype (a copy)
        {
            let mut xc = wsb.slice_mut(0..n * h * xs.dtype.size());
            let rv = call.rows.slice(c0 * 4..(c0 + n) * 4);
            let f = match xs.dtype {
                DType::F32 => &self.k().gather_rows_f32,
                DType::Bf16 => &self.k().gather_rows_u16,
            };
            let mut l = self.stream.launch_builder(f);
            l.arg(&mut xc).arg(&xs.buf).arg(&rv).arg(&n64).arg(&h64);
            self.launch(op, l, grid1d(n * h))?;
        }
        // logits (n, V) = xc (n, H) @ W (V, H)^T
        let logits = HeadGemm {
            a: (0, xs.dtype, h),
            tb: true,
            mnk: (n, v, h),
            c: call.layout.off_logits,
        };
        self.ce_head_gemm(op, call, wsb, &logits)
    }

    /// One of the loss's two products with the head: `c (m, n) = a (m, k) @ op(W)`, `a` and the
    /// f32 `c` in the workspace `wsb` at their byte offsets, `W` as the GEMMs read it.
    fn ce_head_gemm(
        &self,
        op: &'static str,
        call: &CeChunkInputs<'_>,
        wsb: &mut CudaSlice<u8>,
        g: &HeadGemm,
    ) -> Result<()> {
        let (a_off, a_dtype, a_cols) = g.a;
        let (m, n, k) = g.mnk;
        let (base, _g) = wsb.device_ptr_mut(&self.stream);
        let (pw, _gw) = call.w.device_ptr(&self.stream);
        self.gemm_raw(
            op,
            &RowMajorGemm {
                m,
                n,
                k,
                a: Operand::new(base + a_off as u64, a_dtype),
                a_cols,
                ta: false,
                b: Operand::new(pw, call.w_dtype),
                b_cols: call.h,
                tb: g.tb,
                c: base + g.c as u64,
                c_dtype: DType::F32,
                alpha: 1.0,
                beta: 0.0,
            },
        )
    }

    /// The per-row statistics of the chunk's `n` active rows (from `c0`: CE as f64 into `ce`,
    /// argmax correctness as i32 into `correct`) and their dlogits, one block per row.
    fn ce_chunk_rows(
        &self,
        op: &'static str,
        call: &CeChunkInputs<'_>,
        wsb: &mut CudaSlice<u8>,
        c0: usize,
        n: usize,
        [ce, correct]: [&mut CudaSlice<u8>; 2],
    ) -> Result<()> {
        let v32 = call.v as i32;
        let (base, _g) = wsb.device_ptr_mut(&self.stream);
        let (off_logits, off_dl) = (call.layout.off_logits, call.layout.off_dl);
        let (lg, dl) = (base + off_logits as u64, base + off_dl as u64);
        let lv = call.labels.slice(c0 * 4..(c0 + n) * 4);
        let wv = call.weights.slice(c0 * 4..(c0 + n) * 4);
        let mut cv = ce.slice_mut(c0 * 8..(c0 + n) * 8);
        let mut okv = correct.slice_mut(c0 * 4..(c0 + n) * 4);
        let mut l = self.stream.launch_builder(&self.k().ce_rows);
        l.arg(&lg)
            .arg(&dl)
            .arg(&call.layout.dl_bf16)
            .arg(&lv)
            .arg(&wv)
            .arg(&v32)
            .arg(&call.grad_scale)
            .arg(&mut cv)
            .arg(&mut okv);
        self.launch(op, l, row_cfg(n, 256))?;
        Ok(())
    }

    /// `dxc (n, H) = dlogits (n, V) @ W` for the chunk's `n` active rows (from `c0`),
    /// scattered into their rows of `dx` (in the activation dtype).
    fn ce_chunk_dx(
        &self,
        op: &'static str,
        call: &CeChunkInputs<'_>,
        wsb: &mut CudaSlice<u8>,
        c0: usize,
        n: usize,
        dx: &mut CudaSlice<u8>,
    ) -> Result<()> {
        let (h, v) = (call.h, call.v);
        let (h64, n64) = (h as i64, n as i64);
        let od = self.opts.activations;
        let CeWorkspace {
            dl_dtype,
            off_dxc,
            off_dl,
            ..
        } = call.layout;
        // dxc (n, H) = dlogits (n, V) @ W (V, H)
        let dxc_gemm = HeadGemm {
            a: (off_dl, dl_dtype, v),
            tb: false,
            mnk: (n, h, v),
            c: off_dxc,
        };
        self.ce_head_gemm(op, call, wsb, &dxc_gemm)?;
        let dxc = wsb.slice(off_dxc..off_dxc + n * h * 4);
        let rv = call.rows.slice(c0 * 4..(c0 + n) * 4);
        let k = self.k();
        let f = crate::kernels::pick(&[&k.scatter_rows_f, &k.scatter_rows_b], &[od]);
        let mut l = self.stream.launch_builder(f);
        l.arg(&mut *dx).arg(&dxc).arg(&rv).arg(&n64).arg(&h64);
        self.launch(op, l, grid1d(n * h))?;
        Ok(())
    }
}

/// What every chunk of one `linear_cross_entropy` call reads: `x`, the head as the GEMMs see
/// it, the active rows' indices, labels and weights (uploaded once), the sizes and the
/// workspace layout.
struct CeChunkInputs<'a> {
    x: &'a CudaStorage,
    /// The head as the GEMMs read it (in place or converted: [`CudaBackend::head_operand`]).
    w: &'a CudaSlice<u8>,
    w_dtype: DType,
    /// i32 row indices into `x`.
    rows: &'a CudaSlice<u8>,
    /// i32 labels.
    labels: &'a CudaSlice<u8>,
    /// f32 weights.
    weights: &'a CudaSlice<u8>,
    h: usize,
    v: usize,
    grad_scale: f32,
    layout: CeWorkspace,
}

/// One product of the loss with the head (`ce_head_gemm`): `a` as (byte offset in the
/// workspace, dtype, columns), whether `W (V, H)` enters transposed, `(m, n, k)`, and the byte
/// offset of the f32 `c` in the workspace.
struct HeadGemm {
    a: (usize, DType, usize),
    tb: bool,
    mnk: (usize, usize, usize),
    c: usize,
}

/// The chunking and loss-workspace layout of one `linear_cross_entropy` call.
struct CeWorkspace {
    /// Most active rows per chunk.
    chunk: usize,
    /// The dlogits' dtype (the dX GEMM's operand), and as the `ce_rows` flag (1: bf16).
    dl_dtype: DType,
    dl_bf16: i32,
    /// Byte offsets of the regions `dxc`, `logits` and `dlogits` (`xc` is at 0).
    off_dxc: usize,
    off_logits: usize,
    off_dl: usize,
    /// Workspace bytes the call needs.
    bytes: usize,
}

impl CeWorkspace {
    /// The layout for `H = h`, `V = v` and dlogits of `dl_dtype`.
    fn plan(h: usize, v: usize, dl_dtype: DType) -> Self {
        let dl_bf16 = (dl_dtype == DType::Bf16) as i32;
        let chunk = chunk_rows(v);
        let (xc_len, logits_len) = (chunk * h, chunk * v);
        let dl_bytes = if dl_bf16 != 0 { logits_len * 2 } else { 0 };
        let bytes = (2 * xc_len + logits_len) * 4 + dl_bytes + 256 * 4;
        // Workspace regions (256-byte aligned): xc (chunk, H), dxc (chunk, H), logits
        // (chunk, V) f32, and with bf16 GEMMs dlogits (chunk, V) bf16.
        let al = |b: usize| b.div_ceil(256) * 256;
        let off_dxc = al(xc_len * 4);
        let off_logits = off_dxc + al(xc_len * 4);
        let off_dl = if dl_bf16 != 0 {
            off_logits + al(logits_len * 4)
        } else {
            off_logits
        };
        CeWorkspace {
            chunk,
            dl_dtype,
            dl_bf16,
            off_dxc,
            off_logits,
            off_dl,
            bytes,
        }
    }
}

impl LossOps for CudaBackend {
    fn linear_cross_entropy(
        &self,
        x: &Tensor,
        w_head: &Tensor,
        labels: &[u32],
        weights: &[f32],
        grad_scale: f32,
    ) -> Result<(LossStats, Tensor)> {
        let op = "linear_cross_entropy";
        let dims = LossDims::of_cross_entropy(op, &self.tag, x, w_head, labels, weights)?;
        let (t, h, v) = (dims.rows, dims.hidden, dims.vocab);
        let (xs, ws) = (self.any(op, x)?, self.any(op, w_head)?);
        let active = dims.active_rows(op, &self.tag, labels, weights)?;
        let rows: Vec<i32> = active.iter().map(|&r| r as i32).collect();
        let act_labels: Vec<i32> = active.iter().map(|&r| labels[r] as i32).collect();
        let act_weights: Vec<f32> = active.iter().map(|&r| weights[r]).collect();
        let od = self.opts.activations;
        let mut dx = self.zeros_dt(op, t * h, od)?;
        let na = rows.len();
        let mut stats = LossStats::default();
        if na == 0 || h == 0 {
            // Nothing supervised: zero stats and dx. With H = 0 every logit is 0, so each
            // active row has CE = ln V and argmax 0 (what the reference's empty GEMM gives).
            for (&lab, &wt) in act_labels.iter().zip(&act_weights) {
                stats.weighted_loss += wt as f64 * (v as f64).ln();
                stats.weight_sum += wt as f64;
                stats.counted += 1;
                stats.correct += (lab == 0) as u64;
            }
            return Ok((stats, self.tensor(dx, od, x.shape().clone())));
        }
        let (ce, ok) = self.ce_active_rows(
            op,
            (xs, ws),
            (&rows, &act_labels, &act_weights),
            (h, v),
            grad_scale,
            &mut dx,
        )?;
        for ((&wt, &c), &k) in act_weights.iter().zip(&ce).zip(&ok) {
            let wt = wt as f64;
            stats.weighted_loss += wt * c;
            stats.weight_sum += wt;
            stats.counted += 1;
            stats.correct += (k != 0) as u64;
        }
        Ok((stats, self.tensor(dx, od, x.shape().clone())))
    }

    fn linear_argmax(&self, x: &Tensor, w_head: &Tensor) -> Result<Vec<u32>> {
        let op = "linear_argmax";
        let LossDims {
            rows: t,
            hidden: h,
            vocab: v,
        } = LossDims::of_argmax(op, &self.tag, x, w_head)?;
        let (xs, ws) = (self.any(op, x)?, self.any(op, w_head)?);
        if t == 0 {
            return Ok(Vec::new());
        }
        if h == 0 {
            return Ok(vec![0; t]); // all logits 0: lowest index
        }
        // The head in the GEMMs' operand type (in place, or converted once for all chunks).
        let (w_conv, w_dtype) = self.head_operand(op, ws)?;
        let w_buf = w_conv.as_ref().unwrap_or(&ws.buf);
        let mut out = self.alloc(op, t, DType::F32)?; // t i32
        let chunk = chunk_rows(v);
        let v32 = v as i32;
        self.with_loss_ws(op, chunk * v * 4, |wsb| {
            for r0 in (0..t).step_by(chunk) {
                let n = chunk.min(t - r0);
                {
                    let (base, _g) = wsb.device_ptr_mut(&self.stream);
                    let (px, _gx) = xs.buf.device_ptr(&self.stream);
                    let (pw, _gw) = w_buf.device_ptr(&self.stream);
                    self.gemm_raw(
                        op,
                        &RowMajorGemm {
                            m: n,
                            n: v,
                            k: h,
                            a: Operand::new(px + (r0 * h * xs.dtype.size()) as u64, xs.dtype),
                            a_cols: h,
                            ta: false,
                            b: Operand::new(pw, w_dtype),
                            b_cols: h,
                            tb: true,
                            c: base,
                            c_dtype: DType::F32,
                            alpha: 1.0,
                            beta: 0.0,
                        },
                    )?;
                }
                let lg = wsb.slice(0..n * v * 4);
                let mut ov = out.slice_mut(r0 * 4..(r0 + n) * 4);
                let mut l = self.stream.launch_builder(&self.k().argmax_rows);
                l.arg(&lg).arg(&v32).arg(&mut ov);
                self.launch(op, l, row_cfg(n, 512))?;
            }
            Ok(())
        })?;
        let ids: Vec<i32> = self.download_pod(op, &out, t)?;
        Ok(ids.into_iter().map(|i| i as u32).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_whole_tiles_within_the_logits_budget() {
        // Qwen3's vocabulary: 552 rows fit the budget, 512 are taken.
        assert_eq!(chunk_rows(151_936), 512);
        // A small vocabulary hits the row cap; a huge one leaves fewer rows than a tile.
        assert_eq!(chunk_rows(320), CHUNK_ROWS);
        assert_eq!(chunk_rows(1 << 24), LOGITS_BYTES / ((1 << 24) * 4));
        for v in [1, 1000, 32_000, 128_256, 151_936, 262_144, 1 << 22] {
            let c = chunk_rows(v);
            assert!(c >= 1 && c * v * 4 <= LOGITS_BYTES.max(v * 4), "v {v}: {c}");
            assert!(
                c < CHUNK_ALIGN || c.is_multiple_of(CHUNK_ALIGN),
                "v {v}: {c}"
            );
        }
    }
}
