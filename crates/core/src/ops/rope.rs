use crate::{Result, Tensor};

/// Rotary position embedding, "rotate half" layout (HF Llama/Qwen3): for `i < D/2`,
/// `y_i = x_i cos - x_{i+D/2} sin`, `y_{i+D/2} = x_{i+D/2} cos + x_i sin`, angle `p * theta^(-2i/D)`.
pub trait RopeOps {
    /// `x (T, heads, D)`, one position per token -> `(T, heads, D)`.
    fn rope(&self, x: &Tensor, positions: &[i32], theta: f32) -> Result<Tensor>;
    /// The transpose of [`RopeOps::rope`] (rotation by `-angle`).
    fn rope_backward(&self, dy: &Tensor, positions: &[i32], theta: f32) -> Result<Tensor>;
}
