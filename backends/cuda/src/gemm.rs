//! Matrix products through cuBLASLt on `(rows, cols)` views of row-major tensors.
//!
//! Row-major `C (M, N) = op(A) (M, K) @ op(B) (K, N)` is column-major `C^T (N, M) =
//! op(B)^T @ op(A)^T`, and a row-major `(r, c)` buffer read column-major is its transpose
//! `(c, r)` with leading dimension `c`. So cuBLASLt is called with its `A` := our `B`
//! (transposed iff `tb`), its `B` := our `A` (transposed iff `ta`), `m = N`, `n = M`, and every
//! leading dimension equal to the stored column count. No copies, any transpose combination.
//!
//! Precision ([`GemmPrecision`]): f32 tensors, f32 output, f32 scale (alpha, beta) and f32
//! accumulation in every mode. `Bf16` (default, the PyTorch bf16-autocast recipe's precision)
//! rounds both operands to bf16 (RNE, `f32_to_bf16`) into stream-ordered scratch buffers
//! freed right after the product, then runs cuBLASLt with bf16 A/B and f32 C/D; `Tf32` and
//! `Fp32` run on the f32 operands with TF32 tensor-core or exact f32 compute.
//!
//! Plans (layouts, matmul descriptor and the heuristic's algorithm) are cached per
//! [`PlanKey`] (shape, transposes, leading dims, precision, pointer alignments), so repeated
//! shapes skip the heuristic query.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use cudarc::cublaslt::{result as lt, sys as lts};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, PushKernelArg};
use dflash_core::{GemmOps, Result, Tensor, Transpose};

use crate::storage::DType;
use crate::{CudaBackend, CudaError, grid1d};

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

/// cuBLASLt workspace (NVIDIA recommends 32 MiB on Hopper).
const WORKSPACE_BYTES: usize = 32 << 20;

/// Most cached plans; the cache is cleared when full (the fused loss's tail chunks vary in
/// row count from step to step, so the key set is not bounded by the model alone).
const MAX_PLANS: usize = 4096;

/// What a cached plan depends on: the column-major problem cuBLASLt sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct PlanKey {
    m: u64,
    n: u64,
    k: u64,
    transa: bool,
    transb: bool,
    lda: i64,
    ldb: i64,
    ldc: i64,
    prec: GemmPrecision,
    /// Alignments (bytes, <= 256) of the A, B, C (= D) pointers handed to cuBLASLt.
    align: [u32; 3],
}

/// Layouts, descriptor and algorithm of one [`PlanKey`]; read-only once built.
struct Plan {
    a_l: Layout,
    b_l: Layout,
    c_l: Layout,
    desc: Desc,
    algo: lts::cublasLtMatmulAlgo_t,
}

// SAFETY: the plan's descriptors are only read (passed as const to cublasLtMatmul) after
// construction; cuBLASLt descriptors are plain host structures with no thread affinity.
unsafe impl Send for Plan {}
unsafe impl Sync for Plan {}

/// A cuBLASLt handle, its workspace and the plan cache, owned by one backend (one stream).
pub(crate) struct Blas {
    handle: lts::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
    plans: Mutex<HashMap<PlanKey, Option<Arc<Plan>>>>,
}

// SAFETY: a cuBLASLt handle may be used from any thread; calls on it are serialised by the
// backend's single stream (the workspace is only used by work enqueued on that stream).
unsafe impl Send for Blas {}
unsafe impl Sync for Blas {}

impl Drop for Blas {
    fn drop(&mut self) {
        // SAFETY: the handle was created by `Blas::new` and is destroyed once. The cached
        // plans (layouts, descriptors) do not depend on the handle; they drop afterwards.
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
        Ok(Blas {
            handle,
            workspace,
            plans: Mutex::new(HashMap::new()),
        })
    }

    fn plans(&self) -> std::sync::MutexGuard<'_, HashMap<PlanKey, Option<Arc<Plan>>>> {
        // A panic while holding the lock cannot leave a half-inserted entry: recover.
        self.plans.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One row-major GEMM on raw device addresses of f32 data: `C = alpha * op(A) @ op(B) +
/// beta * C`.
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
    /// Optional bf16 copies (RNE) of A / B with the same element offsets and row strides,
    /// used in [`GemmPrecision::Bf16`] mode instead of converting per call (the fused loss
    /// converts the head weight once per call, not once per chunk). Ignored in other modes.
    pub a_bf16: Option<u64>,
    pub b_bf16: Option<u64>,
}

