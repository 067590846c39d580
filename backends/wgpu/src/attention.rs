//! Attention over a block-sparse mask: any registered host kernel through a host round trip
//! (correct, slow: for conformance checks), and the WGSL kernel `wgpu-tiled` ([`tiled`]:
//! head dims 1..=256, GQA, every mask kind, work proportional to the visible tiles). q, k, v
//! may be f16 (the compute format): the round trip widens them on the host, `wgpu-tiled`
//! into f32 copies on the device first (its kernels read f32, staged in workgroup memory).

mod lists;
mod plan;
mod run;
mod tiled;

pub(crate) use lists::MetaCache;
pub(crate) use tiled::AttnCfg;
#[cfg(test)]
pub(crate) use tiled::AttnKind;

use dflash_core::mask::BlockMask;
use dflash_core::registry::{DeviceAttentionKernelRegistration, create_attention};
use dflash_core::{
    AttentionKernel, AttentionOps, AttnBackward, AttnDims, AttnForward, Error, HostAttentionKernel,
    Result, Tensor,
};

use crate::WgpuBackend;
use crate::storage::{storage, storage_any};

/// The block-sparse WGSL kernel.
pub const TILED: &str = "wgpu-tiled";

/// The attention kernels of this backend.
pub const WGPU_ATTENTION_KERNELS: [&str; 1] = [TILED];

inventory::submit! {
    DeviceAttentionKernelRegistration {
        backend: "wgpu",
        name: TILED,
        description: "block-sparse tiled attention in WGSL over the compact mask (f32)",
    }
}

pub(crate) enum AttnImpl {
    Tiled,
    /// A host kernel from the registry, run through a host round trip.
    Host(Box<dyn HostAttentionKernel>),
}

/// The kernel named `name`: this backend's own, or a registered host kernel.
pub(crate) fn resolve(name: &str) -> Result<AttnImpl> {
    if name == TILED {
        return Ok(AttnImpl::Tiled);
    }
    match create_attention(name) {
        Ok(AttentionKernel::Host(k)) => Ok(AttnImpl::Host(k)),
        Ok(AttentionKernel::Device(k)) => Err(Error::op(
            "attention kernel",
            "wgpu",
            format!(
                "{name:?} (kernel {:?}) runs on {} device memory, not on wgpu buffers; \
                 choose {TILED:?} or a host kernel",
                k.name(),
                k.device()
            ),
        )),
        Err(Error::UnknownName { available, .. }) => {
            let mut all: Vec<String> = WGPU_ATTENTION_KERNELS.map(str::to_string).to_vec();
            all.extend(
                available
                    .into_iter()
                    .map(|h| format!("{h} (host round trip)")),
            );
            Err(Error::UnknownName {
                kind: "attention kernel",
                name: name.to_string(),
                available: all,
            })
        }
        Err(e) => Err(e),
    }
}

impl WgpuBackend {
    /// The tensors on the host, widened to f32; the first `any` of them may be f16.
    fn download_all(&self, op: &'static str, ts: &[&Tensor], any: usize) -> Result<Vec<Vec<f32>>> {
        ts.iter()
            .enumerate()
            .map(|(i, t)| {
                let s = if i < any {
                    storage_any(op, &self.ctx, t)?
                } else {
                    storage(op, &self.ctx, t)?
                };
                self.ctx.download_as(&s.buf, s.dtype, s.len)
            })
            .collect()
    }

    fn kernel_err(&self, op: &'static str, e: String) -> Error {
        self.err(
            op,
            format!("attention kernel {:?} failed: {e}", self.attention_name),
        )
    }
}

