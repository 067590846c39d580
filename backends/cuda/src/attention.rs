//! Attention over a block-sparse mask: the device kernel `"cuda-simple"`
//! (`kernels/attention_simple.cu`), the bf16 flash kernel `"cuda-flash"` (`kernels/attention.cu`,
//! see [`crate::flash`]), a CUDA plugin on this backend's memory and stream
//! ([`crate::plugin_attention`]) or, by name, any registered host kernel through a host round
//! trip.
//!
//! Layouts as in `dflash_core::ops::attention`: `q (Tq, Hq, D)`, `k`/`v (Tk, Hkv, D)`,
//! `out (Tq, Hq, D)`, `lse (Tq, Hq)`. The mask goes to the device as its four i32 interval
//! arrays. The backward's dk/dv pass walks, for each key, the query rows that see it, as runs
//! of consecutive rows ([`key_query_runs`]); so every output element has exactly one writer
//! (no atomics) and the result is bit-deterministic.

use std::collections::BTreeMap;

use dflash_core::mask::BlockMask;
use dflash_core::registry::DeviceAttentionKernelRegistration;
use dflash_core::{
    AttentionOps, AttnBackward, AttnDims, AttnForward, Error, HostAttentionKernel, Result, Tensor,
};

use crate::flash::Tagged;
use crate::kernels::pick;
use crate::storage::{DType, f32_bytes};
use crate::{AttnImpl, CudaBackend, warp_items};
use cudarc::driver::{CudaSlice, PushKernelArg};

/// The plain f32 device kernel's name.
pub(crate) const SIMPLE: &str = "cuda-simple";
/// The tuned bf16 flash kernel's name.
pub(crate) const FLASH: &str = "cuda-flash";

/// Device attention kernels of this backend, selectable by name (registered below, so the
/// registry lists them as [`dflash_core::registry::device_attention_kernel_names`]`("cuda")`).
pub const DEVICE_ATTENTION_KERNELS: &[&str] = &[SIMPLE, FLASH];

inventory::submit! {
    DeviceAttentionKernelRegistration {
        backend: "cuda",
        name: SIMPLE,
        description: "one warp per (query row, head), f32, online softmax over the row's intervals; \
                      atomics-free backward",
    }
}

inventory::submit! {
    DeviceAttentionKernelRegistration {
        backend: "cuda",
        name: FLASH,
        description: "tuned bf16 block-sparse flash attention (head_dim 64/128/256; wgmma on Hopper, \
                      mma.sync elsewhere)",
    }
}

/// Largest head dim of `cuda-simple` (32 lanes x 8 registers).
const SIMPLE_MAX_HEAD_DIM: usize = 256;

/// For every key `j`, the query rows that see it, as half-open runs of consecutive rows:
/// returns `(offsets (Tk + 1), run_start, run_end)` in CSR form, runs ascending.
///
/// A sweep over keys maintains the set of rows whose interval covers the current key as a
/// map of maximal runs (start -> end), updated by one insertion when a row's interval opens
/// and one removal when it closes: `O((Tq + Tk) log Tq + total runs)`. DFlash, causal,
/// document and sliding masks give one or two runs per key (sliding DFlash: one per block).
pub fn key_query_runs(mask: &BlockMask) -> (Vec<i32>, Vec<i32>, Vec<i32>) {
    let (tq, tk) = (mask.q_len(), mask.kv_len());
    // Bucket interval openings and closings by key (counting sort).
    let mut open: Vec<Vec<i32>> = vec![Vec::new(); tk + 1];
    let mut close: Vec<Vec<i32>> = vec![Vec::new(); tk + 1];
    for i in 0..tq {
        for iv in mask.row(i) {
            if !iv.is_empty() {
                open[iv.start as usize].push(i as i32);
                close[iv.end as usize].push(i as i32);
            }
        }
    }
    let mut runs: BTreeMap<i32, i32> = BTreeMap::new(); // start -> end (exclusive)
    let mut off = Vec::with_capacity(tk + 1);
    let (mut rs, mut re) = (Vec::new(), Vec::new());
    off.push(0);
    for j in 0..tk {
        for &r in &close[j] {
            // remove row r: split the run containing it
            let (&s, &e) = runs.range(..=r).next_back().expect("row r is in a run");
            runs.remove(&s);
            if s < r {
                runs.insert(s, r);
            }
            if r + 1 < e {
                runs.insert(r + 1, e);
            }
        }
        for &r in &open[j] {
            // insert row r: merge with a run ending at r and one starting at r + 1
            let mut s = r;
            let mut e = r + 1;
            if let Some((&ps, &pe)) = runs.range(..r).next_back()
                && pe == r
            {
                s = ps;
                runs.remove(&ps);
            }
            if let Some(ne) = runs.remove(&(r + 1)) {
                e = ne;
            }
            runs.insert(s, e);
        }
        for (&s, &e) in &runs {
            rs.push(s);
            re.push(e);
        }
        off.push(rs.len() as i32);
    }
    (off, rs, re)
}

