//! Host storage: a plain `Vec<f32>`, and the checked downcasts every op goes through.

use std::any::Any;

use dflash_core::{Error, Result, Shape, Storage, Tensor};

use crate::DEVICE;

/// The reference backend's buffer: contiguous row-major `f32` in host memory.
#[derive(Debug, Clone, PartialEq)]
pub struct HostStorage(pub Vec<f32>);

impl Storage for HostStorage {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
    fn backend_name(&self) -> &'static str {
        "reference"
    }
    fn read_host(&self, n: usize) -> Result<Vec<f32>> {
        self.0.get(..n).map(<[f32]>::to_vec).ok_or_else(|| {
            Error::shape(
                "read_host",
                DEVICE,
                format!("{n} elements asked of a buffer of {}", self.0.len()),
            )
        })
    }
}

/// Wraps host data in a reference tensor. The caller guarantees `data.len() == numel`
/// (ops check this; see [`crate::ReferenceBackend`]'s `upload` for the checked path).
pub fn host_tensor(data: Vec<f32>, shape: impl Into<Shape>) -> Tensor {
    Tensor::from_storage(Box::new(HostStorage(data)), shape)
}

/// The `f32` data of a reference tensor; [`Error::ForeignTensor`] for any other backend's.
pub fn host_slice(t: &Tensor) -> Result<&[f32]> {
    slice("host_slice", t)
}

/// Mutable access to the `f32` data of a reference tensor.
pub fn host_slice_mut(t: &mut Tensor) -> Result<&mut [f32]> {
    slice_mut("host_slice_mut", t)
}

fn foreign(op: &'static str, t_backend: &str, shape: &Shape) -> Error {
    Error::ForeignTensor {
        op,
        device: DEVICE.into(),
        detail: format!(
            "a {shape:?} tensor of backend {t_backend:?} given to backend \"reference\""
        ),
    }
}

/// [`host_slice`] with the calling op's name in the error.
pub(crate) fn slice<'a>(op: &'static str, t: &'a Tensor) -> Result<&'a [f32]> {
    let backend = t.storage().backend_name();
    match t.storage().as_any().downcast_ref::<HostStorage>() {
        Some(s) if s.0.len() == t.numel() => Ok(&s.0),
        Some(s) => Err(Error::op(
            op,
            DEVICE,
            format!(
                "tensor {:?} holds {} elements, not {}",
                t.shape(),
                s.0.len(),
                t.numel()
            ),
        )),
        None => Err(foreign(op, backend, t.shape())),
    }
}

/// [`host_slice_mut`] with the calling op's name in the error.
pub(crate) fn slice_mut<'a>(op: &'static str, t: &'a mut Tensor) -> Result<&'a mut [f32]> {
    let shape = t.shape().clone();
    let backend = t.storage().backend_name();
    match t.storage_mut().as_any_mut().downcast_mut::<HostStorage>() {
        Some(s) if s.0.len() == shape.numel() => Ok(&mut s.0),
        Some(s) => Err(Error::op(
            op,
            DEVICE,
            format!(
                "tensor {shape:?} holds {} elements, not {}",
                s.0.len(),
                shape.numel()
            ),
        )),
        None => Err(foreign(op, backend, &shape)),
    }
}

/// A shape error of `op` on this device.
pub(crate) fn shape_err(op: &'static str, detail: impl Into<String>) -> Error {
    Error::shape(op, DEVICE, detail)
}

/// Checks that two tensors have exactly the same dims.
pub(crate) fn same_shape(op: &'static str, what: &str, a: &Tensor, b: &Tensor) -> Result<()> {
    dflash_core::ops::same_shape(op, DEVICE, what, a, b)
}