impl AttentionOps for WgpuBackend {
    fn attention(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: &BlockMask,
        scale: f32,
    ) -> Result<(Tensor, Tensor)> {
        let op = "attention";
        let dims = AttnDims::of_tensors(q, k, v, mask).map_err(|e| self.shape_err(op, e))?;
        let kernel = match &self.attention {
            AttnImpl::Host(kernel) => kernel,
            AttnImpl::Tiled => {
                // f16 q, k, v (the compute format) are widened into f32 copies first: the
                // tiled kernel reads f32.
                let (mut wq, mut wk, mut wv) = (None, None, None);
                let qs = self.widened(op, storage_any(op, &self.ctx, q)?, &mut wq)?;
                let ks = self.widened(op, storage_any(op, &self.ctx, k)?, &mut wk)?;
                let vs = self.widened(op, storage_any(op, &self.ctx, v)?, &mut wv)?;
                let out = self.out(op, qs.len)?;
                let lse = self.out(op, dims.q_rows * dims.q_heads)?;
                self.tiled_forward(op, &dims, mask, scale, [qs, ks, vs], &out, &lse)?;
                return Ok((
                    self.tensor(out, q.dims()),
                    self.tensor(lse, [dims.q_rows, dims.q_heads]),
                ));
            }
        };
        let host = self.download_all(op, &[q, k, v], 3)?;
        let mut out = vec![f32::NAN; host[0].len()];
        let mut lse = vec![f32::NAN; dims.q_rows * dims.q_heads];
        let call = AttnForward::new(
            &dims,
            mask,
            scale,
            [&host[0], &host[1], &host[2]],
            [&mut out, &mut lse],
        )
        .map_err(|e| self.kernel_err(op, e))?;
        kernel.forward(call).map_err(|e| self.kernel_err(op, e))?;
        Ok((
            self.upload_named(op, &out, q.dims())?,
            self.upload_named(op, &lse, &[dims.q_rows, dims.q_heads])?,
        ))
    }

    fn attention_backward(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &Tensor,
        lse: &Tensor,
        d_out: &Tensor,
        mask: &BlockMask,
        scale: f32,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        let op = "attention_backward";
        let dims = AttnDims::of_backward(q, k, v, out, lse, d_out, mask)
            .map_err(|e| self.shape_err(op, e))?;
        let kernel = match &self.attention {
            AttnImpl::Host(kernel) => kernel,
            AttnImpl::Tiled => {
                // Any input may be in the compute format (a benchmark's inputs are): the
                // kernel reads f32, so f16 ones are widened first.
                let (mut wq, mut wk, mut wv, mut wo, mut wd) = (None, None, None, None, None);
                let ins = [
                    self.widened(op, storage_any(op, &self.ctx, q)?, &mut wq)?,
                    self.widened(op, storage_any(op, &self.ctx, k)?, &mut wk)?,
                    self.widened(op, storage_any(op, &self.ctx, v)?, &mut wv)?,
                    self.widened(op, storage_any(op, &self.ctx, out)?, &mut wo)?,
                    storage(op, &self.ctx, lse)?,
                    self.widened(op, storage_any(op, &self.ctx, d_out)?, &mut wd)?,
                ];
                let dq = self.out(op, ins[0].len)?;
                let dk = self.out(op, ins[1].len)?;
                let dv = self.out(op, ins[2].len)?;
                self.tiled_backward(op, &dims, mask, scale, ins, [&dq, &dk, &dv])?;
                return Ok((
                    self.tensor(dq, q.dims()),
                    self.tensor(dk, k.dims()),
                    self.tensor(dv, v.dims()),
                ));
            }
        };
        let h = self.download_all(op, &[q, k, v, out, lse, d_out], 6)?;
        let mut dq = vec![f32::NAN; h[0].len()];
        let mut dk = vec![f32::NAN; h[1].len()];
        let mut dv = vec![f32::NAN; h[2].len()];
        let call = AttnBackward::new(
            &dims,
            mask,
            scale,
            [&h[0], &h[1], &h[2], &h[3], &h[4], &h[5]],
            [&mut dq, &mut dk, &mut dv],
        )
        .map_err(|e| self.kernel_err(op, e))?;
        kernel.backward(call).map_err(|e| self.kernel_err(op, e))?;
        Ok((
            self.upload_named(op, &dq, q.dims())?,
            self.upload_named(op, &dk, k.dims())?,
            self.upload_named(op, &dv, v.dims())?,
        ))
    }
}

impl WgpuBackend {
    fn upload_named(&self, op: &'static str, data: &[f32], shape: &[usize]) -> Result<Tensor> {
        Ok(self.tensor(self.ctx.upload_f32(op, data)?, shape))
    }
}
