//! Device storage: one untyped device allocation plus a [`DType`] tag, and the checked
//! downcasts every op goes through.
//!
//! The buffer is bytes (`CudaSlice<u8>`) so that memory ops (copy, narrow, concat, transfers)
//! are dtype-generic and a bf16 activation path only needs conversion kernels
//! ([`crate::CudaBackend::to_dtype`]) and bf16 variants of the compute kernels; model code does
//! not change. Every compute op reads f32 or bf16 activations (`CudaBackend::any`) and writes
//! activations in `CudaOptions::activations`; only tensors that must be f32 (statistics such
//! as rstd / lse, the AdamW state, collectives' gradients) go through `CudaBackend::f32s`,
//! which rejects bf16 with an error naming op, dtype and device.

use std::any::Any;
use std::fmt;

use cudarc::driver::{CudaSlice, CudaStream, CudaView, DevicePtr, DevicePtrMut, SyncOnDrop};
use dflash_core::{Error, Result, Shape, Storage, Tensor};

use crate::CudaBackend;

/// Element type of a device buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    Bf16,
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::Bf16 => 2,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::Bf16 => "bf16",
        }
    }
}

/// The CUDA backend's buffer: `len` elements of `dtype` in device memory of device `ordinal`.
pub struct CudaStorage {
    /// At least `len * dtype.size()` bytes (a 0-element tensor still owns a few bytes, since
    /// the driver does not hand out empty allocations).
    pub(crate) buf: CudaSlice<u8>,
    pub(crate) dtype: DType,
    pub(crate) len: usize,
    pub(crate) ordinal: usize,
}

impl CudaStorage {
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    pub fn len(&self) -> usize {
        self.len
    }
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }
    pub(crate) fn bytes(&self) -> usize {
        self.len * self.dtype.size()
    }
    /// A view of elements `[start, end)`.
    pub(crate) fn view(&self, start: usize, end: usize) -> CudaView<'_, u8> {
        let s = self.dtype.size();
        self.buf.slice(start * s..end * s)
    }
    /// The raw device address for library calls (cuBLASLt); the guard orders `stream` after
    /// earlier writes and must outlive the call.
    pub(crate) fn ptr<'a>(&'a self, stream: &'a CudaStream) -> (u64, SyncOnDrop<'a>) {
        self.buf.device_ptr(stream)
    }
    pub(crate) fn ptr_mut<'a>(&'a mut self, stream: &'a CudaStream) -> (u64, SyncOnDrop<'a>) {
        self.buf.device_ptr_mut(stream)
    }
}

impl fmt::Debug for CudaStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "CudaStorage(cuda:{}, {} x {})",
            self.ordinal,
            self.len,
            self.dtype.name()
        )
    }
}

impl Storage for CudaStorage {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
    fn backend_name(&self) -> &'static str {
        "cuda"
    }
    /// Copies through the buffer's own stream (ordered after its pending writes), then widens
    /// bf16 on the host.
    fn read_host(&self, n: usize) -> Result<Vec<f32>> {
        let device = format!("cuda:{}", self.ordinal);
        if n > self.len {
            return Err(Error::shape(
                "read_host",
                device,
                format!("{n} elements asked of a buffer of {}", self.len),
            ));
        }
        let mut bytes = vec![0u8; n * self.dtype.size()];
        if n > 0 {
            let stream = self.buf.stream().clone();
            let drv = |e: cudarc::driver::DriverError| {
                Error::op(
                    "read_host",
                    device.clone(),
                    format!("CUDA driver error: {e}"),
                )
            };
            stream
                .memcpy_dtoh(&self.view(0, n), &mut bytes)
                .map_err(drv)?;
            stream.synchronize().map_err(drv)?;
        }
        Ok(match self.dtype {
            DType::F32 => bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            // bf16 is the top half of an f32: widening is exact.
            DType::Bf16 => bytes
                .chunks_exact(2)
                .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16))
                .collect(),
        })
    }
}

impl CudaBackend {
    fn foreign(&self, op: &'static str, t_backend: &str, shape: &Shape) -> Error {
        Error::ForeignTensor {
            op,
            device: self.tag.clone(),
            detail: format!(
                "a {shape:?} tensor of backend {t_backend:?} given to backend \"cuda\" on {}",
                self.tag
            ),
        }
    }

    fn check_storage(&self, op: &'static str, s: &CudaStorage, shape: &Shape) -> Result<()> {
        if s.ordinal != self.ordinal {
            return Err(Error::ForeignTensor {
                op,
                device: self.tag.clone(),
                detail: format!(
                    "a {shape:?} tensor on cuda:{} given to the backend on {}",
                    s.ordinal, self.tag
                ),
            });
        }
        if s.len != shape.numel() {
            return Err(Error::op(
                op,
                self.tag.clone(),
                format!(
                    "tensor {shape:?} holds {} elements, not {}",
                    s.len,
                    shape.numel()
                ),
            ));
        }
        Ok(())
    }

