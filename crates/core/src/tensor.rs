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

#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Shape(pub Vec<usize>);

impl Shape {
    pub fn numel(&self) -> usize {
        self.0.iter().product()
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
    /// `shape.numel()` elements.
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
        if shape.numel() != self.shape.numel() {
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
        if shape.numel() != self.shape.numel() {
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
