//! The backward of `"cuda-flash"`: `attn_bwd_pre_d{D}` (D_i, the dq accumulator zeroed, the
//! mask summaries), `attn_bwd_dkdv_d{D}` (dK/dV per key tile, dQ reduced into the f32
//! accumulator; on Hopper its Q/dO loads and dQ reductions go through the TMA tensor maps of
//! [`crate::tma`]) and `attn_bwd_dq_convert` (launch table: the parent module's header).

use cudarc::driver::{CudaSlice, PushKernelArg};
use dflash_core::mask::BlockMask;
use dflash_core::{AttnDims, Result};

use super::{CallShape, FlashIn, KernelTail, Tagged, grid, push_mask};
use crate::storage::DType;
use crate::tma::TensorMap;
use crate::{CudaBackend, launch_1d};

impl CudaBackend {
    /// Backward: returns `(dq, dk, dv)` f32 buffers. q, k, v, out, d_out: f32 buffers or
    /// storages of either dtype (bf16 ones are used without conversion); lse f32.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn flash_backward<
        Q: FlashIn + ?Sized,
        K: FlashIn + ?Sized,
        V: FlashIn + ?Sized,
        O: FlashIn + ?Sized,
        G: FlashIn + ?Sized,
    >(
        &self,
        op: &'static str,
        dims: &AttnDims,
        q: &Q,
        k: &K,
        v: &V,
        out: &O,
        lse: &CudaSlice<u8>,
        d_out: &G,
        mask: &BlockMask,
        scale: f32,
    ) -> Result<(Tagged, Tagged, Tagged)> {
        let fk = self.flash(op)?;
        let var = self.flash_variant(op, fk, dims)?;
        let sh = CallShape::of(dims);
        let (nq, nk, nl) = (sh.nq, sh.nk, sh.nl);
        if nl == 0 {
            // No query rows: no gradient flows anywhere.
            return Ok((
                (self.alloc_f32(op, 0)?, DType::F32),
                (self.zeros_f32(op, nk)?, DType::F32),
                (self.zeros_f32(op, nk)?, DType::F32),
            ));
        }
        let n_pre = dims.q_rows.div_ceil(var.pre_rows as usize);
        // one preprocess block per (query tile, head)
        let g_pre = grid(dims.q_rows, var.pre_rows, dims.q_heads)
            .ok_or_else(|| self.shape_err(op, "backward grid too large for cuda-flash"))?;
        let g_dkdv = grid(dims.kv_rows, var.bwd_bn, dims.kv_heads)
            .ok_or_else(|| self.shape_err(op, "backward grid too large for cuda-flash"))?;
        // dq_convert handles 4 elements per thread, 256 threads per block; nq is a multiple of
        // 4 because D is.
        let g_conv = grid(nq, 1024, 1)
            .ok_or_else(|| self.shape_err(op, "backward grid too large for cuda-flash"))?;
        debug_assert!(nq % 4 == 0);

        let [qb, kb, vb] = self.qkv_operands(op, (q, k, v), &sh)?;
        // `out` is the forward's bf16 output (widened to f32 or not): re-rounding it is exact.
        let (ob, dob) = (
            self.bf16_operand(op, "out", out, nq)?,
            self.bf16_operand(op, "d_out", d_out, nq)?,
        );
        let (qb, kb, vb, ob, dob) = (qb.get(), kb.get(), vb.get(), ob.get(), dob.get());
        let mask_dev = self.upload_mask(op, mask)?;
        let [tq, _, hq, _] = sh.ints;
        // Workspaces: D_i (Tq, Hq) f32; dq_accum (Tq, Hq, D) f32 (zeroed by the preprocess
        // kernel, so no memset); 8 i32 summary values per query tile of `pre_rows` rows.
        let mut di = self.alloc_f32(op, nl)?;
        let mut dq_acc = self.alloc_f32(op, nq)?;
        let mut summary = self.alloc(op, n_pre * 8, DType::F32)?; // 4-byte elements (i32)

        // attn_bwd_pre_d{D}(const bf16* o, dout, const int* fs, fe, ss, se, float* Di,
        //                   float* dq_accum, int* summary, int Tq, int Hq)
        let mut l = self.stream.launch_builder(&var.pre);
        l.arg(ob).arg(dob);
        push_mask(&mut l, &mask_dev);
        l.arg(&mut di)
            .arg(&mut dq_acc)
            .arg(&mut summary)
            .arg(&tq)
            .arg(&hq);
        self.launch(op, l, launch_1d(g_pre, var.pre_threads, 0))?;

        let mut dk_b = self.alloc(op, nk, DType::Bf16)?;
        let mut dv_b = self.alloc(op, nk, DType::Bf16)?;
        if g_dkdv > 0 {
            let maps = if var.bwd_tma {
                let ptrs = [self.dev_ptr(qb), self.dev_ptr(dob), self.dev_ptr(&dq_acc)];
                TensorMap::backward_maps(ptrs, dims)
                    .map_err(|e| self.shape_err(op, format!("cuda-flash backward: {e}")))?
            } else {
                [TensorMap::unused(); 3]
            };
            let tail = KernelTail::new(&sh, scale, fk, g_dkdv, dims.kv_heads, maps);
            // attn_bwd_dkdv_d{D}(const bf16* q, k, v, dout, const float* lse, Di,
            //                    const int* summary, fs, fe, ss, se, float* dq_accum,
            //                    bf16* dk, dv, int Tq, int Tk, int Hq, int Hkv, float scale,
            //                    int hgroup, TmaDesc tm_q, tm_do, tm_dq)
            let mut l = self.stream.launch_builder(&var.dkdv);
            l.arg(qb)
                .arg(kb)
                .arg(vb)
                .arg(dob)
                .arg(lse)
                .arg(&di)
                .arg(&summary);
            push_mask(&mut l, &mask_dev);
            l.arg(&mut dq_acc).arg(&mut dk_b).arg(&mut dv_b);
            tail.push(&mut l);
            self.launch(op, l, launch_1d(g_dkdv, var.bwd_threads, var.bwd_smem))?;
        }

        // attn_bwd_dq_convert(const float* dq_accum, bf16* dq, long long n, float scale)
        let mut dq_b = self.alloc(op, nq, DType::Bf16)?;
        let n64 = nq as i64;
        let mut l = self.stream.launch_builder(&fk.dq_convert);
        l.arg(&dq_acc).arg(&mut dq_b).arg(&n64).arg(&scale);
        self.launch(op, l, launch_1d(g_conv, 256, 0))?;

        Ok((
            self.flash_result(op, dq_b, nq)?,
            self.flash_result(op, dk_b, nk)?,
            self.flash_result(op, dv_b, nk)?,
        ))
    }
}
