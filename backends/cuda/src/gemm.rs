//! Matrix products through cuBLASLt on `(rows, cols)` views of row-major tensors.
//!
//! Row-major `C (M, N) = op(A) (M, K) @ op(B) (K, N)` is column-major `C^T (N, M) =
//! op(B)^T @ op(A)^T`, and a row-major `(r, c)` buffer read column-major is its transpose
//! `(c, r)` with leading dimension `c`. So cuBLASLt is called with its `A` := our `B`
//! (transposed iff `tb`), its `B` := our `A` (transposed iff `ta`), `m = N`, `n = M`, and every
//! leading dimension equal to the stored column count. No copies, any transpose combination.
//!
//! Precision: f32 operands, f32 output, f32 scale; compute TF32 (default, tensor cores) or
//! exact f32 ([`GemmPrecision`]).

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::cublaslt::{result as lt, sys as lts};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use dflash_core::{GemmOps, Result, Tensor, Transpose};

use crate::storage::DType;
use crate::{CudaBackend, CudaError};

/// Compute mode of the f32 GEMMs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemmPrecision {
    /// `CUBLAS_COMPUTE_32F_FAST_TF32`: operands rounded to TF32 (10-bit mantissa), f32
    /// accumulation. ~1e-3 relative error per product; ~8x the f32 rate.
    Tf32,
    /// `CUBLAS_COMPUTE_32F`: exact f32 (SIMT). Matches the reference to ~1e-6.
    Fp32,
}

/// cuBLASLt workspace (NVIDIA recommends 32 MiB on Hopper).
const WORKSPACE_BYTES: usize = 32 << 20;

/// A cuBLASLt handle and its workspace, owned by one backend (one stream).
pub(crate) struct Blas {
    handle: lts::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
}

// SAFETY: a cuBLASLt handle may be used from any thread; calls on it are serialised by the
// backend's single stream (the workspace is only used by work enqueued on that stream).
unsafe impl Send for Blas {}
unsafe impl Sync for Blas {}

impl Drop for Blas {
    fn drop(&mut self) {
        // SAFETY: the handle was created by `Blas::new` and is destroyed once.
        unsafe {
            let _ = lt::destroy_handle(self.handle);
        }
    }
}

impl Blas {
    pub(crate) fn new(stream: &Arc<CudaStream>) -> Result<Blas, CudaError> {
        stream
            .context()
            .bind_to_thread()
            .map_err(|e| CudaError::Driver {
                what: "binding the context".into(),
                source: e,
            })?;
        let handle = lt::create_handle().map_err(|e| CudaError::Blas {
            what: "creating the cuBLASLt handle".into(),
            detail: e.to_string(),
        })?;
        let workspace =
            unsafe { stream.alloc::<u8>(WORKSPACE_BYTES) }.map_err(|e| CudaError::Driver {
                what: "allocating the cuBLASLt workspace".into(),
                source: e,
            })?;
        Ok(Blas { handle, workspace })
    }
}

/// One row-major GEMM on raw device addresses: `C = alpha * op(A) @ op(B) + beta * C`.
pub(crate) struct RowMajorGemm {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// Address of A and its stored column count (its row stride in elements).
    pub a: u64,
    pub a_cols: usize,
    pub ta: bool,
    pub b: u64,
    pub b_cols: usize,
    pub tb: bool,
    /// Address of C; its row stride is `n`.
    pub c: u64,
    pub alpha: f32,
    pub beta: f32,
}

fn align_of_ptr(p: u64) -> u32 {
    if p == 0 {
        256
    } else {
        (1u64 << p.trailing_zeros().min(8)) as u32
    }
}

/// RAII wrappers so every cuBLASLt descriptor is destroyed on every path.
struct Layout(lts::cublasLtMatrixLayout_t);
impl Drop for Layout {
    fn drop(&mut self) {
        unsafe {
            let _ = lt::destroy_matrix_layout(self.0);
        }
    }
}
struct Desc(lts::cublasLtMatmulDesc_t);
impl Drop for Desc {
    fn drop(&mut self) {
        unsafe {
            let _ = lt::destroy_matmul_desc(self.0);
        }
    }
}
struct Pref(lts::cublasLtMatmulPreference_t);
impl Drop for Pref {
    fn drop(&mut self) {
        unsafe {
            let _ = lt::destroy_matmul_pref(self.0);
        }
    }
}

