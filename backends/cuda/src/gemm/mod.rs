//! Matrix products through cuBLASLt on `(rows, cols)` views of row-major tensors.
//!
//! Row-major `C (M, N) = op(A) (M, K) @ op(B) (K, N)` is column-major `C^T (N, M) =
//! op(B)^T @ op(A)^T`, and a row-major `(r, c)` buffer read column-major is its transpose
//! `(c, r)` with leading dimension `c`. So cuBLASLt is called with its `A` := our `B`
//! (transposed iff `tb`), its `B` := our `A` (transposed iff `ta`), `m = N`, `n = M`, and every
//! leading dimension equal to the stored column count. No copies, any transpose combination.
//!
//! Precision ([`GemmPrecision`]): operands f32 or bf16 (each independently: a tensor kept in
//! bf16 by `to_compute_format`, e.g. a frozen weight, or a bf16 activation), output f32 or
//! bf16 (`matmul`: `CudaOptions::activations`; `matmul_acc`: c's dtype), f32 scale (alpha,
//! beta) and f32 accumulation in every mode. In `Bf16` mode cuBLASLt writes a bf16 D itself
//! (one rounding of the f32 result); TF32/FP32 have no bf16-D matmul, so a bf16 C goes through
//! f32 scratch (see `gemm_f32`). `Bf16` (default, the PyTorch bf16-autocast recipe's
//! precision) reads bf16 operands in place and rounds f32 ones to bf16 (RNE, `f32_to_bf16`)
//! into stream-ordered scratch buffers freed right after the product, then runs cuBLASLt with
//! bf16 A/B and f32 or bf16 C/D; `Tf32` and `Fp32` run on f32 operands (a bf16 one widened exactly
//! into scratch first) with TF32 tensor-core or exact f32 compute.
//!
//! Plans (layouts, matmul descriptor and the heuristic's algorithm) are cached per
//! [`plan::PlanKey`] (shape, transposes, leading dims, precision, pointer alignments), so
//! repeated shapes skip the heuristic query.
//!
//! Files: `plan.rs` (cuBLASLt handle, descriptors, heuristic, plan cache, launch), `bf16.rs`
//! (operand rounding and the bf16 path); here the row-major problem and [`GemmOps`].

mod bf16;
mod plan;

pub(crate) use plan::Blas;

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut, PushKernelArg};
use dflash_core::{GemmOps, Result, Tensor, Transpose};

use crate::CudaBackend;
use crate::storage::DType;
use plan::align_of_ptr;

/// Operand/compute precision of the GEMMs (all modes: f32 tensors in and out, f32
/// accumulation, f32 alpha/beta).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GemmPrecision {
    /// Operands rounded to bf16 (8-bit mantissa, RNE) into scratch buffers, bf16 tensor
    /// cores with `CUBLAS_COMPUTE_32F` (f32 accumulation), f32 output; beta applies to the f32
    /// C. ~2^-8 relative error per product (both operands rounded); ~2x the TF32 rate. The
    /// default: bf16 autocast with f32 master weights is the recipe we are compared against.
    Bf16,
    /// `CUBLAS_COMPUTE_32F_FAST_TF32`: operands rounded to TF32 (10-bit mantissa), f32
    /// accumulation. ~1e-3 relative error per product; ~8x the f32 rate.
    Tf32,
    /// `CUBLAS_COMPUTE_32F`: exact f32 (SIMT). Matches the reference to ~1e-6.
    Fp32,
}

impl GemmPrecision {
    /// The `DFLASH_CUDA_GEMM` spelling.
    pub fn name(self) -> &'static str {
        match self {
            GemmPrecision::Bf16 => "bf16",
            GemmPrecision::Tf32 => "tf32",
            GemmPrecision::Fp32 => "fp32",
        }
    }
}
/// A GEMM operand: the raw device address of its first element and the element type stored
/// there (f32, or bf16 for tensors kept in bf16, see `MemoryOps::to_compute_format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Operand {
    pub ptr: u64,
    pub dtype: DType,
}

impl Operand {
    pub fn new(ptr: u64, dtype: DType) -> Self {
        Operand { ptr, dtype }
    }
}

