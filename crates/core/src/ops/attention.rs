//! Attention over a block-sparse mask, and the kernel seam behind it.
//!
//! Layouts (fixed, documented, shared with the future C ABI):
//! - `q (Tq, Hq, D)`, `k`/`v (Tk, Hkv, D)`, row-major; GQA: query head `h` uses kv head
//!   `h / (Hq / Hkv)`.
//! - `out (Tq, Hq, D)`, `lse (Tq, Hq)` natural-log log-sum-exp of the scaled scores;
//!   a row with no visible key has `out = 0` and `lse = -inf`.

use crate::mask::BlockMask;
use crate::{Result, Tensor};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnDims {
    pub q_rows: usize,
    pub kv_rows: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl AttnDims {
    pub fn group(&self) -> usize {
        self.q_heads / self.kv_heads.max(1)
    }
    /// The dims of `q (Tq, Hq, D)`, `k`/`v (Tk, Hkv, D)` checked against each other and the
    /// mask; the error message (names the shapes) is what every backend reports.
    pub fn of_tensors(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: &BlockMask,
    ) -> std::result::Result<Self, String> {
        let (qd, kd) = (q.dims(), k.dims());
        if k.dims() != v.dims() {
            return Err(format!(
                "k {:?} and v {:?} differ in shape",
                k.shape(),
                v.shape()
            ));
        }
        if qd.len() != 3 || kd.len() != 3 || qd[2] != kd[2] {
            return Err(format!(
                "q {:?} must be (Tq, Hq, D) and k/v {:?} (Tk, Hkv, D)",
                q.shape(),
                k.shape()
            ));
        }
        let dims = AttnDims {
            q_rows: qd[0],
            kv_rows: kd[0],
            q_heads: qd[1],
            kv_heads: kd[1],
            head_dim: qd[2],
        };
        dims.validate(mask)
            .map_err(|e| format!("q {:?}, k/v {:?}: {e}", q.shape(), k.shape()))?;
        Ok(dims)
    }

    /// As [`Self::of_tensors`], for a backward call: `out` and `d_out` shaped like `q`, and
    /// `lse` holding `Tq * Hq` values.
    pub fn of_backward(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        out: &Tensor,
        lse: &Tensor,
        d_out: &Tensor,
        mask: &BlockMask,
    ) -> std::result::Result<Self, String> {
        let dims = Self::of_tensors(q, k, v, mask)?;
        for (what, t) in [("out and q", out), ("d_out and q", d_out)] {
            if t.dims() != q.dims() {
                return Err(format!("{what}: {:?} vs {:?}", t.shape(), q.shape()));
            }
        }
        if lse.numel() != dims.q_rows * dims.q_heads {
            return Err(format!(
                "lse {:?} but q {:?} needs ({}, {})",
                lse.shape(),
                q.shape(),
                dims.q_rows,
                dims.q_heads
            ));
        }
        Ok(dims)
    }

    /// Checks the dims against the mask and slice lengths of a call.
    pub fn validate(&self, mask: &BlockMask) -> std::result::Result<(), String> {
        if self.kv_heads == 0 || !self.q_heads.is_multiple_of(self.kv_heads) {
            return Err(format!(
                "q_heads {} is not a multiple of kv_heads {}",
                self.q_heads, self.kv_heads
            ));
        }
        if mask.q_len() != self.q_rows || mask.kv_len() != self.kv_rows {
            return Err(format!(
                "mask is {}x{} but q has {} rows and k/v {}",
                mask.q_len(),
                mask.kv_len(),
                self.q_rows,
                self.kv_rows
            ));
        }
        Ok(())
    }
}

/// Which shape a host kernel's slice has: `(Tq, Hq, D)`, `(Tk, Hkv, D)` or `(Tq, Hq)`.
#[derive(Debug, Clone, Copy)]
enum HostBuf {
    Q,
    Kv,
    Lse,
}

/// A host kernel call's slices in [`AttnBackward::new`]'s order; a forward has the first five.
const HOST_BUFS: [(HostBuf, &str); 9] = [
    (HostBuf::Q, "q"),
    (HostBuf::Kv, "k"),
    (HostBuf::Kv, "v"),
    (HostBuf::Q, "out"),
    (HostBuf::Lse, "lse"),
    (HostBuf::Q, "d_out"),
    (HostBuf::Q, "dq"),
    (HostBuf::Kv, "dk"),
    (HostBuf::Kv, "dv"),
];

/// The element counts of a host attention kernel's slices, from [`AttnDims::host_lens`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostAttnLens {
    dims: AttnDims,
    /// `Tq * Hq * D`.
    pub q: usize,
    /// `Tk * Hkv * D`.
    pub kv: usize,
    /// `Tq * Hq`.
    pub lse: usize,
}

