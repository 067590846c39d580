//! Device buffers of the ops: allocation (NaN-poisoned in poison mode), fills, dtype
//! conversions of operands, and the small uploads and downloads of index arrays, masks and
//! per-row results.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, DriverError, PushKernelArg};
use dflash_core::{Error, Result};

use crate::storage::{self, CudaStorage, DType, InBuf};
use crate::{CudaBackend, grid_vec8, grid1d};

/// Index arrays [`CudaBackend::upload_i32_cached`] keeps (a layer's positions and mask
/// intervals, for queries and context, with room for the backward's).
const UPLOAD_CACHE_ENTRIES: usize = 16;

impl CudaBackend {
    /// Uninitialised device memory for `n` elements (NaN-filled in poison mode: f32 NaN, or
    /// the bf16 quiet NaN 0x7FC0).
    pub(crate) fn alloc(&self, op: &'static str, n: usize, dtype: DType) -> Result<CudaSlice<u8>> {
        let bytes = self.byte_count(op, n, dtype)?;
        // SAFETY: the memory is written before it is read by every op that allocates it
        // (the poison mode exists to test exactly that).
        let mut buf =
            unsafe { self.stream.alloc::<u8>(bytes) }.map_err(|e| self.alloc_err(op, bytes, e))?;
        if self.opts.poison && n > 0 {
            self.fill_dt(op, &mut buf, n, dtype, f32::NAN)?;
        }
        Ok(buf)
    }

    /// f32 output buffer of `n` elements.
    pub(crate) fn alloc_f32(&self, op: &'static str, n: usize) -> Result<CudaSlice<u8>> {
        self.alloc(op, n, DType::F32)
    }

    /// The activation storage type of this backend.
    pub fn activations(&self) -> DType {
        self.opts.activations
    }

    /// Zero-filled f32 buffer of `n` elements.
    pub(crate) fn zeros_f32(&self, op: &'static str, n: usize) -> Result<CudaSlice<u8>> {
        self.zeros_dt(op, n, DType::F32)
    }

    /// Zero-filled buffer of `n` elements of `dtype` (0.0 is all-zero bytes in both).
    pub(crate) fn zeros_dt(
        &self,
        op: &'static str,
        n: usize,
        dtype: DType,
    ) -> Result<CudaSlice<u8>> {
        let bytes = self.byte_count(op, n, dtype)?;
        self.stream
            .alloc_zeros::<u8>(bytes)
            .map_err(|e| self.alloc_err(op, bytes, e))
    }

    /// The bytes of a buffer of `n` elements of `dtype` (at least 16), or a shape error where
    /// that does not fit in `usize`.
    fn byte_count(&self, op: &'static str, n: usize, dtype: DType) -> Result<usize> {
        n.checked_mul(dtype.size())
            .map(|b| b.max(16))
            .ok_or_else(|| self.shape_err(op, format!("{n} elements of {dtype:?} overflow usize")))
    }

    /// A failed allocation of `bytes`: [`Error::OutOfMemory`] (with the device's free and
    /// total memory) when the device is full, else a driver error naming op and size.
    pub(crate) fn alloc_err(&self, op: &'static str, bytes: usize, e: DriverError) -> Error {
        use cudarc::driver::sys::cudaError_enum::CUDA_ERROR_OUT_OF_MEMORY;
        if e.0 == CUDA_ERROR_OUT_OF_MEMORY {
            let info = self
                .dev
                .ctx
                .bind_to_thread()
                .ok()
                .and_then(|_| cudarc::driver::result::mem_get_info().ok());
            return Error::OutOfMemory {
                op,
                device: self.tag.clone(),
                requested: bytes as u64,
                free: info.map(|(f, _)| f as u64),
                total: info.map(|(_, t)| t as u64),
            };
        }
        Error::op(
            op,
            self.tag.clone(),
            format!("allocating {bytes} bytes failed: {e}"),
        )
    }

    /// Fills `n` f32 elements with `v`.
    pub(crate) fn fill(
        &self,
        op: &'static str,
        buf: &mut CudaSlice<u8>,
        n: usize,
        v: f32,
    ) -> Result<()> {
        self.fill_dt(op, buf, n, DType::F32, v)
    }

    /// Fills `n` elements of `dtype` with `v` (rounded to bf16, nearest even, for bf16).
    pub(crate) fn fill_dt(
        &self,
        op: &'static str,
        buf: &mut CudaSlice<u8>,
        n: usize,
        dtype: DType,
        v: f32,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let n64 = n as i64;
        match dtype {
            DType::F32 => {
                let mut l = self.stream.launch_builder(&self.dev.kernels.fill_f32);
                l.arg(buf).arg(&n64).arg(&v);
                self.launch(op, l, grid1d(n))
            }
            DType::Bf16 => {
                let bits = storage::bf16_bits(v) as u32;
                let mut l = self.stream.launch_builder(&self.dev.kernels.fill_u16);
                l.arg(buf).arg(&n64).arg(&bits);
                self.launch(op, l, grid1d(n))
            }
        }
    }

