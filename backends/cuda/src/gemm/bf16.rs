//! bf16 operands: rounding f32 operands to bf16 scratch (exactly the span cuBLASLt reads)
//! and the bf16 GEMM path built on them.

use cudarc::driver::{CudaSlice, DevicePtr, PushKernelArg};
use dflash_core::Result;

use super::plan::align_of_ptr;
use super::{GemmPrecision, RowMajorGemm};
use crate::storage::DType;
use crate::{CudaBackend, grid1d};

/// Elements cuBLASLt may read of a row-major operand stored with `stored_cols` columns whose
/// used part is `rows x cols` (transpose already applied to the stored shape): the span from
/// the first element to the last used one. The bf16 copy covers exactly this span, so it has
/// the same leading dimension and never reads past what the f32 GEMM would read.
pub(super) fn operand_span(stored_rows: usize, used_cols: usize, stored_cols: usize) -> usize {
    (stored_rows - 1) * stored_cols + used_cols
}

impl CudaBackend {
    /// The bf16 GEMM: operands rounded into stream-ordered scratch here unless the caller
    /// passed bf16 copies, f32 C; TF32 where cuBLASLt has no bf16 algorithm for the problem.
    pub(super) fn gemm_bf16(&self, op: &'static str, g: &RowMajorGemm) -> Result<()> {
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
    pub(super) fn bf16_copy(
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
}
