//! The bf16 GEMM path: bf16 operands read in place, f32 operands rounded into bf16 scratch
//! (exactly the span cuBLASLt reads).

use dflash_core::Result;

use super::plan::align_of_ptr;
use super::{GemmPrecision, RowMajorGemm, scratch_or};
use crate::CudaBackend;
use crate::storage::DType;

/// Elements cuBLASLt may read of a row-major operand stored with `stored_cols` columns whose
/// used part is `rows x cols` (transpose already applied to the stored shape): the span from
/// the first element to the last used one. A converted copy covers exactly this span, so it
/// has the same leading dimension and never reads past what the GEMM would read.
pub(super) fn operand_span(stored_rows: usize, used_cols: usize, stored_cols: usize) -> usize {
    (stored_rows - 1) * stored_cols + used_cols
}

impl CudaBackend {
    /// The bf16 GEMM: bf16 operands as they are, f32 operands rounded (RNE) into
    /// stream-ordered scratch, f32 or bf16 C; TF32 where cuBLASLt has no bf16 algorithm for the
    /// problem (then bf16 operands are widened instead, exactly).
    pub(super) fn gemm_bf16(&self, op: &'static str, g: &RowMajorGemm) -> Result<()> {
        let (na, nb) = g.spans();
        // Scratch from the stream-ordered pool for f32 operands only, dropped (freed in stream
        // order, after the matmul) when this function returns; declared before the guards
        // below, so they drop after them. Allocated (not yet written) before the plan lookup
        // so that the plan key sees the real pointer alignments.
        let mut sa = match g.a.dtype {
            DType::Bf16 => None,
            DType::F32 => Some(self.alloc(op, na, DType::Bf16)?),
        };
        let mut sb = match g.b.dtype {
            DType::Bf16 => None,
            DType::F32 => Some(self.alloc(op, nb, DType::Bf16)?),
        };
        let key = {
            let (pa, _ga) = scratch_or(&sa, g.a.ptr, &self.stream);
            let (pb, _gb) = scratch_or(&sb, g.b.ptr, &self.stream);
            self.plan_key(g, align_of_ptr(pb), align_of_ptr(pa), GemmPrecision::Bf16)
        };
        let Some(plan) = self.plan(op, g, &key)? else {
            // cuBLASLt has no bf16 algorithm for this problem (reported once per plan key
            // when the plan was built): TF32 instead (bf16 operands widened, exactly).
            drop((sa, sb));
            return self.gemm_f32(op, g, GemmPrecision::Tf32);
        };
        if let Some(s) = sa.as_mut() {
            self.convert_raw(op, s, g.a.ptr, na, DType::Bf16)?;
        }
        if let Some(s) = sb.as_mut() {
            self.convert_raw(op, s, g.b.ptr, nb, DType::Bf16)?;
        }
        let (pa, _ga) = scratch_or(&sa, g.a.ptr, &self.stream);
        let (pb, _gb) = scratch_or(&sb, g.b.ptr, &self.stream);
        self.run_plan(op, g, &plan, pa, pb, GemmPrecision::Bf16)
    }
}