impl CudaBackend {
    /// An attention operand, any dtype: `cuda-flash` takes bf16 as it is and rounds f32 to
    /// bf16; host kernels get downloads (bf16 widened); `cuda-simple` reads either (its kernels
    /// are instantiated per (output, input) dtype; a call with mixed input dtypes widens its
    /// bf16 inputs exactly first).
    fn attn_in<'a>(&self, op: &'static str, t: &'a Tensor) -> Result<&'a crate::CudaStorage> {
        self.any(op, t)
    }

    /// Checks `q (Tq, Hq, D)`, `k`/`v (Tk, Hkv, D)` and builds the dims.
    fn attn_dims(
        &self,
        op: &'static str,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: &BlockMask,
    ) -> Result<AttnDims> {
        AttnDims::of_tensors(q, k, v, mask).map_err(|e| self.shape_err(op, e))
    }

    fn kernel_err(&self, op: &'static str, e: String) -> Error {
        Error::op(
            op,
            self.tag.clone(),
            format!("attention kernel {:?} failed: {e}", self.attention_name),
        )
    }

    /// What the device kernel supports, as the kernel-failure message the reference gives.
    fn simple_supports(&self, op: &'static str, dims: &AttnDims) -> Result<()> {
        if dims.q_heads == 0 || dims.head_dim == 0 {
            return Err(self.kernel_err(
                op,
                format!(
                    "q_heads ({}) and head_dim ({}) must be >= 1",
                    dims.q_heads, dims.head_dim
                ),
            ));
        }
        if dims.head_dim > SIMPLE_MAX_HEAD_DIM {
            return Err(self.kernel_err(
                op,
                format!(
                    "head_dim {} is larger than {SIMPLE_MAX_HEAD_DIM}",
                    dims.head_dim
                ),
            ));
        }
        Ok(())
    }

    fn upload_f32(&self, op: &'static str, data: &[f32], shape: &[usize]) -> Result<Tensor> {
        let mut buf = self.alloc_f32(op, data.len())?;
        if !data.is_empty() {
            self.stream
                .memcpy_htod(f32_bytes(data), &mut buf)
                .map_err(|e| self.drv(op, e))?;
        }
        Ok(self.tensor(buf, DType::F32, shape))
    }
}

impl AttentionOps for CudaBackend {
    fn attention(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: &BlockMask,
        scale: f32,
    ) -> Result<(Tensor, Tensor)> {
        use dflash_core::MemoryOps;
        let op = "attention";
        let dims = self.attn_dims(op, q, k, v, mask)?;
        let (qs, ks, vs) = (
            self.attn_in(op, q)?,
            self.attn_in(op, k)?,
            self.attn_in(op, v)?,
        );
        let nl = dims.q_rows * dims.q_heads;
        match &self.attention {
            AttnImpl::Host(kernel) => {
                let (qh, kh, vh) = (self.download(q)?, self.download(k)?, self.download(v)?);
                let mut out = vec![f32::NAN; qh.len()];
                let mut lse = vec![f32::NAN; nl];
                AttnForward::new(&dims, mask, scale, [&qh, &kh, &vh], [&mut out, &mut lse])
                    .and_then(|call| kernel.forward(call))
                    .map_err(|e| self.kernel_err(op, e))?;
                Ok((
                    self.upload_f32(op, &out, q.dims())?,
                    self.upload_f32(op, &lse, &[dims.q_rows, dims.q_heads])?,
                ))
            }
            AttnImpl::Device(kernel) => {
                let (out, lse) =
                    self.plugin_forward(op, kernel.as_ref(), &dims, mask, scale, [qs, ks, vs])?;
                Ok((
                    self.tensor(out.0, out.1, q.shape().clone()),
                    self.tensor(lse, DType::F32, [dims.q_rows, dims.q_heads]),
                ))
            }
            AttnImpl::Flash => {
                let (out, lse) = self.flash_forward(op, &dims, qs, ks, vs, mask, scale)?;
                Ok((
                    self.tensor(out.0, out.1, q.shape().clone()),
                    self.tensor(lse, DType::F32, [dims.q_rows, dims.q_heads]),
                ))
            }
            AttnImpl::Simple => self.simple_forward(op, &dims, [qs, ks, vs], mask, scale),
        }
    }