impl CudaBackend {
    /// Enqueues one GEMM on this backend's stream. The caller holds the device-pointer guards
    /// of A, B and C across this call. `m`, `n`, `k` must be > 0.
    pub(crate) fn gemm_raw(&self, op: &'static str, g: &RowMajorGemm) -> Result<()> {
        let blas_err = |what: &str, e: lt::CublasError| {
            dflash_core::Error::op(
                op,
                self.tag.clone(),
                format!(
                    "cuBLASLt {what} failed for (M, N, K) = ({}, {}, {}), ta={}, tb={}: {e}",
                    g.m, g.n, g.k, g.ta, g.tb
                ),
            )
        };
        self.stream
            .context()
            .bind_to_thread()
            .map_err(|e| self.drv(op, e))?;
        let f32t = lts::cudaDataType_t::CUDA_R_32F;
        // Column-major problem: m' = N, n' = M, A' = B (trans tb), B' = A (trans ta).
        let (m, n, k) = (g.n as u64, g.m as u64, g.k as u64);
        let (transa, transb) = (g.tb, g.ta);
        let (ar, ac) = if transa { (k, m) } else { (m, k) };
        let (br, bc) = if transb { (n, k) } else { (k, n) };
        let compute = match self.opts.gemm {
            GemmPrecision::Tf32 => lts::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
            GemmPrecision::Fp32 => lts::cublasComputeType_t::CUBLAS_COMPUTE_32F,
        };
        // SAFETY: descriptors are created, used and destroyed here; attribute values are the
        // types cuBLASLt documents (i32 for TRANSA/B, usize for the workspace, u32 alignments).
        unsafe {
            let a_l = Layout(
                lt::create_matrix_layout(f32t, ar, ac, g.b_cols as i64)
                    .map_err(|e| blas_err("layout A", e))?,
            );
            let b_l = Layout(
                lt::create_matrix_layout(f32t, br, bc, g.a_cols as i64)
                    .map_err(|e| blas_err("layout B", e))?,
            );
            let c_l = Layout(
                lt::create_matrix_layout(f32t, m, n, g.n as i64)
                    .map_err(|e| blas_err("layout C", e))?,
            );
            let desc =
                Desc(lt::create_matmul_desc(compute, f32t).map_err(|e| blas_err("desc", e))?);
            for (attr, t) in [
                (
                    lts::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                    transa,
                ),
                (
                    lts::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB,
                    transb,
                ),
            ] {
                let v: i32 = t as i32;
                lt::set_matmul_desc_attribute(
                    desc.0,
                    attr,
                    &v as *const i32 as *const c_void,
                    std::mem::size_of::<i32>(),
                )
                .map_err(|e| blas_err("transpose attribute", e))?;
            }
            let pref = Pref(lt::create_matmul_pref().map_err(|e| blas_err("preference", e))?);
            let ws = WORKSPACE_BYTES;
            lt::set_matmul_pref_attribute(
                pref.0,
                lts::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &ws as *const usize as *const c_void,
                std::mem::size_of::<usize>(),
            )
            .map_err(|e| blas_err("workspace preference", e))?;
            for (attr, p) in [
                (lts::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, g.b),
                (lts::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, g.a),
                (lts::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, g.c),
                (lts::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, g.c),
            ] {
                let al: u32 = align_of_ptr(p);
                lt::set_matmul_pref_attribute(
                    pref.0,
                    attr,
                    &al as *const u32 as *const c_void,
                    std::mem::size_of::<u32>(),
                )
                .map_err(|e| blas_err("alignment preference", e))?;
            }
            let heur = lt::get_matmul_algo_heuristic(
                self.blas.handle,
                desc.0,
                a_l.0,
                b_l.0,
                c_l.0,
                c_l.0,
                pref.0,
            )
            .map_err(|e| blas_err("heuristic", e))?;
            let (w, _w_guard) = self.blas.workspace.device_ptr(&self.stream);
            lt::matmul(
                self.blas.handle,
                desc.0,
                &g.alpha as *const f32 as *const c_void,
                &g.beta as *const f32 as *const c_void,
                g.b as *const c_void,
                a_l.0,
                g.a as *const c_void,
                b_l.0,
                g.c as *const c_void,
                c_l.0,
                g.c as *mut c_void,
                c_l.0,
                &heur.algo,
                w as *mut c_void,
                ws,
                self.stream.cu_stream() as *mut _,
            )
            .map_err(|e| blas_err("matmul", e))?;
        }
        Ok(())
    }
}

/// A strided `(rows, cols)` view of a stored `(R, C)` matrix, possibly transposed.
#[derive(Debug, Clone, Copy)]
struct MatView {
    rows: usize,
    cols: usize,
    stored_cols: usize,
    t: bool,
}

