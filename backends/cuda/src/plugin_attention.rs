//! Attention through a device kernel from outside this backend (a CUDA plugin selected as
//! `plugin:PATH` or by its `[plugins] paths` name): the operands stay in this backend's memory
//! as f32 (bf16 inputs widened exactly), the kernel is called with their device addresses, this
//! backend's stream and a device workspace, with this device's context current; `out` comes
//! back in the activation dtype like the in-tree kernels'.

use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use dflash_core::mask::BlockMask;
use dflash_core::{
    AttnDims, DeviceAttentionKernel, DeviceAttnBackward, DeviceAttnForward, DeviceCall, Error,
    Result,
};

use crate::storage::DType;
use crate::{CudaBackend, CudaStorage};

/// `[q, k, v]` of a forward.
pub(crate) type FwdIn<'a> = [&'a CudaStorage; 3];
/// `[q, k, v, out, lse, d_out]` of a backward.
pub(crate) type BwdIn<'a> = [&'a CudaStorage; 6];
/// A result buffer and its dtype.
pub(crate) type Out = (CudaSlice<u8>, DType);
/// What a call's device addresses point into besides its operands: the mask's four arrays
/// and the workspace (with its size), kept alive until the kernel's work is enqueued.
struct Setup {
    mask: Vec<std::sync::Arc<CudaSlice<u8>>>,
    workspace: CudaSlice<u8>,
    workspace_bytes: u64,
}

impl CudaBackend {
    fn plugin_err(&self, op: &'static str, kernel: &dyn DeviceAttentionKernel, e: String) -> Error {
        Error::op(
            op,
            self.tag.clone(),
            format!("attention plugin {:?}: {e}", kernel.name()),
        )
    }

    /// The call's shared part: the kernel's capability check, the mask on the device, the
    /// workspace, and the context made current. Returns the buffers the call's addresses point
    /// into, to be kept alive until the kernel's work is enqueued.
    fn plugin_setup(
        &self,
        op: &'static str,
        kernel: &dyn DeviceAttentionKernel,
        backward: bool,
        dims: &AttnDims,
        mask: &BlockMask,
    ) -> Result<Setup> {
        kernel
            .supports(backward, dims, mask)
            .map_err(|e| self.plugin_err(op, kernel, e))?;
        let ws_bytes = kernel
            .workspace_bytes(backward, dims)
            .map_err(|e| self.plugin_err(op, kernel, e))?;
        let ws_len = usize::try_from(ws_bytes)
            .map_err(|_| self.plugin_err(op, kernel, format!("workspace of {ws_bytes} bytes")))?;
        let ws = self.zeros_dt(op, ws_len.div_ceil(4), DType::F32)?;
        let mask_bufs = self.upload_mask(op, mask)?.to_vec();
        self.dev.ctx.bind_to_thread().map_err(|e| self.drv(op, e))?;
        Ok(Setup {
            mask: mask_bufs,
            workspace: ws,
            workspace_bytes: ws_bytes,
        })
    }

