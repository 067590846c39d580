//! cuBLASLt plans: the handle and workspace ([`Blas`]), descriptors, the heuristic's
//! algorithm choice and the plan cache keyed by [`PlanKey`], and the matmul launch itself.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use cudarc::cublaslt::{result as lt, sys as lts};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use dflash_core::Result;

use super::{GemmPrecision, RowMajorGemm};
use crate::storage::DType;
use crate::{CudaBackend, CudaError};

/// cuBLASLt workspace (NVIDIA recommends 32 MiB on Hopper).
const WORKSPACE_BYTES: usize = 32 << 20;

/// Most cached plans; the cache is cleared when full (the fused loss's tail chunks vary in
/// row count from step to step, so the key set is not bounded by the model alone).
const MAX_PLANS: usize = 4096;

/// What a cached plan depends on: the column-major problem cuBLASLt sees (including the
/// output dtype: a bf16-D plan is never reused for an f32 D or vice versa).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct PlanKey {
    m: u64,
    n: u64,
    k: u64,
    transa: bool,
    transb: bool,
    lda: i64,
    ldb: i64,
    ldc: i64,
    prec: GemmPrecision,
    /// Element type of C (= D): the plan's C layout type.
    c_dtype: DType,
    /// Alignments (bytes, <= 256) of the A, B, C (= D) pointers handed to cuBLASLt.
    align: [u32; 3],
}

/// Layouts, descriptor and algorithm of one [`PlanKey`]; read-only once built.
pub(super) struct Plan {
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

pub(super) fn align_of_ptr(p: u64) -> u32 {
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
    /// Number of cached cuBLASLt plans (for tests and diagnostics).
    pub fn gemm_plans_cached(&self) -> usize {
        self.blas.plans().len()
    }

    /// Number of cached bf16 plan keys for which cuBLASLt had no bf16 algorithm (those
    /// shapes run in TF32 instead; expected 0).
    pub fn gemm_bf16_fallbacks(&self) -> usize {
        self.blas.plans().values().filter(|p| p.is_none()).count()
    }

    /// The column-major problem cuBLASLt sees: m' = N, n' = M, A' = our B (trans tb, leading
    /// dim b_cols, alignment `align_a`), B' = our A (trans ta, a_cols, `align_b`).
    pub(super) fn plan_key(
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
            c_dtype: g.c_dtype,
            align: [align_a, align_b, align_of_ptr(g.c)],
        }
    }

    /// The cached plan of `key`, built (heuristic query) on a miss. `None` only for a bf16
    /// key whose heuristic found no algorithm (cached too, so it is reported once).
    pub(super) fn plan(
        &self,
        op: &'static str,
        g: &RowMajorGemm,
        key: &PlanKey,
    ) -> Result<Option<Arc<Plan>>> {
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
    /// bf16 plan; cuBLASLt's A is our B and vice versa), C/D (f32 or bf16) at `g.c`.
    pub(super) fn run_plan(
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
        let types = PlanTypes::of(key);
        let (m, n, k) = (key.m, key.n, key.k);
        let (ar, ac) = if key.transa { (k, m) } else { (m, k) };
        let (br, bc) = if key.transb { (n, k) } else { (k, n) };
        // SAFETY: descriptors are created here and destroyed by their RAII wrappers.
        unsafe {
            let a_l = Layout(
                lt::create_matrix_layout(types.ab, ar, ac, key.lda)
                    .map_err(|e| err("layout A", e))?,
            );
            let b_l = Layout(
                lt::create_matrix_layout(types.ab, br, bc, key.ldb)
                    .map_err(|e| err("layout B", e))?,
            );
            let c_l = Layout(
                lt::create_matrix_layout(types.c, m, n, key.ldc).map_err(|e| err("layout C", e))?,
            );
            let desc = matmul_desc(types.compute, key, &err)?;
            let pref = matmul_pref(key, &err)?;
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

/// The cuBLASLt types of a plan: A/B elements, C (= D) elements and compute; the scale type
/// is f32 in every mode.
struct PlanTypes {
    ab: lts::cudaDataType_t,
    c: lts::cudaDataType_t,
    compute: lts::cublasComputeType_t,
}

impl PlanTypes {
    /// The types of `key`'s precision and C dtype.
    fn of(key: &PlanKey) -> PlanTypes {
        let f32t = lts::cudaDataType_t::CUDA_R_32F;
        let ab = match key.prec {
            GemmPrecision::Bf16 => lts::cudaDataType_t::CUDA_R_16BF,
            GemmPrecision::Tf32 | GemmPrecision::Fp32 => f32t,
        };
        // C = D: f32, or bf16 (bf16 A/B only: the caller routes f32-operand modes with a
        // bf16 C through f32 scratch).
        let c = match key.c_dtype {
            DType::F32 => f32t,
            DType::Bf16 => lts::cudaDataType_t::CUDA_R_16BF,
        };
        let compute = match key.prec {
            GemmPrecision::Tf32 => lts::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32,
            GemmPrecision::Fp32 | GemmPrecision::Bf16 => {
                lts::cublasComputeType_t::CUBLAS_COMPUTE_32F
            }
        };
        PlanTypes { ab, c, compute }
    }
}

/// The matmul descriptor of `key`: `compute`, f32 scale type (alpha/beta are f32, whatever
/// C/D's type), and `key`'s transposes. `err` names the failing call.
fn matmul_desc(
    compute: lts::cublasComputeType_t,
    key: &PlanKey,
    err: &impl Fn(&str, lt::CublasError) -> dflash_core::Error,
) -> Result<Desc> {
    // SAFETY: the descriptor is destroyed by its RAII wrapper; TRANSA/B take an i32, passed
    // by pointer with its size.
    unsafe {
        let desc = Desc(
            lt::create_matmul_desc(compute, lts::cudaDataType_t::CUDA_R_32F)
                .map_err(|e| err("desc", e))?,
        );
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
        Ok(desc)
    }
}

/// The heuristic's preference for `key`: at most [`WORKSPACE_BYTES`] of workspace, and the
/// A, B, C and D pointer alignments of `key`. `err` names the failing call.
fn matmul_pref(
    key: &PlanKey,
    err: &impl Fn(&str, lt::CublasError) -> dflash_core::Error,
) -> Result<Pref> {
    // SAFETY: the preference is destroyed by its RAII wrapper; the workspace size is a
    // usize and the alignments are u32, each passed by pointer with its size.
    unsafe {
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
        Ok(pref)
    }
}
