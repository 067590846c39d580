use crate::{Result, Tensor};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transpose {
    No,
    Yes,
}

/// Matrix products on `(rows, cols)` views (leading dims folded into rows).
pub trait GemmOps {
    /// `op(a) @ op(b)` where `op` transposes when asked. Shapes: `op(a)` `(M, K)`, `op(b)` `(K, N)`.
    fn matmul(&self, a: &Tensor, ta: Transpose, b: &Tensor, tb: Transpose) -> Result<Tensor>;
    /// `c = beta * c + op(a) @ op(b)` in place (gradient accumulation uses `beta = 1`).
    fn matmul_acc(
        &self,
        c: &mut Tensor,
        a: &Tensor,
        ta: Transpose,
        b: &Tensor,
        tb: Transpose,
        beta: f32,
    ) -> Result<()>;

    /// `x @ w^T`: the PyTorch `Linear` convention, `x (T, in)`, `w (out, in)` -> `(T, out)`.
    fn linear(&self, x: &Tensor, w: &Tensor) -> Result<Tensor> {
        self.matmul(x, Transpose::No, w, Transpose::Yes)
    }
}
