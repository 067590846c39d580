use crate::{Result, Tensor};

/// Buffers, host transfers and elementwise glue. The host side of every transfer is `f32`;
/// the device format (f32, bf16, ...) is the backend's business.
pub trait MemoryOps {
    fn upload(&self, data: &[f32], shape: &[usize]) -> Result<Tensor>;
    fn download(&self, t: &Tensor) -> Result<Vec<f32>>;
    fn zeros(&self, shape: &[usize]) -> Result<Tensor>;
    fn copy(&self, t: &Tensor) -> Result<Tensor>;
    /// Rows `[start, start+len)` of a `(R, C)` view of `t` (first dim as rows).
    fn narrow_rows(&self, t: &Tensor, start: usize, len: usize) -> Result<Tensor>;
    /// Stacks tensors that agree on all but the first dim, along the first dim.
    fn concat_rows(&self, parts: &[&Tensor]) -> Result<Tensor>;
    /// `(R, C_i)` parts side by side into `(R, sum C_i)`.
    fn concat_cols(&self, parts: &[&Tensor]) -> Result<Tensor>;
    /// `a + b`, same shapes.
    fn add(&self, a: &Tensor, b: &Tensor) -> Result<Tensor>;
    /// `acc += x`, same element count.
    fn add_assign(&self, acc: &mut Tensor, x: &Tensor) -> Result<()>;
    /// `t *= s`.
    fn scale_assign(&self, t: &mut Tensor, s: f32) -> Result<()>;
    /// `sum(t^2)` in f64, for gradient norms.
    fn sum_squares(&self, t: &Tensor) -> Result<f64>;
    /// Whether every element is finite.
    fn all_finite(&self, t: &Tensor) -> Result<bool>;
}
