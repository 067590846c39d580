use crate::{Error, Result, Tensor};

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

/// The checked dims of an RMSNorm call: `x` seen as `(rows, cols)` (leading dims folded into
/// rows). Every backend validates its operands here, so all report the same errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NormDims {
    pub rows: usize,
    pub cols: usize,
}

impl NormDims {
    /// Checks `x (R, C)` against `w (C)`; errors name `op` and `device`.
    pub fn of(op: &'static str, device: &str, x: &Tensor, w: &Tensor) -> Result<Self> {
        let (rows, cols) = x.shape().as_matrix();
        if w.numel() != cols {
            return Err(Error::shape(
                op,
                device,
                format!(
                    "x {:?} has {cols} columns but w {:?} has {} elements",
                    x.shape(),
                    w.shape(),
                    w.numel()
                ),
            ));
        }
        Ok(NormDims { rows, cols })
    }

    /// As [`Self::of`] for the backward: also `dy` shaped like `x` and `rstd` holding one
    /// value per row.
    pub fn of_backward(
        op: &'static str,
        device: &str,
        dy: &Tensor,
        x: &Tensor,
        w: &Tensor,
        rstd: &Tensor,
    ) -> Result<Self> {
        let dims = Self::of(op, device, x, w)?;
        super::same_shape(op, device, "dy and x", dy, x)?;
        if rstd.numel() != dims.rows {
            return Err(Error::shape(
                op,
                device,
                format!(
                    "rstd {:?} but x {:?} has {} rows",
                    rstd.shape(),
                    x.shape(),
                    dims.rows
                ),
            ));
        }
        Ok(dims)
    }
}
