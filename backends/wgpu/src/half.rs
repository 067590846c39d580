//! The compute format of read-only tensors ([`dflash_core::MemoryOps::to_compute_format`]):
//! f16 where the device has `SHADER_F16` (and [`crate::WgpuOptions::f16`] is on), f32
//! elsewhere. The kernels of `shaders/f16.wgsl` convert (f32 -> f16 rounds to nearest even on
//! the bits, NaN, infinities, overflow and subnormals included; f16 -> f32 is exact) and move
//! f16 elements at any offset (a buffer copy needs 4-byte offsets and sizes, an f16 element
//! is 2 bytes). The checkpoint loader ([`WgpuBackend::upload_frozen_chunked`]) is here too.

use dflash_core::{HostSlice, Result, Tensor};

use crate::pipelines::{Family, Kernel};
use crate::storage::{DType, WgpuStorage};
use crate::{WgpuBackend, groups};

const TO_F16: Kernel<'static> = Kernel::new(Family::F16, "to_f16");
const TO_F32: Kernel<'static> = Kernel::new(Family::F16, "to_f32");
pub(crate) const COPY2D_H: Kernel<'static> = Kernel::new(Family::F16, "copy2d_h");

/// Two f16 NaNs (0x7e00) in one 32-bit word: the poison of an f16 buffer.
const F16_NAN_PAIR: u32 = 0x7e00_7e00;

impl WgpuBackend {
    /// The dtype [`dflash_core::MemoryOps::to_compute_format`] gives: f16 where the device has
    /// `SHADER_F16` and [`crate::WgpuOptions::f16`] is on, else f32.
    pub fn compute_format(&self) -> DType {
        if self.opts.f16 && self.ctx.has_f16() {
            DType::F16
        } else {
            DType::F32
        }
    }

    /// An output buffer of `n` elements of `dtype` that the op writes in full, as
    /// [`Self::out`] (NaN-filled in poison mode).
    pub(crate) fn out_as(&self, op: &'static str, n: usize, dtype: DType) -> Result<WgpuStorage> {
        if dtype == DType::F32 {
            return self.out(op, n);
        }
        let s = self.ctx.alloc_for_writes(op, n, dtype)?;
        if self.opts.poison && n > 0 {
            self.fill_words(op, &s.buf, 0, n.div_ceil(2), F16_NAN_PAIR)?;
        }
        Ok(s)
    }

    /// `src` as a new buffer of `dtype` (rounded to nearest even into f16, exact into f32).
    pub(crate) fn convert(
        &self,
        op: &'static str,
        src: &WgpuStorage,
        dtype: DType,
    ) -> Result<WgpuStorage> {
        let out = self.out_as(op, src.len, dtype)?;
        if src.dtype == dtype {
            self.copy_elems(op, src, 0, &out, 0, src.len)?;
        } else {
            self.convert_range(op, src, 0, &out, 0, src.len)?;
        }
        Ok(out)
    }

    /// `dst[d0 .. d0 + n) = src[s0 .. s0 + n)` converted between f32 and f16 (the two differ);
    /// into f16, `d0` must be even (to_f16 writes whole words).
    fn convert_range(
        &self,
        op: &'static str,
        src: &WgpuStorage,
        s0: usize,
        dst: &WgpuStorage,
        d0: usize,
        n: usize,
    ) -> Result<()> {
        let narrow = dst.dtype == DType::F16;
        // Even chunk starts: to_f16 writes whole words (two elements per thread).
        let span = (self.span_elems() & !1).max(2);
        for c0 in (0..n).step_by(span) {
            let len = span.min(n - c0);
            let (sb, ss) = self.span(src, s0 + c0, len);
            let (db, ds) = self.span(dst, d0 + c0, len);
            if narrow {
                // The f16 offset alignment is an even element count, so `ds` is even too.
                let p = [len as u32, ss, ds / 2];
                let g = groups(len.div_ceil(2), 256);
                self.ctx.dispatch(op, &TO_F16, &p, &[sb], &[db], g)?;
            } else {
                let p = [len as u32, ss, ds];
                let g = groups(len, 256);
                self.ctx.dispatch(op, &TO_F32, &p, &[sb], &[db], g)?;
            }
        }
        Ok(())
    }

