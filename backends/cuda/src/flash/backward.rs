//! The backward of `"cuda-flash"`: `attn_bwd_pre_d{D}` (D_i, the dq accumulator zeroed, the
//! mask summaries), `attn_bwd_dkdv_d{D}` (dK/dV per key tile, dQ reduced into the f32
//! accumulator; on Hopper its Q/dO loads and dQ reductions go through the TMA tensor maps of
//! [`crate::tma`]) and `attn_bwd_dq_convert` (launch table: the parent module's header).

use std::sync::Arc;

use cudarc::driver::{CudaSlice, PushKernelArg};
use dflash_core::mask::BlockMask;
use dflash_core::{AttnDims, Result};

use super::{CallShape, FlashIn, FlashKernels, FlashVariant, KernelTail, Tagged, grid, push_mask};
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
        let call = self.backward_call(op, (fk, var), dims, &sh, scale)?;

        let [qb, kb, vb] = self.qkv_operands(op, (q, k, v), &sh)?;
        // `out` is the forward's bf16 output (widened to f32 or not): re-rounding it is exact.
        let (ob, dob) = (
            self.bf16_operand(op, "out", out, nq)?,
            self.bf16_operand(op, "d_out", d_out, nq)?,
        );
        let (qb, kb, vb, ob, dob) = (qb.get(), kb.get(), vb.get(), ob.get(), dob.get());
        let mask_dev = self.upload_mask(op, mask)?;
        let mut ws = self.flash_backward_pre(op, &call, [ob, dob], &mask_dev)?;

        let mut dk_b = self.alloc(op, nk, DType::Bf16)?;
        let mut dv_b = self.alloc(op, nk, DType::Bf16)?;
        if call.g_dkdv > 0 {
            let ins = DkdvInputs {
                q: qb,
                k: kb,
                v: vb,
                d_out: dob,
                lse,
                mask: &mask_dev,
            };
            self.flash_backward_dkdv(op, &call, &ins, &mut ws, [&mut dk_b, &mut dv_b])?;
        }

        // attn_bwd_dq_convert(const float* dq_accum, bf16* dq, long long n, float scale)
        let mut dq_b = self.alloc(op, nq, DType::Bf16)?;
        let n64 = nq as i64;
        let mut l = self.stream.launch_builder(&fk.dq_convert);
        l.arg(&ws.dq_acc).arg(&mut dq_b).arg(&n64).arg(&scale);
        self.launch(op, l, launch_1d(call.g_conv, 256, 0))?;

        Ok((
            self.flash_result(op, dq_b, nq)?,
            self.flash_result(op, dk_b, nk)?,
            self.flash_result(op, dv_b, nk)?,
        ))
    }

    /// The backward's launch grids for `dims` (an error when one does not fit), with what its
    /// kernels take besides their buffers.
    fn backward_call<'a>(
        &self,
        op: &'static str,
        (fk, var): (&'a FlashKernels, &'a FlashVariant),
        dims: &'a AttnDims,
        sh: &'a CallShape,
        scale: f32,
    ) -> Result<BackwardCall<'a>> {
        let nq = sh.nq;
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
        debug_assert!(nq.is_multiple_of(4));
        Ok(BackwardCall {
            fk,
            var,
            dims,
            sh,
            scale,
            n_pre,
            g_pre,
            g_dkdv,
            g_conv,
        })
    }

    /// Allocates the backward's workspaces and runs the preprocess kernel on them (D_i, the
    /// zeroed dq accumulator, the mask summaries); returns them.
    fn flash_backward_pre(
        &self,
        op: &'static str,
        call: &BackwardCall<'_>,
        [ob, dob]: [&CudaSlice<u8>; 2],
        mask_dev: &[Arc<CudaSlice<u8>>; 4],
    ) -> Result<BackwardWorkspace> {
        let (var, sh) = (call.var, call.sh);
        let (nq, nl) = (sh.nq, sh.nl);
        let [tq, _, hq, _] = sh.ints;
        // Workspaces: D_i (Tq, Hq) f32; dq_accum (Tq, Hq, D) f32 (zeroed by the preprocess
        // kernel, so no memset); 8 i32 summary values per query tile of `pre_rows` rows.
        let mut di = self.alloc_f32(op, nl)?;
        let mut dq_acc = self.alloc_f32(op, nq)?;
        let mut summary = self.alloc(op, call.n_pre * 8, DType::F32)?; // 4-byte elements (i32)

        // attn_bwd_pre_d{D}(const bf16* o, dout, const int* fs, fe, ss, se, float* Di,
        //                   float* dq_accum, int* summary, int Tq, int Hq)
        let mut l = self.stream.launch_builder(&var.pre);
        l.arg(ob).arg(dob);
        push_mask(&mut l, mask_dev);
        l.arg(&mut di)
            .arg(&mut dq_acc)
            .arg(&mut summary)
            .arg(&tq)
            .arg(&hq);
        self.launch(op, l, launch_1d(call.g_pre, var.pre_threads, 0))?;
        Ok(BackwardWorkspace {
            di,
            dq_acc,
            summary,
        })
    }

    /// The main backward kernel: dK/dV per key tile into `dk`/`dv` (bf16), dQ reduced into
    /// the workspace's f32 accumulator.
    fn flash_backward_dkdv(
        &self,
        op: &'static str,
        call: &BackwardCall<'_>,
        ins: &DkdvInputs<'_>,
        ws: &mut BackwardWorkspace,
        [dk_b, dv_b]: [&mut CudaSlice<u8>; 2],
    ) -> Result<()> {
        let (var, dims) = (call.var, call.dims);
        let maps = if var.bwd_tma {
            let ptrs = [
                self.dev_ptr(ins.q),
                self.dev_ptr(ins.d_out),
                self.dev_ptr(&ws.dq_acc),
            ];
            TensorMap::backward_maps(ptrs, dims)
                .map_err(|e| self.shape_err(op, format!("cuda-flash backward: {e}")))?
        } else {
            [TensorMap::unused(); 3]
        };
        let tail = KernelTail::new(
            call.sh,
            call.scale,
            call.fk,
            call.g_dkdv,
            dims.kv_heads,
            maps,
        );
        // attn_bwd_dkdv_d{D}(const bf16* q, k, v, dout, const float* lse, Di,
        //                    const int* summary, fs, fe, ss, se, float* dq_accum,
        //                    bf16* dk, dv, int Tq, int Tk, int Hq, int Hkv, float scale,
        //                    int hgroup, TmaDesc tm_q, tm_do, tm_dq)
        let mut l = self.stream.launch_builder(&var.dkdv);
        l.arg(ins.q)
            .arg(ins.k)
            .arg(ins.v)
            .arg(ins.d_out)
            .arg(ins.lse)
            .arg(&ws.di)
            .arg(&ws.summary);
        push_mask(&mut l, ins.mask);
        l.arg(&mut ws.dq_acc).arg(dk_b).arg(dv_b);
        tail.push(&mut l);
        self.launch(op, l, launch_1d(call.g_dkdv, var.bwd_threads, var.bwd_smem))
    }
}

