//! Buffers, host transfers and elementwise glue. Whole-buffer moves (copy, narrow, row
//! concatenation) are buffer-to-buffer copies, which no binding limit applies to; kernels
//! (`shaders/memory.wgsl`) bind at most one binding's worth per dispatch and loop over chunks.
//! Reductions write one f32 partial per 4096 elements; the host adds the partials in f64.
//! The moves (download, copy, narrow, concatenation) take either dtype and keep it (parts of
//! one concatenation must agree); the arithmetic and the reductions take f32.

use dflash_core::{HostSlice, MemoryOps, Result, Tensor};

use crate::half::COPY2D_H;
use crate::pipelines::{Family, Kernel};
use crate::storage::{DType, WgpuStorage, storage, storage_any, storage_mut};
use crate::{WgpuBackend, groups};

const ADD: Kernel<'static> = Kernel::new(Family::Memory, "add");
const ADD_ASSIGN: Kernel<'static> = Kernel::new(Family::Memory, "add_assign");
const SCALE: Kernel<'static> = Kernel::new(Family::Memory, "scale");
const COPY2D: Kernel<'static> = Kernel::new(Family::Memory, "copy2d");
const SUM_SQUARES: Kernel<'static> = Kernel::new(Family::Memory, "sum_squares_partial");
const NONFINITE: Kernel<'static> = Kernel::new(Family::Memory, "nonfinite_partial");

/// Elements per reduction partial (memory.wgsl: 256 threads x 16).
const PER_PARTIAL: usize = 4096;

impl WgpuBackend {
    /// Copies `n` elements from `src[s0..]` to `dst[d0..]` (the same dtype): a recorded buffer
    /// copy, no binding limit (f16 at odd offsets: [`Self::copy_halves`]).
    pub(crate) fn copy_elems(
        &self,
        op: &'static str,
        src: &WgpuStorage,
        s0: usize,
        dst: &WgpuStorage,
        d0: usize,
        n: usize,
    ) -> Result<()> {
        if src.dtype != dst.dtype {
            return Err(self.err(
                op,
                format!(
                    "copy from {} into {} (the dtypes must agree)",
                    src.dtype.name(),
                    dst.dtype.name()
                ),
            ));
        }
        if src.dtype == DType::F16 {
            return self.copy_halves(op, src, s0, dst, d0, n);
        }
        if n > 0 {
            let (so, d, bytes) = (4 * s0 as u64, 4 * d0 as u64, 4 * n as u64);
            self.ctx.record(op, |enc| {
                enc.copy_buffer_to_buffer(&src.buf, so, &dst.buf, d, bytes)
            });
        }
        Ok(())
    }

    /// The one dtype of `parts` (an error of `op` naming the first that differs).
    fn common_dtype(&self, op: &'static str, parts: &[&WgpuStorage]) -> Result<DType> {
        let d = parts.first().map_or(DType::F32, |s| s.dtype);
        match parts.iter().position(|s| s.dtype != d) {
            None => Ok(d),
            Some(i) => Err(self.err(
                op,
                format!(
                    "part {i} is {} but part 0 is {} (parts must share a dtype)",
                    parts[i].dtype.name(),
                    d.name()
                ),
            )),
        }
    }