    /// This backend's storage of `t`, any dtype.
    pub(crate) fn any<'a>(&self, op: &'static str, t: &'a Tensor) -> Result<&'a CudaStorage> {
        let backend = t.storage().backend_name();
        match t.storage().as_any().downcast_ref::<CudaStorage>() {
            Some(s) => {
                self.check_storage(op, s, t.shape())?;
                Ok(s)
            }
            None => Err(self.foreign(op, backend, t.shape())),
        }
    }

    /// This backend's f32 storage of `t` (what every v1 compute op takes).
    pub(crate) fn f32s<'a>(&self, op: &'static str, t: &'a Tensor) -> Result<&'a CudaStorage> {
        let s = self.any(op, t)?;
        self.want_f32(op, s, t.shape())?;
        Ok(s)
    }

    /// This backend's storage of `t`, any dtype, mutable (in-place ops keep `t`'s dtype).
    pub(crate) fn any_mut<'a>(
        &self,
        op: &'static str,
        t: &'a mut Tensor,
    ) -> Result<&'a mut CudaStorage> {
        let shape = t.shape().clone();
        let backend = t.storage().backend_name();
        match t.storage_mut().as_any_mut().downcast_mut::<CudaStorage>() {
            Some(s) => {
                self.check_storage(op, s, &shape)?;
                Ok(s)
            }
            None => Err(self.foreign(op, backend, &shape)),
        }
    }

    pub(crate) fn f32s_mut<'a>(
        &self,
        op: &'static str,
        t: &'a mut Tensor,
    ) -> Result<&'a mut CudaStorage> {
        let shape = t.shape().clone();
        let s = self.any_mut(op, t)?;
        self.want_f32(op, s, &shape)?;
        Ok(s)
    }

    fn want_f32(&self, op: &'static str, s: &CudaStorage, shape: &Shape) -> Result<()> {
        if s.dtype != DType::F32 {
            return Err(Error::op(
                op,
                self.tag.clone(),
                format!(
                    "tensor {shape:?} is {}; this op computes in f32 only (convert with to_dtype)",
                    s.dtype.name()
                ),
            ));
        }
        Ok(())
    }

    /// Wraps a buffer this backend made.
    pub(crate) fn tensor(
        &self,
        buf: CudaSlice<u8>,
        dtype: DType,
        shape: impl Into<Shape>,
    ) -> Tensor {
        let shape = shape.into();
        let len = shape.numel();
        Tensor::from_storage(
            Box::new(CudaStorage {
                buf,
                dtype,
                len,
                ordinal: self.ordinal,
            }),
            shape,
        )
    }

    /// A shape error of `op` on this device.
    pub(crate) fn shape_err(&self, op: &'static str, detail: impl Into<String>) -> Error {
        Error::shape(op, self.tag.clone(), detail)
    }

    /// Checks that two tensors have exactly the same dims.
    pub(crate) fn same_shape(
        &self,
        op: &'static str,
        what: &str,
        a: &Tensor,
        b: &Tensor,
    ) -> Result<()> {
        dflash_core::ops::same_shape(op, &self.tag, what, a, b)
    }
}

/// A kernel input buffer: borrowed from a tensor, or a converted scratch copy that lives as
/// long as this value (freed in stream order after the kernels enqueued meanwhile).
pub(crate) enum InBuf<'a> {
    Borrowed(&'a CudaSlice<u8>),
    Owned(CudaSlice<u8>),
}

impl InBuf<'_> {
    pub(crate) fn get(&self) -> &CudaSlice<u8> {
        match self {
            InBuf::Borrowed(b) => b,
            InBuf::Owned(b) => b,
        }
    }
}

/// `x` rounded to bf16 bits (nearest even; NaN -> quiet NaN keeping sign and high payload, so
/// f32 NaN gives 0x7FC0), as the device's `f32_to_bf16` does.
pub(crate) fn bf16_bits(x: f32) -> u16 {
    let u = x.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return ((u >> 16) | 0x0040) as u16;
    }
    ((u + 0x7fff + ((u >> 16) & 1)) >> 16) as u16
}

/// Host `f32` data as bytes, for byte-typed device buffers.
pub(crate) fn f32_bytes(x: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding and u8 has alignment 1; same memory, 4x the length.
    unsafe { std::slice::from_raw_parts(x.as_ptr() as *const u8, std::mem::size_of_val(x)) }
}

pub(crate) fn f32_bytes_mut(x: &mut [f32]) -> &mut [u8] {
    // SAFETY: as above; every bit pattern is a valid f32.
    unsafe { std::slice::from_raw_parts_mut(x.as_mut_ptr() as *mut u8, std::mem::size_of_val(x)) }
}

pub(crate) fn i32_bytes(x: &[i32]) -> &[u8] {
    // SAFETY: as above.
    unsafe { std::slice::from_raw_parts(x.as_ptr() as *const u8, std::mem::size_of_val(x)) }
}