/// One backward call as its kernels see it: the loaded kernels, the head dim's variant, the
/// sizes, the scale and the launch grids.
struct BackwardCall<'a> {
    fk: &'a FlashKernels,
    var: &'a FlashVariant,
    dims: &'a AttnDims,
    sh: &'a CallShape,
    scale: f32,
    /// Query tiles of `pre_rows` rows (8 summary ints each).
    n_pre: usize,
    /// Preprocess grid: one CTA per (query tile, head).
    g_pre: u32,
    /// dK/dV grid: one CTA per (key tile, kv head).
    g_dkdv: u32,
    /// dq conversion grid: 1024 elements per CTA.
    g_conv: u32,
}

/// The workspaces the preprocess kernel writes: D_i (Tq, Hq) f32, the dq accumulator
/// (Tq, Hq, D) f32 and the mask summaries (8 i32 per query tile).
struct BackwardWorkspace {
    di: CudaSlice<u8>,
    dq_acc: CudaSlice<u8>,
    summary: CudaSlice<u8>,
}

/// The bf16 operands (q, k, v, d_out), the f32 lse and the device mask of the dK/dV kernel.
struct DkdvInputs<'a> {
    q: &'a CudaSlice<u8>,
    k: &'a CudaSlice<u8>,
    v: &'a CudaSlice<u8>,
    d_out: &'a CudaSlice<u8>,
    lse: &'a CudaSlice<u8>,
    mask: &'a [Arc<CudaSlice<u8>>; 4],
}