    /// `(R, c)` `src` into columns `[off, off + c)` of `(R, total)` `dst`, chunked by rows.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn copy_cols(
        &self,
        op: &'static str,
        src: &WgpuStorage,
        dst: &WgpuStorage,
        rows: usize,
        c: usize,
        total: usize,
        off: usize,
    ) -> Result<()> {
        if rows == 0 || c == 0 {
            return Ok(());
        }
        let per = self.span_elems() / total.max(1);
        if per == 0 {
            // Rows longer than a binding: one copy per row.
            for r in 0..rows {
                self.copy_elems(op, src, r * c, dst, r * total + off, c)?;
            }
            return Ok(());
        }
        let k = if src.dtype == DType::F16 {
            &COPY2D_H
        } else {
            &COPY2D
        };
        for r0 in (0..rows).step_by(per) {
            let rc = per.min(rows - r0);
            let (sb, ss) = self.span(src, r0 * c, rc * c);
            let (db, ds) = self.span(dst, r0 * total, rc * total);
            let p = [
                rc as u32,
                c as u32,
                c as u32,
                ss,
                total as u32,
                ds + off as u32,
            ];
            self.ctx
                .dispatch(op, k, &p, &[sb], &[db], groups(rc * c, 256))?;
        }
        Ok(())
    }

    /// `s[start .. start + n) *= v`, chunked over bindings.
    pub(crate) fn scale_range(
        &self,
        op: &'static str,
        s: &WgpuStorage,
        start: usize,
        n: usize,
        v: f32,
    ) -> Result<()> {
        let span = self.span_elems();
        for c0 in (0..n).step_by(span) {
            let len = span.min(n - c0);
            let (b, shift) = self.span(s, start + c0, len);
            let p = [len as u32, v.to_bits(), shift];
            self.ctx
                .dispatch(op, &SCALE, &p, &[], &[b], groups(len, 256))?;
        }
        Ok(())
    }

    /// One partial per 4096 elements of each tensor, all read back in one transfer; returns
    /// each tensor's partials.
    fn partials(&self, op: &'static str, k: &Kernel<'_>, ts: &[&Tensor]) -> Result<Vec<Vec<f32>>> {
        let k = &self.reducing(k);
        let mut counts = Vec::with_capacity(ts.len());
        let mut total = 0usize;
        let mut plan = Vec::new(); // (tensor, chunk start, chunk len, first partial)
        for (i, t) in ts.iter().enumerate() {
            let s = storage(op, &self.ctx, t)?;
            let mut count = 0;
            for (start, len) in self.chunks(s.len) {
                plan.push((i, start, len, total + count));
                count += len.div_ceil(PER_PARTIAL);
            }
            counts.push(count);
            total += count;
        }
        if total > self.max_binding_elems() {
            return Err(self.err(op, format!("{total} partial sums exceed one binding")));
        }
        let out = self.ctx.alloc(op, total)?;
        for &(i, start, len, first) in &plan {
            let s = storage(op, &self.ctx, ts[i])?;
            let p = [len as u32, first as u32];
            let g = groups(len, PER_PARTIAL);
            self.ctx
                .dispatch(op, k, &p, &[s.bind_elems(start, len)], &[out.bind()], g)?;
        }
        let all = if total > 0 {
            self.ctx.download(&out.buf, 0, total)?
        } else {
            Vec::new()
        };
        let mut res = Vec::with_capacity(ts.len());
        let mut at = 0;
        for c in counts {
            res.push(all[at..at + c].to_vec());
            at += c;
        }
        Ok(res)
    }

    /// One elementwise kernel over `n` elements: `reads` and `writes` bound chunk by chunk at
    /// the same offsets, `params` = `[chunk len, extra...]`.
    pub(crate) fn elementwise(
        &self,
        op: &'static str,
        k: &Kernel<'_>,
        n: usize,
        extra: &[u32],
        reads: &[&WgpuStorage],
        writes: &[&WgpuStorage],
    ) -> Result<()> {
        for (start, len) in self.chunks(n) {
            let mut p = vec![len as u32];
            p.extend_from_slice(extra);
            let r: Vec<_> = reads.iter().map(|s| s.bind_elems(start, len)).collect();
            let w: Vec<_> = writes.iter().map(|s| s.bind_elems(start, len)).collect();
            self.ctx.dispatch(op, k, &p, &r, &w, groups(len, 256))?;
        }
        Ok(())
    }
}

impl MemoryOps for WgpuBackend {
    fn is_local(&self, t: &Tensor) -> bool {
        t.storage()
            .as_any()
            .downcast_ref::<WgpuStorage>()
            .is_some_and(|s| std::sync::Arc::ptr_eq(&s.ctx, &self.ctx))
    }

    fn upload(&self, data: &[f32], shape: &[usize]) -> Result<Tensor> {
        dflash_core::upload_numel(data.len(), shape).map_err(|e| self.shape_err("upload", e))?;
        Ok(self.tensor(self.ctx.upload_f32("upload", data)?, shape))
    }

    fn download(&self, t: &Tensor) -> Result<Vec<f32>> {
        let s = storage_any("download", &self.ctx, t)?;
        self.ctx.download_as(&s.buf, s.dtype, s.len)
    }

    /// The file's bytes in chunks of 16 Mi elements ([`WgpuBackend::upload_frozen_chunked`]).
    fn upload_frozen(&self, data: HostSlice<'_>, shape: &[usize]) -> Result<Tensor> {
        self.upload_frozen_chunked(data, shape, 16 << 20)
    }

    /// f16 where [`WgpuBackend::compute_format`] says so (rounded to nearest even on the
    /// device); an f16 tensor stays as it is.
    fn to_compute_format(&self, t: Tensor) -> Result<Tensor> {
        let op = "to_compute_format";
        let s = storage_any(op, &self.ctx, &t)?;
        let want = self.compute_format();
        if s.dtype == want || s.dtype == DType::F16 {
            return Ok(t);
        }
        let out = self.convert(op, s, want)?;
        Ok(self.tensor(out, t.shape().clone()))
    }