    /// [`dflash_core::MemoryOps::upload_frozen`] in host chunks of at most `chunk` elements
    /// (public so that tests cross chunk boundaries on small tensors): f16 file bytes into an
    /// f16 tensor as they are; anything into an f32 tensor widened on the host one chunk at a
    /// time; f32 or bf16 into an f16 tensor widened one chunk at a time into a device staging
    /// buffer and rounded from there. No whole-tensor f32 copy in host memory.
    pub fn upload_frozen_chunked(
        &self,
        data: HostSlice<'_>,
        shape: &[usize],
        chunk: usize,
    ) -> Result<Tensor> {
        let op = "upload_frozen";
        // Its host writes and empty submissions go to the queue directly: marked as this
        // instance's, so their errors are.
        let _on = self.ctx.enter(op);
        let n = data.check(op, self.tag(), shape)?;
        let dtype = self.compute_format();
        // Even, so every chunk starts at a whole word of an f16 tensor.
        let chunk = chunk.max(2) & !1;
        // Every element is written below (by the host, or by a conversion kernel).
        let out = self.ctx.alloc_for_writes(op, n, dtype)?;
        match (dtype, data) {
            (DType::F16, HostSlice::F16(bytes)) => {
                for c0 in (0..n).step_by(chunk) {
                    let len = chunk.min(n - c0);
                    let mut part = bytes[2 * c0..2 * (c0 + len)].to_vec();
                    // Writes are whole words; the buffer has room for the padding.
                    part.resize(part.len().next_multiple_of(4), 0);
                    self.ctx.queue.write_buffer(&out.buf, 2 * c0 as u64, &part);
                    self.ctx.queue.submit([]);
                }
            }
            (DType::F32, _) => {
                let mut host = vec![0.0f32; chunk.min(n)];
                for c0 in (0..n).step_by(chunk) {
                    let len = chunk.min(n - c0);
                    data.range(c0, len).widen_into(&mut host[..len]);
                    self.ctx.write(op, &out.buf, c0, &host[..len]);
                    self.ctx.queue.submit([]);
                }
            }
            (DType::F16, _) => {
                let staging = self.ctx.alloc_for_writes(op, chunk.min(n), DType::F32)?;
                let mut host = vec![0.0f32; chunk.min(n)];
                for c0 in (0..n).step_by(chunk) {
                    let len = chunk.min(n - c0);
                    data.range(c0, len).widen_into(&mut host[..len]);
                    self.ctx.write(op, &staging.buf, 0, &host[..len]);
                    self.convert_range(op, &staging, 0, &out, c0, len)?;
                    // The conversion must read this chunk before the next one is written: a
                    // queued write lands at the start of the next submission.
                    self.ctx.flush(op);
                }
            }
        }
        Ok(self.tensor(out, shape))
    }

    /// `s` itself when it is f32, else an f32 copy of it (for kernels that read f32 only: the
    /// attention kernel's q, k, v).
    pub(crate) fn widened<'a>(
        &self,
        op: &'static str,
        s: &'a WgpuStorage,
        keep: &'a mut Option<WgpuStorage>,
    ) -> Result<&'a WgpuStorage> {
        if s.dtype == DType::F32 {
            return Ok(s);
        }
        Ok(keep.insert(self.convert(op, s, DType::F32)?))
    }

    /// Copies `n` f16 elements from `src[s0..]` to `dst[d0..]`: one buffer copy where the byte
    /// offsets and size are whole words, else `copy2d_h` (one row, chunked over bindings).
    pub(crate) fn copy_halves(
        &self,
        op: &'static str,
        src: &WgpuStorage,
        s0: usize,
        dst: &WgpuStorage,
        d0: usize,
        n: usize,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        if s0.is_multiple_of(2) && d0.is_multiple_of(2) && n.is_multiple_of(2) {
            let (so, d, bytes) = (2 * s0 as u64, 2 * d0 as u64, 2 * n as u64);
            self.ctx.record(op, |enc| {
                enc.copy_buffer_to_buffer(&src.buf, so, &dst.buf, d, bytes)
            });
            return Ok(());
        }
        let span = self.span_elems();
        for c0 in (0..n).step_by(span.max(1)) {
            let len = span.min(n - c0);
            let (sb, ss) = self.span(src, s0 + c0, len);
            let (db, ds) = self.span(dst, d0 + c0, len);
            let p = [1, len as u32, len as u32, ss, len as u32, ds];
            self.ctx
                .dispatch(op, &COPY2D_H, &p, &[sb], &[db], groups(len, 256))?;
        }
        Ok(())
    }
}