    /// `cuda-simple`'s forward whatever kernel `attention` dispatches to: one warp per
    /// (query row, head) walking that row's own intervals, the schedule this op asks for.
    fn attention_rows(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: &BlockMask,
        scale: f32,
    ) -> Result<Tensor> {
        let op = "attention_rows";
        let dims = self.attn_dims(op, q, k, v, mask)?;
        let ins = [self.any(op, q)?, self.any(op, k)?, self.any(op, v)?];
        Ok(self.simple_forward(op, &dims, ins, mask, scale)?.0)
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
        let (qs, ks, vs) = (
            self.attn_in(op, q)?,
            self.attn_in(op, k)?,
            self.attn_in(op, v)?,
        );
        let (os, ls, dos) = (
            self.attn_in(op, out)?,
            self.f32s(op, lse)?,
            self.attn_in(op, d_out)?,
        );
        let (dq, dk, dv) = match &self.attention {
            AttnImpl::Host(kernel) => {
                let ins = [q, k, v, out, lse, d_out];
                return self.host_backward(op, kernel.as_ref(), &dims, ins, mask, scale);
            }
            AttnImpl::Device(kernel) => self.plugin_backward(
                op,
                kernel.as_ref(),
                &dims,
                mask,
                scale,
                [qs, ks, vs, os, ls, dos],
            )?,
            AttnImpl::Flash => {
                self.flash_backward(op, &dims, qs, ks, vs, os, &ls.buf, dos, mask, scale)?
            }
            AttnImpl::Simple => {
                self.simple_backward(op, &dims, [qs, ks, vs, os, ls, dos], mask, scale)?
            }
        };
        Ok((
            self.tensor(dq.0, dq.1, q.shape().clone()),
            self.tensor(dk.0, dk.1, k.shape().clone()),
            self.tensor(dv.0, dv.1, v.shape().clone()),
        ))
    }
}

impl CudaBackend {
    /// The `cuda-simple` forward: `(out (Tq, Hq, D), lse (Tq, Hq))`.
    fn simple_forward(
        &self,
        op: &'static str,
        dims: &AttnDims,
        [qs, ks, vs]: [&crate::storage::CudaStorage; 3],
        mask: &BlockMask,
        scale: f32,
    ) -> Result<(Tensor, Tensor)> {
        let nl = dims.q_rows * dims.q_heads;
        self.simple_supports(op, dims)?;
        let od = self.opts.activations;
        let mut out = self.alloc(op, qs.len, od)?;
        let mut lse = self.alloc_f32(op, nl)?;
        if nl > 0 {
            let (id, [qb, kb, vb]) = self.uniform(op, [qs, ks, vs])?;
            let [f0, f1, s0, s1] = self.upload_mask(op, mask)?;
            let (tq, hq, hkv, d) = (
                dims.q_rows as i32,
                dims.q_heads as i32,
                dims.kv_heads as i32,
                dims.head_dim as i32,
            );
            let kn = self.k();
            let f = pick(
                &[
                    &kn.attn_fwd_ff,
                    &kn.attn_fwd_fb,
                    &kn.attn_fwd_bf,
                    &kn.attn_fwd_bb,
                ],
                &[od, id],
            );
            let mut l = self.stream.launch_builder(f);
            l.arg(qb.get())
                .arg(kb.get())
                .arg(vb.get())
                .arg(&*f0)
                .arg(&*f1)
                .arg(&*s0)
                .arg(&*s1)
                .arg(&mut out)
                .arg(&mut lse)
                .arg(&tq)
                .arg(&hq)
                .arg(&hkv)
                .arg(&d)
                .arg(&scale);
            self.launch(op, l, warp_items(nl))?;
        }
        Ok((
            self.tensor(out, od, [dims.q_rows, dims.q_heads, dims.head_dim]),
            self.tensor(lse, DType::F32, [dims.q_rows, dims.q_heads]),
        ))
    }