fn align_of_ptr(p: u64) -> u32 {
    if p == 0 {
        256
    } else {
        (1u64 << p.trailing_zeros().min(8)) as u32
    }
}

/// Elements cuBLASLt may read of a row-major operand stored with `stored_cols` columns whose
/// used part is `rows x cols` (transpose already applied to the stored shape): the span from
/// the first element to the last used one. The bf16 copy covers exactly this span, so it has
/// the same leading dimension and never reads past what the f32 GEMM would read.
fn operand_span(stored_rows: usize, used_cols: usize, stored_cols: usize) -> usize {
    (stored_rows - 1) * stored_cols + used_cols
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
    /// Number of cached cuBLASLt plans (for tests and diagnostics).
    pub fn gemm_plans_cached(&self) -> usize {
        self.blas.plans().len()
    }

    /// Number of cached bf16 plan keys for which cuBLASLt had no bf16 algorithm (those
    /// shapes run in TF32 instead; expected 0).
    pub fn gemm_bf16_fallbacks(&self) -> usize {
        self.blas.plans().values().filter(|p| p.is_none()).count()
    }

    /// Enqueues one GEMM on this backend's stream in the backend's [`GemmPrecision`]. The
    /// caller holds the device-pointer guards of A, B and C (f32) across this call. `m`, `n`,
    /// `k` must be > 0.
    pub(crate) fn gemm_raw(&self, op: &'static str, g: &RowMajorGemm) -> Result<()> {
        self.stream
            .context()
            .bind_to_thread()
            .map_err(|e| self.drv(op, e))?;
        if self.opts.gemm != GemmPrecision::Bf16 {
            return self.gemm_f32(op, g, self.opts.gemm);
        }
        // Stored shapes: A is (k, m) if ta else (m, k); B is (n, k) if tb else (k, n).
        let na = if g.ta {
            operand_span(g.k, g.m, g.a_cols)
        } else {
            operand_span(g.m, g.k, g.a_cols)
        };
        let nb = if g.tb {
            operand_span(g.n, g.k, g.b_cols)
        } else {
            operand_span(g.k, g.n, g.b_cols)
        };
        // Scratch from the stream-ordered pool (unless the caller passed a bf16 copy), dropped
        // (freed in stream order, after the matmul) when this function returns; declared
        // before the guards below, so they drop after them.
        let mut sa = match g.a_bf16 {
            Some(_) => None,
            None => Some(self.alloc(op, na, DType::Bf16)?),
        };
        let mut sb = match g.b_bf16 {
            Some(_) => None,
            None => Some(self.alloc(op, nb, DType::Bf16)?),
        };
        let align = |s: &Option<CudaSlice<u8>>, given: Option<u64>| match s {
            Some(s) => align_of_ptr(s.device_ptr(&self.stream).0),
            None => align_of_ptr(given.unwrap_or(0)),
        };
        let key = self.plan_key(
            g,
            align(&sb, g.b_bf16),
            align(&sa, g.a_bf16),
            GemmPrecision::Bf16,
        );
        let Some(plan) = self.plan(op, g, &key)? else {
            // cuBLASLt has no bf16 algorithm for this problem (reported once per plan key
            // when the plan was built): TF32 on the f32 operands instead.
            return self.gemm_f32(op, g, GemmPrecision::Tf32);
        };
        if let Some(s) = sa.as_mut() {
            self.bf16_copy(op, s, g.a, na)?;
        }
        if let Some(s) = sb.as_mut() {
            self.bf16_copy(op, s, g.b, nb)?;
        }
        let (pa, _ga) = match (&sa, g.a_bf16) {
            (Some(s), _) => {
                let (p, guard) = s.device_ptr(&self.stream);
                (p, Some(guard))
            }
            (None, p) => (p.unwrap_or(0), None),
        };
        let (pb, _gb) = match (&sb, g.b_bf16) {
            (Some(s), _) => {
                let (p, guard) = s.device_ptr(&self.stream);
                (p, Some(guard))
            }
            (None, p) => (p.unwrap_or(0), None),
        };
        self.run_plan(op, g, &plan, pa, pb, GemmPrecision::Bf16)
    }

    /// TF32 or exact-f32 compute directly on the f32 operands.
    fn gemm_f32(&self, op: &'static str, g: &RowMajorGemm, prec: GemmPrecision) -> Result<()> {
        let key = self.plan_key(g, align_of_ptr(g.b), align_of_ptr(g.a), prec);
        match self.plan(op, g, &key)? {
            Some(plan) => self.run_plan(op, g, &plan, g.a, g.b, prec),
            None => unreachable!("only bf16 plans may be missing"),
        }
    }

    /// With bf16 GEMMs, a bf16 copy of the first `n` f32 elements of `src` for
    /// [`RowMajorGemm::a_bf16`] / `b_bf16` (an operand reused by many GEMMs); otherwise `None`.
    pub(crate) fn gemm_operand_bf16(
        &self,
        op: &'static str,
        src: &CudaSlice<u8>,
        n: usize,
    ) -> Result<Option<CudaSlice<u8>>> {
        if self.opts.gemm != GemmPrecision::Bf16 || n == 0 {
            return Ok(None);
        }
        let mut out = self.alloc(op, n, DType::Bf16)?;
        let (p, _g) = src.device_ptr(&self.stream);
        self.bf16_copy(op, &mut out, p, n)?;
        Ok(Some(out))
    }

    /// Rounds `n` f32 elements at device address `src` to bf16 (nearest even) into `out`.
    fn bf16_copy(
        &self,
        op: &'static str,
        out: &mut CudaSlice<u8>,
        src: u64,
        n: usize,
    ) -> Result<()> {
        let n64 = n as i64;
        let mut l = self.stream.launch_builder(&self.k().f32_to_bf16);
        // f32_to_bf16(unsigned short* out, const float* x, long long n), grid-stride; `src`
        // is a raw device address (8 bytes, passed as the pointer argument).
        l.arg(out).arg(&src).arg(&n64);
        self.launch(op, l, grid1d(n))
    }

    /// The column-major problem cuBLASLt sees: m' = N, n' = M, A' = our B (trans tb, leading
    /// dim b_cols, alignment `align_a`), B' = our A (trans ta, a_cols, `align_b`).
    fn plan_key(
        &self,
        g: &RowMajorGemm,
        align_a: u32,
        align_b: u32,
        prec: GemmPrecision,
    ) -> PlanKey {
        PlanKey {
            m: g.n as u64,
            n: g.m as u64,
            k: g.k as u64,
            transa: g.tb,
            transb: g.ta,
            lda: g.b_cols as i64,
            ldb: g.a_cols as i64,
            ldc: g.n as i64,
            prec,
            align: [align_a, align_b, align_of_ptr(g.c)],
        }
    }

    /// The cached plan of `key`, built (heuristic query) on a miss. `None` only for a bf16
    /// key whose heuristic found no algorithm (cached too, so it is reported once).
    fn plan(&self, op: &'static str, g: &RowMajorGemm, key: &PlanKey) -> Result<Option<Arc<Plan>>> {
        if let Some(p) = self.blas.plans().get(key) {
            return Ok(p.clone());
        }
        let built = match self.build_plan(op, g, key) {
            Ok(p) => Some(Arc::new(p)),
            Err(e) if key.prec == GemmPrecision::Bf16 => {
                eprintln!("dflash-backend-cuda: {e}; using TF32 for this shape instead");
                None
            }
            Err(e) => return Err(e),
        };
        let mut plans = self.blas.plans();
        if plans.len() >= MAX_PLANS {
            plans.clear();
        }
        Ok(plans.entry(*key).or_insert(built).clone())
    }

    /// Enqueues the matmul of `plan` with our A at `pa` and our B at `pb` (f32, or bf16 for a
    /// bf16 plan; cuBLASLt's A is our B and vice versa), C/D f32 at `g.c`.
    fn run_plan(
        &self,
        op: &'static str,
        g: &RowMajorGemm,
        plan: &Plan,
        pa: u64,
        pb: u64,
        prec: GemmPrecision,
    ) -> Result<()> {
        let ws = WORKSPACE_BYTES;
        // SAFETY: the plan's descriptors match the pointers' types, shapes, leading dims and
        // alignments (they are its key); A, B, C live until the work completes (guards held
        // by the callers); the workspace belongs to this backend's stream.
        unsafe {
            let (w, _w_guard) = self.blas.workspace.device_ptr(&self.stream);
            lt::matmul(
                self.blas.handle,
                plan.desc.0,
                &g.alpha as *const f32 as *const c_void,
                &g.beta as *const f32 as *const c_void,
                pb as *const c_void,
                plan.a_l.0,
                pa as *const c_void,
                plan.b_l.0,
                g.c as *const c_void,
                plan.c_l.0,
                g.c as *mut c_void,
                plan.c_l.0,
                &plan.algo,
                w as *mut c_void,
                ws,
                self.stream.cu_stream() as *mut _,
            )
            .map_err(|e| self.blas_err(op, g, prec, "matmul", e))?;
        }
        Ok(())
    }

    fn blas_err(
        &self,
        op: &'static str,
        g: &RowMajorGemm,
        prec: GemmPrecision,
        what: &str,
        e: lt::CublasError,
    ) -> dflash_core::Error {
        dflash_core::Error::op(
            op,
            self.tag.clone(),
            format!(
                "cuBLASLt {what} failed for (M, N, K) = ({}, {}, {}), ta={}, tb={}, {}: {e}",
                g.m,
                g.n,
                g.k,
                g.ta,
                g.tb,
                prec.name()
            ),
        )
    }

    /// Layouts, descriptor and the heuristic's best algorithm for `key`.
    fn build_plan(&self, op: &'static str, g: &RowMajorGemm, key: &PlanKey) -> Result<Plan> {
        let err = |what: &str, e: lt::CublasError| self.blas_err(op, g, key.prec, what, e);
        let f32t = lts::cudaDataType_t::CUDA_R_32F;
        let ab_t = match key.prec {
            GemmPrecision::Bf16 => lts::cudaDataType_t::CUDA_R_16BF,
            GemmPrecision::Tf32 | GemmPrecision::Fp32 => f32t,
        };
        let compute = match key.prec {
            GemmPrecision::Tf32 => lts::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
            GemmPrecision::Fp32 | GemmPrecision::Bf16 => {
                lts::cublasComputeType_t::CUBLAS_COMPUTE_32F
            }
        };
        let (m, n, k) = (key.m, key.n, key.k);
        let (ar, ac) = if key.transa { (k, m) } else { (m, k) };
        let (br, bc) = if key.transb { (n, k) } else { (k, n) };
        // SAFETY: descriptors are created here and destroyed by their RAII wrappers; attribute
        // values are the types cuBLASLt documents (i32 for TRANSA/B, usize for the workspace,
        // u32 alignments).
        unsafe {
            let a_l = Layout(
                lt::create_matrix_layout(ab_t, ar, ac, key.lda).map_err(|e| err("layout A", e))?,
            );
            let b_l = Layout(
                lt::create_matrix_layout(ab_t, br, bc, key.ldb).map_err(|e| err("layout B", e))?,
            );
            let c_l = Layout(
                lt::create_matrix_layout(f32t, m, n, key.ldc).map_err(|e| err("layout C", e))?,
            );
            // Scale type f32 in every mode (alpha/beta are f32; C/D are f32).
            let desc = Desc(lt::create_matmul_desc(compute, f32t).map_err(|e| err("desc", e))?);
            for (attr, t) in [
                (
                    lts::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                    key.transa,
                ),
                (
                    lts::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB,
                    key.transb,
                ),
            ] {
                let v: i32 = t as i32;
                lt::set_matmul_desc_attribute(
                    desc.0,
                    attr,
                    &v as *const i32 as *const c_void,
                    std::mem::size_of::<i32>(),
                )
                .map_err(|e| err("transpose attribute", e))?;
            }
            let pref = Pref(lt::create_matmul_pref().map_err(|e| err("preference", e))?);
            let ws = WORKSPACE_BYTES;
            lt::set_matmul_pref_attribute(
                pref.0,
                lts::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                &ws as *const usize as *const c_void,
                std::mem::size_of::<usize>(),
            )
            .map_err(|e| err("workspace preference", e))?;
            let [al_a, al_b, al_c] = key.align;
            for (attr, al) in [
                (lts::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, al_a),
                (lts::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, al_b),
                (lts::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, al_c),
                (lts::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, al_c),
            ] {
                lt::set_matmul_pref_attribute(
                    pref.0,
                    attr,
                    &al as *const u32 as *const c_void,
                    std::mem::size_of::<u32>(),
                )
                .map_err(|e| err("alignment preference", e))?;
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
            .map_err(|e| err("heuristic", e))?;
            Ok(Plan {
                a_l,
                b_l,
                c_l,
                desc,
                algo: heur.algo,
            })
        }
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
                a_bf16: None,
                b_bf16: None,
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
