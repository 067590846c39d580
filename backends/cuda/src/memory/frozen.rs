//! Frozen weights onto the device: the compute format and `MemoryOps::upload_frozen`'s
//! chunked host-to-device transfers (with the conversion to the compute format).

use cudarc::driver::{DevicePtr, DevicePtrMut};
use dflash_core::{HostSlice, Result, Tensor};

use crate::storage::{DType, f32_bytes};
use crate::{CudaBackend, GemmPrecision};

impl CudaBackend {
    /// Elements per host-to-device transfer of
    /// [`MemoryOps::upload_frozen`](dflash_core::MemoryOps::upload_frozen): 64 MB of f32 at most,
    /// which bounds its host (f16 widening) and device (conversion scratch) buffers.
    pub const FROZEN_CHUNK: usize = 16 << 20;

    /// The dtype of [`MemoryOps::to_compute_format`](dflash_core::MemoryOps::to_compute_format):
    /// bf16 with bf16 GEMMs, else f32.
    pub fn compute_format(&self) -> DType {
        if self.opts.gemm == GemmPrecision::Bf16 {
            DType::Bf16
        } else {
            DType::F32
        }
    }

    /// [`MemoryOps::upload_frozen`](dflash_core::MemoryOps::upload_frozen) through transfers of at
    /// most `chunk` elements (public so that tests can cross chunk boundaries on small tensors).
    /// The bytes cross PCIe in the file's dtype (f16, which has no device kernel, widened to f32 on
    /// the host one chunk at a time); when that is the compute format (bf16 files with bf16 GEMMs,
    /// f32 files with f32 GEMMs) they are copied straight into the tensor, else into a chunk of
    /// device scratch and converted from there (f32 -> bf16 rounds to nearest even, bf16 -> f32 is
    /// exact). The host copies are pageable: the driver returns once it has staged the source, so
    /// the caller's memory (a memory map) can be dropped right after.
    pub fn upload_frozen_chunked(
        &self,
        data: HostSlice<'_>,
        shape: &[usize],
        chunk: usize,
    ) -> Result<Tensor> {
        let op = "upload_frozen";
        let n = data.check(op, &self.tag, shape)?;
        let chunk = chunk.max(1);
        let to = self.compute_format();
        let wire = match data {
            HostSlice::Bf16(_) => DType::Bf16,
            HostSlice::F32(_) | HostSlice::F16(_) => DType::F32,
        };
        let mut out = self.alloc(op, n, to)?;
        let mut scratch = if wire != to && n > 0 {
            Some(self.alloc(op, n.min(chunk), wire)?)
        } else {
            None
        };
        let mut widened = Vec::new();
        let mut start = 0;
        while start < n {
            let len = (n - start).min(chunk);
            let part = data.range(start, len);
            let bytes = match part {
                HostSlice::F16(_) => {
                    widened.resize(len, 0.0f32);
                    part.widen_into(&mut widened);
                    f32_bytes(&widened)
                }
                HostSlice::F32(b) | HostSlice::Bf16(b) => b,
            };
            let at = start * to.size();
            match scratch.as_mut() {
                None => self
                    .stream
                    .memcpy_htod(bytes, &mut out.slice_mut(at..at + bytes.len()))
                    .map_err(|e| self.drv(op, e))?,
                Some(s) => {
                    self.stream
                        .memcpy_htod(bytes, &mut s.slice_mut(0..bytes.len()))
                        .map_err(|e| self.drv(op, e))?;
                    let (src, _src_guard) = s.device_ptr(&self.stream);
                    let (dst, _dst_guard) = out.device_ptr_mut(&self.stream);
                    self.convert_ptr(op, dst + at as u64, src, len, to)?;
                }
            }
            start += len;
        }
        Ok(self.tensor(out, to, shape))
    }
}