    /// A registered host kernel's backward through a host round trip: `(dq, dk, dv)` f32
    /// tensors shaped as `q`, `k`, `v`.
    fn host_backward(
        &self,
        op: &'static str,
        kernel: &dyn HostAttentionKernel,
        dims: &AttnDims,
        [q, k, v, out, lse, d_out]: [&Tensor; 6],
        mask: &BlockMask,
        scale: f32,
    ) -> Result<(Tensor, Tensor, Tensor)> {
        use dflash_core::MemoryOps;
        let (qh, kh, vh) = (self.download(q)?, self.download(k)?, self.download(v)?);
        let (oh, lh, doh) = (
            self.download(out)?,
            self.download(lse)?,
            self.download(d_out)?,
        );
        let mut dq = vec![f32::NAN; qh.len()];
        let mut dk = vec![f32::NAN; kh.len()];
        let mut dv = vec![f32::NAN; vh.len()];
        AttnBackward::new(
            dims,
            mask,
            scale,
            [&qh, &kh, &vh, &oh, &lh, &doh],
            [&mut dq, &mut dk, &mut dv],
        )
        .and_then(|call| kernel.backward(call))
        .map_err(|e| self.kernel_err(op, e))?;
        Ok((
            self.upload_f32(op, &dq, q.dims())?,
            self.upload_f32(op, &dk, k.dims())?,
            self.upload_f32(op, &dv, v.dims())?,
        ))
    }

    /// The `cuda-simple` backward: `(dq, dk, dv)` buffers in the activation dtype.
    fn simple_backward(
        &self,
        op: &'static str,
        dims: &AttnDims,
        [qs, ks, vs, os, ls, dos]: [&crate::storage::CudaStorage; 6],
        mask: &BlockMask,
        scale: f32,
    ) -> Result<(Tagged, Tagged, Tagged)> {
        self.simple_supports(op, dims)?;
        let nl = dims.q_rows * dims.q_heads;
        let nk = dims.kv_rows * dims.kv_heads;
        let od = self.opts.activations;
        let mut dq = self.alloc(op, qs.len, od)?;
        let mut dk = self.alloc(op, ks.len, od)?;
        let mut dv = self.alloc(op, vs.len, od)?;
        let (id, [qb, kb, vb, ob, dob]) = self.uniform(op, [qs, ks, vs, os, dos])?;
        let ins = SimpleBackwardIns {
            id,
            od,
            q: qb.get(),
            k: kb.get(),
            v: vb.get(),
            out: ob.get(),
            d_out: dob.get(),
            lse: &ls.buf,
            tq: dims.q_rows as i32,
            tk: dims.kv_rows as i32,
            hq: dims.q_heads as i32,
            hkv: dims.kv_heads as i32,
            d: dims.head_dim as i32,
            scale,
        };
        let mut dsum = self.alloc_f32(op, nl)?;
        if nl > 0 {
            self.simple_backward_dq(op, &ins, nl, mask, &mut dsum, &mut dq)?;
        }
        if nk > 0 {
            self.simple_backward_dkdv(op, &ins, nk, mask, &dsum, [&mut dk, &mut dv])?;
        }
        Ok(((dq, od), (dk, od), (dv, od)))
    }

