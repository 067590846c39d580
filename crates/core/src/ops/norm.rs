use crate::{Result, Tensor};

/// RMSNorm over the last dim: `y = x * rstd * w`, `rstd = 1/sqrt(mean(x^2) + eps)`.
/// Per-head QK-norm is the same op on a `(T*heads, D)` view.
pub trait NormOps {
    /// `x (R, C)`, `w (C)` -> `(y (R, C), rstd (R))`.
    fn rms_norm(&self, x: &Tensor, w: &Tensor, eps: f32) -> Result<(Tensor, Tensor)>;
    /// Returns `(dx (R, C), dw (C))`.
    fn rms_norm_backward(
        &self,
        dy: &Tensor,
        x: &Tensor,
        w: &Tensor,
        rstd: &Tensor,
    ) -> Result<(Tensor, Tensor)>;
}
