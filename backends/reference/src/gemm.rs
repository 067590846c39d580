//! Matrix products through `matrixmultiply::sgemm` (f32 accumulation). Operands are
//! `(rows, cols)` views of contiguous tensors (leading dims folded into rows); a transpose
//! is just a swap of the row and column strides.

use dflash_core::{GemmOps, Result, Tensor, Transpose};

use crate::ReferenceBackend;
use crate::storage::{host_tensor, shape_err, slice, slice_mut};

/// A strided `(rows, cols)` view of a row-major matrix, possibly transposed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MatView {
    pub rows: usize,
    pub cols: usize,
    /// Element stride between consecutive rows / columns of the (possibly transposed) view.
    pub rs: isize,
    pub cs: isize,
}

impl MatView {
    /// The view `op(t)` of a stored `(R, C)` matrix.
    pub fn of(stored_rows: usize, stored_cols: usize, t: Transpose) -> Self {
        match t {
            Transpose::No => MatView {
                rows: stored_rows,
                cols: stored_cols,
                rs: stored_cols as isize,
                cs: 1,
            },
            Transpose::Yes => MatView {
                rows: stored_cols,
                cols: stored_rows,
                rs: 1,
                cs: stored_cols as isize,
            },
        }
    }
}

/// `c (M, N) = alpha * a (M, K) @ b (K, N) + beta * c`, with `c` row-major contiguous.
/// When `beta == 0`, `c` is not read (it may hold NaN).
pub(crate) fn sgemm(
    a: &[f32],
    av: MatView,
    b: &[f32],
    bv: MatView,
    c: &mut [f32],
    alpha: f32,
    beta: f32,
) {
    let (m, k, n) = (av.rows, av.cols, bv.cols);
    debug_assert_eq!(k, bv.rows);
    debug_assert!(a.len() >= m * k && b.len() >= k * n && c.len() >= m * n);
    // SAFETY: the views address only elements inside `a`, `b` and `c` (lengths checked by
    // the callers, asserted above), and `c` is borrowed mutably so it aliases nothing.
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            n,
            alpha,
            a.as_ptr(),
            av.rs,
            av.cs,
            b.as_ptr(),
            bv.rs,
            bv.cs,
            beta,
            c.as_mut_ptr(),
            n as isize,
            1,
        )
    }
}

/// Checks `op(a) @ op(b)` and returns both views.
fn views(
    op: &'static str,
    a: &Tensor,
    ta: Transpose,
    b: &Tensor,
    tb: Transpose,
) -> Result<(MatView, MatView)> {
    dflash_core::ops::gemm::matmul_dims(a.shape(), ta, b.shape(), tb)
        .map_err(|detail| shape_err(op, detail))?;
    let (ar, ac) = a.shape().as_matrix();
    let (br, bc) = b.shape().as_matrix();
    Ok((MatView::of(ar, ac, ta), MatView::of(br, bc, tb)))
}

impl GemmOps for ReferenceBackend {
    /// Returns a 2-D `(M, N)` tensor.
    fn matmul(&self, a: &Tensor, ta: Transpose, b: &Tensor, tb: Transpose) -> Result<Tensor> {
        let (av, bv) = views("matmul", a, ta, b, tb)?;
        let (x, y) = (slice("matmul", a)?, slice("matmul", b)?);
        let mut c = vec![0.0f32; av.rows * bv.cols]; // (M, N)
        self.run(|| sgemm(x, av, y, bv, &mut c, 1.0, 0.0));
        Ok(host_tensor(c, [av.rows, bv.cols]))
    }

    fn matmul_acc(
        &self,
        c: &mut Tensor,
        a: &Tensor,
        ta: Transpose,
        b: &Tensor,
        tb: Transpose,
        beta: f32,
    ) -> Result<()> {
        let (av, bv) = views("matmul_acc", a, ta, b, tb)?;
        dflash_core::ops::gemm::matmul_acc_dims(c.shape(), a.shape(), ta, b.shape(), tb)
            .map_err(|detail| shape_err("matmul_acc", detail))?;
        let (x, y) = (slice("matmul_acc", a)?, slice("matmul_acc", b)?);
        let c = slice_mut("matmul_acc", c)?;
        self.run(|| sgemm(x, av, y, bv, c, 1.0, beta));
        Ok(())
    }
}