/// One row-major GEMM on raw device addresses: `C = alpha * op(A) @ op(B) + beta * C`, A, B
/// and C f32 or bf16 (each independently; f32 accumulation and scale always, C rounded once).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RowMajorGemm {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    /// A and its stored column count (its row stride in elements).
    pub a: Operand,
    pub a_cols: usize,
    pub ta: bool,
    pub b: Operand,
    pub b_cols: usize,
    pub tb: bool,
    /// Address of C; its row stride is `n`.
    pub c: u64,
    /// Element type of C (= D): f32, or bf16 for bf16 activations.
    pub c_dtype: DType,
    pub alpha: f32,
    pub beta: f32,
}

impl RowMajorGemm {
    /// Elements cuBLASLt reads of A and of B (from the first to the last used one): what a
    /// converted copy of each must cover.
    fn spans(&self) -> (usize, usize) {
        // Stored shapes: A is (k, m) if ta else (m, k); B is (n, k) if tb else (k, n).
        let na = if self.ta {
            bf16::operand_span(self.k, self.m, self.a_cols)
        } else {
            bf16::operand_span(self.m, self.k, self.a_cols)
        };
        let nb = if self.tb {
            bf16::operand_span(self.n, self.k, self.b_cols)
        } else {
            bf16::operand_span(self.k, self.n, self.b_cols)
        };
        (na, nb)
    }
}

impl CudaBackend {
    /// Enqueues one GEMM on this backend's stream in the backend's [`GemmPrecision`]. The
    /// caller holds the device-pointer guards of A, B and C across this call. `m`, `n`, `k`
    /// must be > 0. Operands not in the mode's type are converted into stream-ordered scratch
    /// (f32 -> bf16 in `Bf16` mode, bf16 -> f32 (exact) in `Tf32` / `Fp32`); an operand
    /// already in it is read in place.
    pub(crate) fn gemm_raw(&self, op: &'static str, g: &RowMajorGemm) -> Result<()> {
        self.stream
            .context()
            .bind_to_thread()
            .map_err(|e| self.drv(op, e))?;
        match self.opts.gemm {
            GemmPrecision::Bf16 => self.gemm_bf16(op, g),
            prec => self.gemm_f32(op, g, prec),
        }
    }

    /// TF32 or exact-f32 compute on f32 operands; a bf16 operand is first widened (exactly)
    /// into f32 scratch covering the span cuBLASLt reads. cuBLASLt has no f32-operand matmul
    /// with a bf16 C/D, so a bf16 C goes through an f32 scratch C: widened into it when beta
    /// != 0, the product written there, then rounded (RNE) back into C.
    fn gemm_f32(&self, op: &'static str, g: &RowMajorGemm, prec: GemmPrecision) -> Result<()> {
        if g.c_dtype == DType::Bf16 {
            let mn = g.m * g.n;
            let mut sc = self.alloc(op, mn, DType::F32)?;
            let (ps, _gs) = sc.device_ptr_mut(&self.stream);
            if g.beta != 0.0 {
                self.convert_ptr(op, ps, g.c, mn, DType::F32)?;
            }
            let g32 = RowMajorGemm {
                c: ps,
                c_dtype: DType::F32,
                ..*g
            };
            self.gemm_f32(op, &g32, prec)?;
            return self.convert_ptr(op, g.c, ps, mn, DType::Bf16);
        }
        let (na, nb) = g.spans();
        // Scratch (declared before the pointer guards, so it is freed, in stream order, after
        // the matmul is enqueued).
        let sa = self.operand_in(op, g.a, na, DType::F32)?;
        let sb = self.operand_in(op, g.b, nb, DType::F32)?;
        let (pa, _ga) = scratch_or(&sa, g.a.ptr, &self.stream);
        let (pb, _gb) = scratch_or(&sb, g.b.ptr, &self.stream);
        let key = self.plan_key(g, align_of_ptr(pb), align_of_ptr(pa), prec);
        match self.plan(op, g, &key)? {
            Some(plan) => self.run_plan(op, g, &plan, pa, pb, prec),
            None => unreachable!("only bf16 plans may be missing"),
        }
    }