    /// The `cuda-simple` backward's query pass: `dsum (Tq, Hq) = d_out . out` (the key pass
    /// reads it too), then `dq`, one warp per (query row, head).
    fn simple_backward_dq(
        &self,
        op: &'static str,
        ins: &SimpleBackwardIns<'_>,
        nl: usize,
        mask: &BlockMask,
        dsum: &mut CudaSlice<u8>,
        dq: &mut CudaSlice<u8>,
    ) -> Result<()> {
        let kn = self.k();
        let (id, od) = (ins.id, ins.od);
        let (rows64, d32) = (nl as i64, ins.d);
        let f = pick(&[&kn.attn_bwd_dsum_f, &kn.attn_bwd_dsum_b], &[id]);
        let mut l = self.stream.launch_builder(f);
        l.arg(ins.out)
            .arg(ins.d_out)
            .arg(&mut *dsum)
            .arg(&rows64)
            .arg(&d32);
        self.launch(op, l, warp_items(nl))?;

        let [f0, f1, s0, s1] = self.upload_mask(op, mask)?;
        let f = pick(
            &[
                &kn.attn_bwd_dq_ff,
                &kn.attn_bwd_dq_fb,
                &kn.attn_bwd_dq_bf,
                &kn.attn_bwd_dq_bb,
            ],
            &[od, id],
        );
        let mut l = self.stream.launch_builder(f);
        l.arg(ins.q)
            .arg(ins.k)
            .arg(ins.v)
            .arg(ins.d_out)
            .arg(ins.lse)
            .arg(&*dsum)
            .arg(&*f0)
            .arg(&*f1)
            .arg(&*s0)
            .arg(&*s1)
            .arg(dq)
            .arg(&ins.tq)
            .arg(&ins.hq)
            .arg(&ins.hkv)
            .arg(&ins.d)
            .arg(&ins.scale);
        self.launch(op, l, warp_items(nl))
    }

    /// The `cuda-simple` backward's key pass: `dk` and `dv`, one warp per (key row, kv head)
    /// walking the runs of query rows that see the key ([`key_query_runs`]).
    fn simple_backward_dkdv(
        &self,
        op: &'static str,
        ins: &SimpleBackwardIns<'_>,
        nk: usize,
        mask: &BlockMask,
        dsum: &CudaSlice<u8>,
        [dk, dv]: [&mut CudaSlice<u8>; 2],
    ) -> Result<()> {
        let kn = self.k();
        let (off, rs, re) = key_query_runs(mask);
        let off = self.upload_i32(op, &off)?;
        let rs = self.upload_i32(op, &rs)?;
        let re = self.upload_i32(op, &re)?;
        let f = pick(
            &[
                &kn.attn_bwd_dkdv_ff,
                &kn.attn_bwd_dkdv_fb,
                &kn.attn_bwd_dkdv_bf,
                &kn.attn_bwd_dkdv_bb,
            ],
            &[ins.od, ins.id],
        );
        let mut l = self.stream.launch_builder(f);
        l.arg(ins.q)
            .arg(ins.k)
            .arg(ins.v)
            .arg(ins.d_out)
            .arg(ins.lse)
            .arg(dsum)
            .arg(&off)
            .arg(&rs)
            .arg(&re)
            .arg(dk)
            .arg(dv)
            .arg(&ins.tk)
            .arg(&ins.hq)
            .arg(&ins.hkv)
            .arg(&ins.d)
            .arg(&ins.scale);
        self.launch(op, l, warp_items(nk))
    }
}

/// What both passes of the `cuda-simple` backward read: the kernels' dtype instantiation, the
/// inputs (in one dtype, after [`CudaBackend::uniform`]), the forward's lse and the kernels'
/// `int` sizes.
struct SimpleBackwardIns<'a> {
    /// The inputs' dtype.
    id: DType,
    /// The outputs' dtype (the activations).
    od: DType,
    q: &'a CudaSlice<u8>,
    k: &'a CudaSlice<u8>,
    v: &'a CudaSlice<u8>,
    out: &'a CudaSlice<u8>,
    d_out: &'a CudaSlice<u8>,
    /// f32 (Tq, Hq).
    lse: &'a CudaSlice<u8>,
    tq: i32,
    tk: i32,
    hq: i32,
    hkv: i32,
    d: i32,
    scale: f32,
}