    /// The shared part of a call's description, with the device addresses of `setup`'s
    /// buffers (their guards are returned, to be held over the call).
    fn device_call<'a>(
        &'a self,
        dims: &'a AttnDims,
        mask: &'a BlockMask,
        scale: f32,
        setup: &'a Setup,
    ) -> (DeviceCall<'a>, Vec<cudarc::driver::SyncOnDrop<'a>>) {
        let s = &self.stream;
        let mut guards = Vec::with_capacity(5);
        let mut addr = |b: &'a CudaSlice<u8>| {
            let (p, g) = b.device_ptr(s);
            guards.push(g);
            p
        };
        let m = [0, 1, 2, 3].map(|i| addr(&setup.mask[i]));
        // The ABI's workspace is NULL when the kernel asked for none, as on the host.
        let workspace = match setup.workspace_bytes {
            0 => 0,
            _ => addr(&setup.workspace),
        };
        let call = DeviceCall {
            dims,
            mask,
            mask_arrays: m,
            scale,
            device_id: self.ordinal as i32,
            stream: s.cu_stream().cast(),
            workspace,
            workspace_bytes: setup.workspace_bytes,
        };
        (call, guards)
    }

    /// `(out (Tq, Hq, D) in the activation dtype, lse (Tq, Hq) f32)`.
    pub(crate) fn plugin_forward(
        &self,
        op: &'static str,
        kernel: &dyn DeviceAttentionKernel,
        dims: &AttnDims,
        mask: &BlockMask,
        scale: f32,
        ins: FwdIn<'_>,
    ) -> Result<(Out, CudaSlice<u8>)> {
        let setup = self.plugin_setup(op, kernel, false, dims, mask)?;
        let wide = ins.map(|s| self.widen(op, s));
        let [q, k, v] = wide;
        let (q, k, v) = (q?, k?, v?);
        let nl = dims.q_rows * dims.q_heads;
        let mut out = self.alloc_f32(op, ins[0].len)?;
        let mut lse = self.alloc_f32(op, nl)?;
        if nl > 0 {
            let s = &self.stream;
            // Outputs are marked written (`device_ptr_mut`), so that a reader on another
            // stream (a detached download, another instance on this device) waits for the
            // plugin's kernels.
            let (pq, pk, pv, po, pl) = (
                q.get().device_ptr(s),
                k.get().device_ptr(s),
                v.get().device_ptr(s),
                out.device_ptr_mut(s),
                lse.device_ptr_mut(s),
            );
            let (shared, _guards) = self.device_call(dims, mask, scale, &setup);
            let call = DeviceAttnForward {
                call: shared,
                q: pq.0,
                k: pk.0,
                v: pv.0,
                out: po.0,
                lse: pl.0,
            };
            // SAFETY: every address is a live allocation of this device of the call's shape
            // (checked by the op before), the workspace holds ws_bytes, the stream is this
            // backend's and the context was made current in plugin_setup.
            unsafe { kernel.forward(&call) }.map_err(|e| self.plugin_err(op, kernel, e))?;
        }
        Ok((self.in_activations(op, out, ins[0].len)?, lse))
    }

    /// `(dq, dk, dv)`, each in the activation dtype, shaped as `q`, `k`, `v`.
    pub(crate) fn plugin_backward(
        &self,
        op: &'static str,
        kernel: &dyn DeviceAttentionKernel,
        dims: &AttnDims,
        mask: &BlockMask,
        scale: f32,
        ins: BwdIn<'_>,
    ) -> Result<(Out, Out, Out)> {
        let setup = self.plugin_setup(op, kernel, true, dims, mask)?;
        let mut wide = Vec::with_capacity(6);
        for s in ins {
            wide.push(self.widen(op, s)?);
        }
        let (nq, nk) = (ins[0].len, ins[1].len);
        let mut dq = self.alloc_f32(op, nq)?;
        let mut dk = self.alloc_f32(op, nk)?;
        let mut dv = self.alloc_f32(op, nk)?;
        if nq > 0 {
            let s = &self.stream;
            let p: Vec<_> = wide.iter().map(|b| b.get().device_ptr(s)).collect();
            let (pdq, pdk, pdv) = (
                dq.device_ptr_mut(s),
                dk.device_ptr_mut(s),
                dv.device_ptr_mut(s),
            );
            let (shared, _guards) = self.device_call(dims, mask, scale, &setup);
            let call = DeviceAttnBackward {
                call: shared,
                q: p[0].0,
                k: p[1].0,
                v: p[2].0,
                out: p[3].0,
                lse: p[4].0,
                d_out: p[5].0,
                dq: pdq.0,
                dk: pdk.0,
                dv: pdv.0,
            };
            // SAFETY: as in plugin_forward.
            unsafe { kernel.backward(&call) }.map_err(|e| self.plugin_err(op, kernel, e))?;
        } else {
            // No query sees any key: their gradients are zero by definition.
            self.fill(op, &mut dk, nk, 0.0)?;
            self.fill(op, &mut dv, nk, 0.0)?;
        }
        Ok((
            self.in_activations(op, dq, nq)?,
            self.in_activations(op, dk, nk)?,
            self.in_activations(op, dv, nk)?,
        ))
    }

    /// An f32 result of `n` elements in the activation dtype (rounded once when bf16).
    fn in_activations(&self, op: &'static str, buf: CudaSlice<u8>, n: usize) -> Result<Out> {
        match self.opts.activations {
            DType::F32 => Ok((buf, DType::F32)),
            to => Ok((self.converted(op, &buf, n, to)?, to)),
        }
    }
}
