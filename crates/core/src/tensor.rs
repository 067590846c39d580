//! A thin tensor view: a backend-owned buffer and a contiguous row-major shape. No autograd,
//! no graph, no strides: model code reshapes freely and backends copy when they must.

use std::any::Any;
use std::fmt;

/// A backend's device buffer. Backends downcast through [`Storage::as_any`] to their own type;
/// a tensor from another backend is reported as [`crate::Error::ForeignTensor`], not a panic.
pub trait Storage: Any + Send + Sync + fmt::Debug {
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
    /// Which backend made this buffer (for error messages).
    fn backend_name(&self) -> &'static str;
    /// The first `n` elements widened to `f32` in host memory, without the owning backend at
    /// hand: how a tensor crosses to another backend or device when no direct path exists
    /// ([`crate::MemoryOps::import`]). Waits for pending writes to the buffer.
    fn read_host(&self, n: usize) -> Result<Vec<f32>, crate::Error>;
}

/// The element count of `dims`, or a shape error of `op` on `device` when it does not fit in
/// `usize`. Every op that takes a shape from its caller (uploads, allocations, reshapes)
/// checks it here, so a tensor's shape always has a representable count and
/// [`Shape::numel`] never overflows.
///
/// Stricter than the plain product: the product of the *nonzero* dims must fit too, so that
/// any sub-product of a checked shape's dims (a row length, a matrix view) also fits, even
/// when a zero dim makes the whole count 0 (`[0, 2^40, 2^40]` is rejected).
pub fn checked_numel(op: &'static str, device: &str, dims: &[usize]) -> crate::Result<usize> {
    numel_or_overflow(dims).map_err(|e| crate::Error::shape(op, device, e))
}

/// [`checked_numel`] with the error as text, for callers that add op and device themselves.
pub(crate) fn numel_or_overflow(dims: &[usize]) -> Result<usize, String> {
    let nonzero = dims
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d.max(1)))
        .ok_or_else(|| format!("shape {dims:?} has more than usize::MAX elements"))?;
    Ok(if dims.contains(&0) { 0 } else { nonzero })
}

#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Shape(pub Vec<usize>);

impl Shape {
    /// The element count. Every tensor's shape was checked when the tensor was made
    /// ([`checked_numel`]), so this cannot overflow for one; for a shape from anywhere else,
    /// use [`Shape::checked_numel`]. An overflowing shape panics here rather than wrapping
    /// (a wrapped count would pass size checks and index out of bounds later).
    pub fn numel(&self) -> usize {
        numel_or_overflow(&self.0).unwrap_or_else(|e| panic!("Shape::numel: {e}"))
    }
    /// [`checked_numel`] of this shape.
    pub fn checked_numel(&self, op: &'static str, device: &str) -> crate::Result<usize> {
        checked_numel(op, device, &self.0)
    }
    pub fn dims(&self) -> &[usize] {
        &self.0
    }
    pub fn rank(&self) -> usize {
        self.0.len()
    }
    /// `(rows, cols)` of the shape seen as a matrix whose last dim is the column count.
    pub fn as_matrix(&self) -> (usize, usize) {
        match self.0.split_last() {
            None => (1, 1),
            Some((&c, rest)) => (rest.iter().product(), c),
        }
    }
}

impl fmt::Debug for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl From<&[usize]> for Shape {
    fn from(d: &[usize]) -> Self {
        Shape(d.to_vec())
    }
}
impl<const N: usize> From<[usize; N]> for Shape {
    fn from(d: [usize; N]) -> Self {
        Shape(d.to_vec())
    }
}
impl From<Vec<usize>> for Shape {
    fn from(d: Vec<usize>) -> Self {
        Shape(d)
    }
}

/// A tensor: contiguous, row-major, owned by one backend.
pub struct Tensor {
    storage: Box<dyn Storage>,
    shape: Shape,
}

impl Tensor {
    /// For backends: wraps a buffer they made. The caller guarantees `storage` holds
    /// `shape.numel()` elements (so that count fits in `usize`: check shapes from users with
    /// [`checked_numel`] before allocating).
    pub fn from_storage(storage: Box<dyn Storage>, shape: impl Into<Shape>) -> Self {
        Tensor {
            storage,
            shape: shape.into(),
        }
    }
    pub fn shape(&self) -> &Shape {
        &self.shape
    }
    pub fn dims(&self) -> &[usize] {
        self.shape.dims()
    }
    pub fn numel(&self) -> usize {
        self.shape.numel()
    }
    pub fn storage(&self) -> &dyn Storage {
        self.storage.as_ref()
    }
    pub fn storage_mut(&mut self) -> &mut dyn Storage {
        self.storage.as_mut()
    }
    /// Same buffer, new shape with the same element count. Free.
    pub fn reshape(self, shape: impl Into<Shape>) -> Result<Tensor, crate::Error> {
        let shape = shape.into();
        // Checked: the new shape comes from the caller, and a wrapped product could match.
        if shape.checked_numel("reshape", self.storage.backend_name())? != self.shape.numel() {
            return Err(crate::Error::shape(
                "reshape",
                self.storage.backend_name(),
                format!("{:?} -> {:?} changes the element count", self.shape, shape),
            ));
        }
        Ok(Tensor {
            storage: self.storage,
            shape,
        })
    }
    /// Reshape in place (same element count), for views inside model code.
    pub fn set_shape(&mut self, shape: impl Into<Shape>) -> Result<(), crate::Error> {
        let shape = shape.into();
        if shape.checked_numel("set_shape", self.storage.backend_name())? != self.shape.numel() {
            return Err(crate::Error::shape(
                "set_shape",
                self.storage.backend_name(),
                format!("{:?} -> {:?} changes the element count", self.shape, shape),
            ));
        }
        self.shape = shape;
        Ok(())
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Tensor({}, {:?})",
            self.storage.backend_name(),
            self.shape
        )
    }
}