impl HostAttnLens {
    /// The error names the slice, its length and the shape it must have.
    fn check(&self, lens: &[usize]) -> std::result::Result<(), String> {
        let d = &self.dims;
        for (&(buf, name), &got) in HOST_BUFS.iter().zip(lens) {
            let (want, shape) = match buf {
                HostBuf::Q => (
                    self.q,
                    format!("(Tq {}, Hq {}, D {})", d.q_rows, d.q_heads, d.head_dim),
                ),
                HostBuf::Kv => (
                    self.kv,
                    format!("(Tk {}, Hkv {}, D {})", d.kv_rows, d.kv_heads, d.head_dim),
                ),
                HostBuf::Lse => (self.lse, format!("(Tq {}, Hq {})", d.q_rows, d.q_heads)),
            };
            if got != want {
                return Err(format!(
                    "{name} has {got} elements, expected {want} = {shape}"
                ));
            }
        }
        Ok(())
    }
}

impl AttnDims {
    /// The buffer sizes of a host kernel call: `self` checked against the mask
    /// ([`Self::validate`]) and for at least one query head and head dimension, the products
    /// computed overflow-safe, so absurd dims are an `Err`, never a panic.
    pub fn host_lens(&self, mask: &BlockMask) -> std::result::Result<HostAttnLens, String> {
        self.validate(mask)?;
        if self.q_heads == 0 || self.head_dim == 0 {
            return Err(format!(
                "q_heads ({}) and head_dim ({}) must be >= 1",
                self.q_heads, self.head_dim
            ));
        }
        let size = |what: &str, xs: &[usize]| {
            xs.iter()
                .try_fold(1usize, |acc, &x| acc.checked_mul(x))
                .ok_or_else(|| format!("{what} size {xs:?} overflows usize"))
        };
        Ok(HostAttnLens {
            dims: *self,
            q: size("q", &[self.q_rows, self.q_heads, self.head_dim])?,
            kv: size("k/v", &[self.kv_rows, self.kv_heads, self.head_dim])?,
            lse: size("lse", &[self.q_rows, self.q_heads])?,
        })
    }
}

/// What a forward reads (and its backward reads again): dims, mask, scale, `q`, `k`, `v`.
/// Part of a validated [`AttnForward`] / [`AttnBackward`]; kernels never build one.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct AttnInputs<'a> {
    pub dims: AttnDims,
    pub mask: &'a BlockMask,
    /// Multiplies `q.k` before the softmax.
    pub scale: f32,
    /// `(Tq, Hq, D)`.
    pub q: &'a [f32],
    /// `(Tk, Hkv, D)`.
    pub k: &'a [f32],
    /// `(Tk, Hkv, D)`.
    pub v: &'a [f32],
}

impl<'a> AttnInputs<'a> {
    /// Unchecked: for the constructors of the validated calls.
    fn of(dims: &AttnDims, mask: &'a BlockMask, scale: f32, [q, k, v]: [&'a [f32]; 3]) -> Self {
        AttnInputs {
            dims: *dims,
            mask,
            scale,
            q,
            k,
            v,
        }
    }
}

/// One forward call of a host attention kernel, its slice lengths checked against its dims
/// and mask. Only [`AttnForward::new`] builds one (the type is `non_exhaustive`), so a kernel
/// receives validated data and checks nothing but what is its own (e.g. supported dims).
/// Plain slices, dims and a scale: the shape of the future C ABI's call struct.
#[derive(Debug)]
#[non_exhaustive]
pub struct AttnForward<'a> {
    pub input: AttnInputs<'a>,
    /// `(Tq, Hq, D)`, fully overwritten.
    pub out: &'a mut [f32],
    /// `(Tq, Hq)`, fully overwritten.
    pub lse: &'a mut [f32],
}