    fn zeros(&self, shape: &[usize]) -> Result<Tensor> {
        // wgpu zero-initialises every buffer before its first use.
        let n = dflash_core::tensor::checked_numel("zeros", &self.ctx.tag, shape)?;
        let s = self.ctx.alloc("zeros", n)?;
        Ok(self.tensor(s, shape))
    }

    fn copy(&self, t: &Tensor) -> Result<Tensor> {
        let s = storage_any("copy", &self.ctx, t)?;
        let out = self.out_as("copy", s.len, s.dtype)?;
        self.copy_elems("copy", s, 0, &out, 0, s.len)?;
        Ok(self.tensor(out, t.shape().clone()))
    }

    fn narrow_rows(&self, t: &Tensor, start: usize, len: usize) -> Result<Tensor> {
        let op = "narrow_rows";
        let s = storage_any(op, &self.ctx, t)?;
        let (row, dims) =
            dflash_core::narrow_rows_dims(t, start, len).map_err(|e| self.shape_err(op, e))?;
        let out = self.out_as(op, len * row, s.dtype)?;
        self.copy_elems(op, s, start * row, &out, 0, len * row)?;
        Ok(self.tensor(out, dims))
    }

    fn concat_rows(&self, parts: &[&Tensor]) -> Result<Tensor> {
        let op = "concat_rows";
        let dims = dflash_core::concat_rows_dims(parts).map_err(|e| self.shape_err(op, e))?;
        let ss = parts
            .iter()
            .map(|p| storage_any(op, &self.ctx, p))
            .collect::<Result<Vec<_>>>()?;
        let dtype = self.common_dtype(op, &ss)?;
        let out = self.out_as(op, dims.iter().product(), dtype)?;
        let mut at = 0;
        for s in ss {
            self.copy_elems(op, s, 0, &out, at, s.len)?;
            at += s.len;
        }
        Ok(self.tensor(out, dims))
    }

    fn concat_cols(&self, parts: &[&Tensor]) -> Result<Tensor> {
        let op = "concat_cols";
        let (rows, cols) =
            dflash_core::concat_cols_dims(parts).map_err(|e| self.shape_err(op, e))?;
        let ss = parts
            .iter()
            .map(|p| storage_any(op, &self.ctx, p))
            .collect::<Result<Vec<_>>>()?;
        let dtype = self.common_dtype(op, &ss)?;
        let total: usize = cols.iter().sum();
        let out = self.out_as(op, rows * total, dtype)?;
        let mut off = 0;
        for (s, &c) in ss.into_iter().zip(&cols) {
            self.copy_cols(op, s, &out, rows, c, total, off)?;
            off += c;
        }
        Ok(self.tensor(out, [rows, total]))
    }

    fn add(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        let op = "add";
        dflash_core::ops::same_shape(op, self.tag(), "a and b", a, b)?;
        let (x, y) = (storage(op, &self.ctx, a)?, storage(op, &self.ctx, b)?);
        let out = self.out(op, x.len)?;
        self.elementwise(op, &ADD, x.len, &[0], &[x, y], &[&out])?;
        Ok(self.tensor(out, a.shape().clone()))
    }

    fn add_assign(&self, acc: &mut Tensor, x: &Tensor) -> Result<()> {
        let op = "add_assign";
        if acc.numel() != x.numel() {
            return Err(self.shape_err(
                op,
                format!(
                    "acc {:?} vs x {:?} (element counts differ)",
                    acc.shape(),
                    x.shape()
                ),
            ));
        }
        let xs = storage(op, &self.ctx, x)?;
        let a = storage_mut(op, &self.ctx, acc)?;
        self.elementwise(op, &ADD_ASSIGN, xs.len, &[0], &[xs], &[a])
    }

    fn scale_assign(&self, t: &mut Tensor, s: f32) -> Result<()> {
        let op = "scale_assign";
        let st = storage_mut(op, &self.ctx, t)?;
        self.scale_range(op, st, 0, st.len, s)
    }

    fn sum_squares(&self, t: &Tensor) -> Result<f64> {
        Ok(self.sum_squares_many(&[t])?[0])
    }

    /// Every tensor's partials in one read-back; each tensor's partials added in order in f64.
    fn sum_squares_many(&self, ts: &[&Tensor]) -> Result<Vec<f64>> {
        let parts = self.partials("sum_squares", &SUM_SQUARES, ts)?;
        Ok(parts
            .iter()
            .map(|p| p.iter().map(|&v| v as f64).sum())
            .collect())
    }

    fn all_finite(&self, t: &Tensor) -> Result<bool> {
        let parts = self.partials("all_finite", &NONFINITE, &[t])?;
        Ok(parts[0].iter().all(|&c| c == 0.0))
    }
}
