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

impl Transpose {
    /// `""` or `"^T"`, for messages.
    pub fn suffix(self) -> &'static str {
        match self {
            Transpose::No => "",
            Transpose::Yes => "^T",
        }
    }
}

/// `(M, K, N)` of `op(a) @ op(b)` for `(rows, cols)` views of `a` and `b` (leading dims folded
/// into rows), or the message every backend reports when the inner dims differ or the
/// `(M, N)` result has more than `usize::MAX` elements.
pub fn matmul_dims(
    a: &crate::Shape,
    ta: Transpose,
    b: &crate::Shape,
    tb: Transpose,
) -> std::result::Result<(usize, usize, usize), String> {
    let view = |s: &crate::Shape, t: Transpose| {
        let (r, c) = s.as_matrix();
        if t == Transpose::Yes { (c, r) } else { (r, c) }
    };
    let ((m, k), (k2, n)) = (view(a, ta), view(b, tb));
    if k != k2 {
        return Err(format!(
            "a{} {a:?} is ({m}, {k}) but b{} {b:?} is ({k2}, {n}): inner dims differ",
            ta.suffix(),
            tb.suffix()
        ));
    }
    // The operands bound only M*K and K*N: with K = 0 both are empty whatever M and N, so
    // the (M, N) result can be unrepresentable, and a wrapped count would size its buffer.
    crate::tensor::numel_or_overflow(&[m, n]).map_err(|e| {
        format!(
            "a{} {a:?} @ b{} {b:?} is ({m}, {n}): {e}",
            ta.suffix(),
            tb.suffix()
        )
    })?;
    Ok((m, k, n))
}

/// [`matmul_dims`] plus the check that `c` is `(M, N)`, for `c += op(a) @ op(b)`.
pub fn matmul_acc_dims(
    c: &crate::Shape,
    a: &crate::Shape,
    ta: Transpose,
    b: &crate::Shape,
    tb: Transpose,
) -> std::result::Result<(usize, usize, usize), String> {
    let (m, k, n) = matmul_dims(a, ta, b, tb)?;
    if c.as_matrix() != (m, n) {
        return Err(format!(
            "c {c:?} but a{} {a:?} @ b{} {b:?} is ({m}, {n})",
            ta.suffix(),
            tb.suffix()
        ));
    }
    Ok((m, k, n))
}