    /// `x` as `want`: `None` if it already is (read in place), else a converted scratch copy of
    /// its first `n` elements.
    fn operand_in(
        &self,
        op: &'static str,
        x: Operand,
        n: usize,
        want: DType,
    ) -> Result<Option<CudaSlice<u8>>> {
        if x.dtype == want {
            return Ok(None);
        }
        let mut s = self.alloc(op, n, want)?;
        self.convert_raw(op, &mut s, x.ptr, n, want)?;
        Ok(Some(s))
    }
}

/// The address of `scratch` (with its guard) if there is one, else `ptr`.
fn scratch_or<'a>(
    scratch: &'a Option<CudaSlice<u8>>,
    ptr: u64,
    stream: &'a std::sync::Arc<cudarc::driver::CudaStream>,
) -> (u64, Option<cudarc::driver::SyncOnDrop<'a>>) {
    match scratch {
        Some(s) => {
            let (p, g) = s.device_ptr(stream);
            (p, Some(g))
        }
        None => (ptr, None),
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

impl CudaBackend {
    fn views(
        &self,
        op: &'static str,
        a: &Tensor,
        ta: Transpose,
        b: &Tensor,
        tb: Transpose,
    ) -> Result<(MatView, MatView)> {
        dflash_core::ops::gemm::matmul_dims(a.shape(), ta, b.shape(), tb)
            .map_err(|detail| self.shape_err(op, detail))?;
        let (ar, ac) = a.shape().as_matrix();
        let (br, bc) = b.shape().as_matrix();
        Ok((MatView::of(ar, ac, ta), MatView::of(br, bc, tb)))
    }

    /// `c = alpha * op(a) @ op(b) + beta * c` for whole tensors (a, b, c f32 or bf16), handling
    /// empty dims.
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
                return self.fill_dt(op, &mut c.buf, m * n, c.dtype, 0.0);
            }
            let n64 = (m * n) as i64;
            let k = self.k();
            let f = crate::kernels::pick(&[&k.scale_f, &k.scale_b], &[c.dtype]);
            let mut l = self.stream.launch_builder(f);
            l.arg(&mut c.buf).arg(&n64).arg(&beta);
            return self.launch(op, l, crate::grid1d(m * n));
        }
        let (pa, _ga) = a.ptr(&self.stream);
        let (pb, _gb) = b.ptr(&self.stream);
        let c_dtype = c.dtype;
        let (pc, _gc) = c.ptr_mut(&self.stream);
        self.gemm_raw(
            op,
            &RowMajorGemm {
                m,
                n,
                k,
                a: Operand::new(pa, a.dtype),
                a_cols: av.stored_cols,
                ta: av.t,
                b: Operand::new(pb, b.dtype),
                b_cols: bv.stored_cols,
                tb: bv.t,
                c: pc,
                c_dtype,
                alpha: 1.0,
                beta,
            },
        )
    }
}

impl GemmOps for CudaBackend {
    /// The product is an activation: written in `CudaOptions::activations` (a bf16 D straight
    /// from cuBLASLt in bf16 GEMM mode: f32 accumulation, one rounding).
    fn matmul(&self, a: &Tensor, ta: Transpose, b: &Tensor, tb: Transpose) -> Result<Tensor> {
        let op = "matmul";
        let (av, bv) = self.views(op, a, ta, b, tb)?;
        let (x, y) = (self.any(op, a)?, self.any(op, b)?);
        let (m, n) = (av.rows, bv.cols);
        let od = self.opts.activations;
        let buf = self.alloc(op, m * n, od)?;
        let mut c = crate::storage::CudaStorage {
            buf,
            dtype: od,
            len: m * n,
            ordinal: self.ordinal,
        };
        self.gemm_tensors(op, &mut c, x, av, y, bv, 0.0)?;
        Ok(self.tensor(c.buf, od, [m, n]))
    }

    /// `c` keeps its dtype: f32 for parameter gradients (`zeros`), bf16 when it is an
    /// activation gradient that a `matmul` made in bf16.
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
        dflash_core::ops::gemm::matmul_acc_dims(c.shape(), a.shape(), ta, b.shape(), tb)
            .map_err(|detail| self.shape_err(op, detail))?;
        let (x, y) = (self.any(op, a)?, self.any(op, b)?);
        let cs = self.any_mut(op, c)?;
        self.gemm_tensors(op, cs, x, av, y, bv, beta)
    }
}