impl<'a> AttnForward<'a> {
    /// Checks `dims` against the mask ([`AttnDims::host_lens`]: overflow-safe sizes) and the
    /// slices' lengths. The error names the slice, its length and the shape it must have.
    pub fn new(
        dims: &AttnDims,
        mask: &'a BlockMask,
        scale: f32,
        [q, k, v]: [&'a [f32]; 3],
        [out, lse]: [&'a mut [f32]; 2],
    ) -> std::result::Result<Self, String> {
        let lens = [q.len(), k.len(), v.len(), out.len(), lse.len()];
        dims.host_lens(mask)?.check(&lens)?;
        let input = AttnInputs::of(dims, mask, scale, [q, k, v]);
        Ok(AttnForward { input, out, lse })
    }
}

/// One backward call of a host attention kernel, checked like [`AttnForward`] and built only
/// by [`AttnBackward::new`].
#[derive(Debug)]
#[non_exhaustive]
pub struct AttnBackward<'a> {
    /// The forward's inputs.
    pub input: AttnInputs<'a>,
    /// The forward's `out`, `(Tq, Hq, D)`.
    pub out: &'a [f32],
    /// The forward's `lse`, `(Tq, Hq)`.
    pub lse: &'a [f32],
    /// `(Tq, Hq, D)`.
    pub d_out: &'a [f32],
    /// `(Tq, Hq, D)`, fully overwritten.
    pub dq: &'a mut [f32],
    /// `(Tk, Hkv, D)`, fully overwritten.
    pub dk: &'a mut [f32],
    /// `(Tk, Hkv, D)`, fully overwritten.
    pub dv: &'a mut [f32],
}

impl<'a> AttnBackward<'a> {
    /// As [`AttnForward::new`], for `[q, k, v, out, lse, d_out]` and `[dq, dk, dv]`.
    pub fn new(
        dims: &AttnDims,
        mask: &'a BlockMask,
        scale: f32,
        [q, k, v, out, lse, d_out]: [&'a [f32]; 6],
        [dq, dk, dv]: [&'a mut [f32]; 3],
    ) -> std::result::Result<Self, String> {
        let ins = [q, k, v, out, lse, d_out].map(<[f32]>::len);
        let outs = [dq.len(), dk.len(), dv.len()];
        dims.host_lens(mask)?
            .check(&[ins.as_slice(), &outs].concat())?;
        let input = AttnInputs::of(dims, mask, scale, [q, k, v]);
        Ok(AttnBackward {
            input,
            out,
            lse,
            d_out,
            dq,
            dk,
            dv,
        })
    }
}

/// An attention kernel over host memory (the reference backend and CPU plugins). It receives
/// calls validated by [`AttnForward::new`] / [`AttnBackward::new`]; outputs are fully
/// overwritten, and callers may poison them first to prove it.
pub trait HostAttentionKernel: Send + Sync {
    fn name(&self) -> &str;
    fn forward(&self, call: AttnForward<'_>) -> std::result::Result<(), String>;
    fn backward(&self, call: AttnBackward<'_>) -> std::result::Result<(), String>;
}

/// The backend-level op model code calls; the backend dispatches to its selected kernel.
pub trait AttentionOps {
    /// Returns `(out (Tq, Hq, D), lse (Tq, Hq))`.
    fn attention(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: &BlockMask,
        scale: f32,
    ) -> Result<(Tensor, Tensor)>;
    /// The `out` of [`Self::attention`], scheduled per query row: for calls whose query
    /// rows read unrelated key ranges, such as a decode step (one new row per sequence over
    /// that sequence's slot of a shared KV cache), where a kernel tiling query rows would
    /// visit the union of their keys. Same layouts, mask and semantics; forward only.
    fn attention_rows(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        mask: &BlockMask,
        scale: f32,
    ) -> Result<Tensor> {
        Ok(self.attention(q, k, v, mask, scale)?.0)
    }
    /// Returns `(dq, dk, dv)` shaped like `q`, `k`, `v`.
    #[allow(clippy::too_many_arguments)]
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
    ) -> Result<(Tensor, Tensor, Tensor)>;
}