    /// Converts `n` elements from the raw device address `src` into the raw address `dst`
    /// as `to` (the other dtype at `src`). The caller holds both pointers' guards.
    pub(crate) fn convert_ptr(
        &self,
        op: &'static str,
        dst: u64,
        src: u64,
        n: usize,
        to: DType,
    ) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let n64 = n as i64;
        let mut l = self.stream.launch_builder(self.convert_kernel(to));
        l.arg(&dst).arg(&src).arg(&n64);
        self.launch(op, l, grid_vec8(n))
    }

    /// The activation inputs of one kernel in one dtype: their own when they all agree
    /// (borrowed), else f32, with the bf16 ones widened (exactly) into scratch. Kernels with
    /// several activation inputs are instantiated per (output, input) type pair rather than
    /// per combination; mixed inputs are rare (the models never mix them there) and widening
    /// changes no value.
    pub(crate) fn uniform<'a, const N: usize>(
        &self,
        op: &'static str,
        xs: [&'a CudaStorage; N],
    ) -> Result<(DType, [InBuf<'a>; N])> {
        let d0 = xs.first().map_or(DType::F32, |s| s.dtype);
        if xs.iter().all(|s| s.dtype == d0) {
            return Ok((d0, xs.map(|s| InBuf::Borrowed(&s.buf))));
        }
        let mut out = Vec::with_capacity(N);
        for s in xs {
            out.push(self.widen(op, s)?);
        }
        let arr: [InBuf<'a>; N] = match out.try_into() {
            Ok(a) => a,
            Err(_) => unreachable!("N buffers were pushed"),
        };
        Ok((DType::F32, arr))
    }

    /// `s` as f32: borrowed when it is f32, else an exact widened copy.
    pub(crate) fn widen<'a>(&self, op: &'static str, s: &'a CudaStorage) -> Result<InBuf<'a>> {
        if s.dtype == DType::F32 {
            return Ok(InBuf::Borrowed(&s.buf));
        }
        Ok(InBuf::Owned(self.converted(
            op,
            &s.buf,
            s.len,
            DType::F32,
        )?))
    }

    /// Uploads host i32 data (indices, positions, mask intervals) to a fresh device buffer.
    pub(crate) fn upload_i32(&self, op: &'static str, data: &[i32]) -> Result<CudaSlice<u8>> {
        let mut buf = self.alloc(op, data.len(), DType::F32)?; // 4-byte elements
        if !data.is_empty() {
            self.stream
                .memcpy_htod(storage::i32_bytes(data), &mut buf)
                .map_err(|e| self.drv(op, e))?;
        }
        Ok(buf)
    }

    /// As [`Self::upload_i32`], for arrays that recur: rotary positions and mask intervals
    /// are the same in every layer of a forward and its backward (and, at equal lengths, in
    /// every sequence of a target batch). The last [`UPLOAD_CACHE_ENTRIES`] arrays stay on the
    /// device and an identical array (compared in full, not by hash) reuses its buffer: no
    /// host-to-device copy of pageable memory, which may wait for the stream, per layer.
    pub(crate) fn upload_i32_cached(
        &self,
        op: &'static str,
        data: &[i32],
    ) -> Result<Arc<CudaSlice<u8>>> {
        let mut cache = self.uploads.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = cache.iter().position(|(d, _)| d.as_slice() == data) {
            let hit = cache.remove(i).expect("index from position");
            let buf = hit.1.clone();
            cache.push_front(hit);
            return Ok(buf);
        }
        let buf = Arc::new(self.upload_i32(op, data)?);
        cache.push_front((data.to_vec(), buf.clone()));
        cache.truncate(UPLOAD_CACHE_ENTRIES);
        Ok(buf)
    }

    /// Uploads the mask's four i32 interval arrays (first start/end, second start/end).
    /// Through the upload cache: a forward and its backward, and every layer with the same
    /// mask, share one copy.
    pub(crate) fn upload_mask(
        &self,
        op: &'static str,
        mask: &dflash_core::mask::BlockMask,
    ) -> Result<[Arc<CudaSlice<u8>>; 4]> {
        let [f0, f1, s0, s1] = mask.to_i32_arrays();
        Ok([
            self.upload_i32_cached(op, &f0)?,
            self.upload_i32_cached(op, &f1)?,
            self.upload_i32_cached(op, &s0)?,
            self.upload_i32_cached(op, &s1)?,
        ])
    }

    /// Downloads `n` plain values of type `T` (synchronises the stream).
    pub(crate) fn download_pod<T: Copy + Default>(
        &self,
        op: &'static str,
        buf: &CudaSlice<u8>,
        n: usize,
    ) -> Result<Vec<T>> {
        let mut out = vec![T::default(); n];
        if n > 0 {
            let bytes = n * std::mem::size_of::<T>();
            // SAFETY: `out` owns `bytes` bytes; T is a plain value type (f32/f64/i32/u64) for
            // which every bit pattern is valid.
            let dst = unsafe { std::slice::from_raw_parts_mut(out.as_mut_ptr() as *mut u8, bytes) };
            self.stream
                .memcpy_dtoh(&buf.slice(0..bytes), dst)
                .map_err(|e| self.drv(op, e))?;
        }
        self.stream.synchronize().map_err(|e| self.drv(op, e))?;
        self.dev.ctx.check_err().map_err(|e| self.drv(op, e))?;
        Ok(out)
    }
}