impl MatView {
    fn of(r: usize, c: usize, t: Transpose) -> Self {
        match t {
            Transpose::No => MatView {
                rows: r,
                cols: c,
                stored_cols: c,
                t: false,
            },
            Transpose::Yes => MatView {
                rows: c,
                cols: r,
                stored_cols: c,
                t: true,
            },
        }
    }
}

fn t_name(t: Transpose) -> &'static str {
    match t {
        Transpose::No => "",
        Transpose::Yes => "^T",
    }
}

impl CudaBackend {
    fn views(
        &self,
        op: &'static str,
        a: &Tensor,
        ta: Transpose,
        b: &Tensor,
        tb: Transpose,
    ) -> Result<(MatView, MatView)> {
        let (ar, ac) = a.shape().as_matrix();
        let (br, bc) = b.shape().as_matrix();
        let (av, bv) = (MatView::of(ar, ac, ta), MatView::of(br, bc, tb));
        if av.cols != bv.rows {
            return Err(self.shape_err(
                op,
                format!(
                    "a{} {:?} is ({}, {}) but b{} {:?} is ({}, {}): inner dims differ",
                    t_name(ta),
                    a.shape(),
                    av.rows,
                    av.cols,
                    t_name(tb),
                    b.shape(),
                    bv.rows,
                    bv.cols
                ),
            ));
        }
        Ok((av, bv))
    }

    /// `c = alpha * op(a) @ op(b) + beta * c` for whole tensors, handling empty dims.
    #[allow(clippy::too_many_arguments)]
    fn gemm_tensors(
        &self,
        op: &'static str,
        c: &mut crate::storage::CudaStorage,
        a: &crate::storage::CudaStorage,
        av: MatView,
        b: &crate::storage::CudaStorage,
        bv: MatView,
        beta: f32,
    ) -> Result<()> {
        let (m, k, n) = (av.rows, av.cols, bv.cols);
        if m == 0 || n == 0 {
            return Ok(());
        }
        if k == 0 {
            // The product is empty: c = beta * c (and beta = 0 must not read c).
            if beta == 0.0 {
                return self.fill(op, &mut c.buf, m * n, 0.0);
            }
            let n64 = (m * n) as i64;
            let mut l = self.stream.launch_builder(&self.k().scale_f32);
            use cudarc::driver::PushKernelArg;
            l.arg(&mut c.buf).arg(&n64).arg(&beta);
            return self.launch(op, l, crate::grid1d(m * n));
        }
        let (pa, _ga) = a.ptr(&self.stream);
        let (pb, _gb) = b.ptr(&self.stream);
        let (pc, _gc) = c.ptr_mut(&self.stream);
        self.gemm_raw(
            op,
            &RowMajorGemm {
                m,
                n,
                k,
                a: pa,
                a_cols: av.stored_cols,
                ta: av.t,
                b: pb,
                b_cols: bv.stored_cols,
                tb: bv.t,
                c: pc,
                alpha: 1.0,
                beta,
            },
        )
    }
}

impl GemmOps for CudaBackend {
    fn matmul(&self, a: &Tensor, ta: Transpose, b: &Tensor, tb: Transpose) -> Result<Tensor> {
        let op = "matmul";
        let (av, bv) = self.views(op, a, ta, b, tb)?;
        let (x, y) = (self.f32s(op, a)?, self.f32s(op, b)?);
        let (m, n) = (av.rows, bv.cols);
        let buf = self.alloc_f32(op, m * n)?;
        let mut c = crate::storage::CudaStorage {
            buf,
            dtype: DType::F32,
            len: m * n,
            ordinal: self.ordinal,
        };
        self.gemm_tensors(op, &mut c, x, av, y, bv, 0.0)?;
        Ok(self.tensor(c.buf, DType::F32, [m, n]))
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
        let op = "matmul_acc";
        let (av, bv) = self.views(op, a, ta, b, tb)?;
        if c.shape().as_matrix() != (av.rows, bv.cols) {
            return Err(self.shape_err(
                op,
                format!(
                    "c {:?} but a{} {:?} @ b{} {:?} is ({}, {})",
                    c.shape(),
                    t_name(ta),
                    a.shape(),
                    t_name(tb),
                    b.shape(),
                    av.rows,
                    bv.cols
                ),
            ));
        }
        let (x, y) = (self.f32s(op, a)?, self.f32s(op, b)?);
        let cs = self.f32s_mut(op, c)?;
        self.gemm_tensors(op, cs, x, av, y, bv, beta)
    }
}
