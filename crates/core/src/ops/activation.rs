use crate::{Result, Tensor};

/// SwiGLU: `h = silu(gate) * up`.
pub trait ActivationOps {
    fn swiglu(&self, gate: &Tensor, up: &Tensor) -> Result<Tensor>;
    /// Returns `(d_gate, d_up)`.
    fn swiglu_backward(&self, dh: &Tensor, gate: &Tensor, up: &Tensor) -> Result<(Tensor, Tensor)>;
}
