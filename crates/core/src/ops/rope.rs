use crate::{Error, Result, Tensor};

/// Rotary position embedding, "rotate half" layout (HF Llama/Qwen3): for `i < D/2`,
/// `y_i = x_i cos - x_{i+D/2} sin`, `y_{i+D/2} = x_{i+D/2} cos + x_i sin`, angle `p * theta^(-2i/D)`.
pub trait RopeOps {
    /// `x (T, heads, D)`, one position per token -> `(T, heads, D)`.
    fn rope(&self, x: &Tensor, positions: &[i32], theta: f32) -> Result<Tensor>;
    /// The transpose of [`RopeOps::rope`] (rotation by `-angle`).
    fn rope_backward(&self, dy: &Tensor, positions: &[i32], theta: f32) -> Result<Tensor>;
}

/// The checked dims of a RoPE call on `x (T, heads, D)` (every dim between the first and the
/// last counts as heads). Every backend validates its operands here, so all report the same
/// errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RopeDims {
    /// `T`, one position each.
    pub tokens: usize,
    /// The product of the dims between `T` and `D`.
    pub heads: usize,
    /// `D`, even.
    pub head_dim: usize,
}

impl RopeDims {
    /// Checks `x (T, heads, D)` against one position per token, `D` even, and a finite
    /// `theta > 0`; errors name `op` and `device`.
    pub fn of(
        op: &'static str,
        device: &str,
        x: &Tensor,
        positions: &[i32],
        theta: f32,
    ) -> Result<Self> {
        let dims = x.dims();
        let t = positions.len();
        let d = dims.last().copied().unwrap_or(0);
        if dims.len() < 2 || dims[0] != t || d % 2 != 0 {
            return Err(Error::shape(
                op,
                device,
                format!(
                    "x {:?} must be (T, heads, D) with T = {t} positions and D even",
                    x.shape()
                ),
            ));
        }
        if !(theta.is_finite() && theta > 0.0) {
            return Err(Error::shape(
                op,
                device,
                format!("theta must be finite and > 0, got {theta}"),
            ));
        }
        Ok(RopeDims {
            tokens: t,
            heads: dims[1..dims.len() - 1].iter().product(),
            head_dim: d,
        })
    }
}
