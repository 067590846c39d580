//! The device attention kernel `"cuda-flash"`: the bf16 block-sparse flash attention of
//! `kernels/attention.cu` (FA2/FA3-style: dK/dV per key tile, dQ through f32 reductions;
//! docs/kernel-lab-attention.md).
//!
//! Inputs (q, k, v, and the backward's out and d_out) are passed as [`FlashIn`]: an f32
//! buffer (`CudaSlice<u8>` of f32, rounded to bf16 with `f32_to_bf16`, round to nearest even,
//! before the kernel) or a [`CudaStorage`] of either dtype (a `DType::Bf16` storage goes to
//! the kernel as it is, no conversion; an f32 one is rounded). Outputs: out/dq/dk/dv are the
//! kernel's bf16 results, returned as they are with bf16 activations and widened to f32 with
//! `bf16_to_f32` otherwise; lse, `D_i` and the dq accumulator are f32. The forward's `out` is bf16-valued, so the backward's re-rounding of it is exact
//! (it sees the very values the forward produced).
//!
//! `attention.cu` is compiled (NVRTC) only when a backend selects `"cuda-flash"`: once per
//! device, cached in [`crate::device::Device`]. Architecture: `compute_90a` on compute
//! capability 9.0 (Hopper: the forward and the head_dim 64/128 backward use `wgmma`; the
//! head_dim-256 backward stays on `mma.sync`), else the device's `compute_XY` (everything on
//! `mma.sync`). The launch shapes come from the kernel itself (`attn_config`),
//! read once after loading.
//!
//! Launch summary (kernel signatures in `kernels/attention.cu`, cross-checked with
//! `lab/cuda/attention_lab.py`):
//!
//! | kernel | grid x block, dynamic smem | arguments |
//! |---|---|---|
//! | `attn_fwd_d{D}` | `ceil(Tq/fwd_BM)*Hq` x fwd_threads, fwd_smem | q k v fs fe ss se out lse Tq Tk Hq Hkv scale hgroup tm_q tm_k tm_v |
//! | `attn_bwd_pre_d{D}` | `ceil(Tq/64)*Hq` x 256, 0 | o dout fs fe ss se Di dq_accum summary Tq Hq |
//! | `attn_bwd_dkdv_d{D}` | `ceil(Tk/bwd_BN)*Hkv` x bwd_threads, bwd_smem | q k v dout lse Di summary fs fe ss se dq_accum dk dv Tq Tk Hq Hkv scale hgroup tm_q tm_do tm_dq |
//! | `attn_bwd_dq_convert` | `ceil(n/1024)` x 256, 0 | dq_accum dq n(i64) scale |
//!
//! Pointers are bf16 (`unsigned short*`) for q/k/v/out/dout/dk/dv/dq, f32 for lse/Di/dq_accum,
//! i32 for the mask arrays and the summaries; sizes are `int` except `n` (`long long`);
//! `tm_q`/`tm_do`/`tm_dq` are TMA tensor maps of q/dout/dq_accum ([`crate::tma::TensorMap`], by value), encoded
//! where `attn_config` says the backward reads them.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaSlice, DevicePtr, LaunchArgs, PushKernelArg, sys};
use dflash_core::mask::BlockMask;
use dflash_core::{AttnDims, Error, Result};

use crate::storage::{CudaStorage, DType};
use crate::tma::TensorMap;
use crate::{CudaBackend, launch_1d};

mod backward;
mod load;

pub(crate) use load::flash_arch;

/// Head dims `attention.cu` is instantiated for.
pub const FLASH_HEAD_DIMS: [usize; 3] = [64, 128, 256];

/// Kernels use `int` row indices and a `0x3fffffff` sentinel in the mask summaries; rows,
/// keys and row x head products must stay below it.
const MAX_ROWS: usize = 0x3fff_fffe;

/// An output buffer and the dtype of its elements.
pub(crate) type Tagged = (CudaSlice<u8>, DType);

/// An input of the flash kernels: an f32 buffer or a dtype-tagged storage (f32 or bf16).
pub(crate) trait FlashIn {
    /// The device buffer and the dtype of its elements.
    fn flash_buf(&self) -> (&CudaSlice<u8>, DType);
}

/// A bare buffer is f32 (what the backend's f32 tensors hold).
impl FlashIn for CudaSlice<u8> {
    fn flash_buf(&self) -> (&CudaSlice<u8>, DType) {
        (self, DType::F32)
    }
}

/// A storage carries its dtype: bf16 goes to the kernels unconverted.
impl FlashIn for CudaStorage {
    fn flash_buf(&self) -> (&CudaSlice<u8>, DType) {
        (&self.buf, self.dtype)
    }
}

/// A bf16 kernel operand: borrowed when the input already is bf16, else a rounded copy.
enum Bf16Buf<'a> {
    Borrowed(&'a CudaSlice<u8>),
    Owned(CudaSlice<u8>),
}

/// The sizes of one forward or backward call: element counts of the q-sized tensors (q, out,
/// d_out, dq: `nq`) and k/v-sized ones (`nk`), the (row, head) pairs of q (`nl`: lse, D_i),
/// and the kernels' `int` sizes. Built after [`CudaBackend::flash_variant`] has bounded the
/// dims, so the `int` casts are exact.
struct CallShape {
    nq: usize,
    nk: usize,
    nl: usize,
    /// Tq, Tk, Hq, Hkv.
    ints: [i32; 4],
}

impl CallShape {
    fn of(dims: &AttnDims) -> Self {
        CallShape {
            nq: dims.q_rows * dims.q_heads * dims.head_dim,
            nk: dims.kv_rows * dims.kv_heads * dims.head_dim,
            nl: dims.q_rows * dims.q_heads,
            ints: [dims.q_rows, dims.kv_rows, dims.q_heads, dims.kv_heads].map(|x| x as i32),
        }
    }
}

impl Bf16Buf<'_> {
    fn get(&self) -> &CudaSlice<u8> {
        match self {
            Bf16Buf::Borrowed(b) => b,
            Bf16Buf::Owned(b) => b,
        }
    }
}

/// Launch shapes and functions of one head dim.
pub(crate) struct FlashVariant {
    pub d: usize,
    fwd: CudaFunction,
    pre: CudaFunction,
    dkdv: CudaFunction,
    fwd_bm: u32,
    fwd_threads: u32,
    fwd_smem: u32,
    bwd_bn: u32,
    bwd_threads: u32,
    bwd_smem: u32,
    /// Query rows per preprocess CTA (one CTA per such tile and head) / summary tile (64).
    pre_rows: u32,
    /// Threads of the preprocess CTA (256).
    pre_threads: u32,
    /// The backward loads Q/dO through TMA tensor maps (the Hopper kernel).
    bwd_tma: bool,
    /// The forward loads Q/K/V through TMA tensor maps, K/V in boxes of this many rows (its key
    /// tile); 0: it ignores the maps.
    fwd_tma_bn: u32,
    /// The forward takes any number of (query tile, head) items per CTA: launch at most one
    /// CTA per SM (else one CTA per item).
    fwd_persist: bool,
    /// Why this head dim cannot run on this device (shared memory), if it cannot.
    unsupported: Option<String>,
}

/// `attention.cu` loaded on one device.
pub(crate) struct FlashKernels {
    variants: Vec<FlashVariant>,
    dq_convert: CudaFunction,
    /// Streaming multiprocessors of the device (the kernels' kv-head groups: [`head_group`]).
    sms: u32,
}

/// `ceil(a / b) * m` as a 1-D grid size, or an error when it does not fit.
fn grid(a: usize, b: u32, m: usize) -> Option<u32> {
    let g = a.div_ceil(b as usize).checked_mul(m)?;
    (g <= i32::MAX as usize).then_some(g as u32)
}

impl CudaBackend {
    /// The loaded `attention.cu` of this device (loaded on first use, then kept; a failure is
    /// kept too and reported every time).
    pub(crate) fn flash(&self, op: &'static str) -> Result<&FlashKernels> {
        let r = self
            .dev
            .flash
            .get_or_init(|| FlashKernels::load(&self.dev.ctx, &self.stream, self.dev.cc));
        r.as_ref().map_err(|e| {
            Error::op(
                op,
                self.tag.clone(),
                format!("attention kernel \"cuda-flash\" is unavailable: {e}"),
            )
        })
    }

    /// The variant for `dims`, after checking everything the kernels assume.
    fn flash_variant<'a>(
        &self,
        op: &'static str,
        fk: &'a FlashKernels,
        dims: &AttnDims,
    ) -> Result<&'a FlashVariant> {
        let err = |m: String| {
            Error::op(
                op,
                self.tag.clone(),
                format!("attention kernel \"cuda-flash\" failed: {m}"),
            )
        };
        let Some(v) = fk.variants.iter().find(|v| v.d == dims.head_dim) else {
            return Err(err(format!(
                "head_dim {} is not supported (cuda-flash supports {:?}; cuda-simple covers head_dim <= 256)",
                dims.head_dim, FLASH_HEAD_DIMS
            )));
        };
        if let Some(why) = &v.unsupported {
            return Err(err(why.clone()));
        }
        if dims.q_heads == 0 || dims.kv_heads == 0 || !dims.q_heads.is_multiple_of(dims.kv_heads) {
            return Err(err(format!(
                "q_heads {} must be a positive multiple of kv_heads {}",
                dims.q_heads, dims.kv_heads
            )));
        }
        let big = [
            dims.q_rows,
            dims.kv_rows,
            dims.q_rows.saturating_mul(dims.q_heads),
            dims.kv_rows.saturating_mul(dims.kv_heads),
        ];
        if big.iter().any(|&x| x > MAX_ROWS) {
            return Err(err(format!(
                "Tq {}, Tk {}, Hq {}, Hkv {}: rows and rows x heads must be <= {MAX_ROWS}",
                dims.q_rows, dims.kv_rows, dims.q_heads, dims.kv_heads
            )));
        }
        Ok(v)
    }

    /// `x` as a bf16 operand of `n` elements: itself when it is bf16 already, else a rounded
    /// copy. Fails when the buffer is shorter than `n` elements.
    fn bf16_operand<'a, T: FlashIn + ?Sized>(
        &self,
        op: &'static str,
        what: &str,
        x: &'a T,
        n: usize,
    ) -> Result<Bf16Buf<'a>> {
        let (buf, dtype) = x.flash_buf();
        if buf.len() < n * dtype.size() {
            return Err(self.shape_err(
                op,
                format!(
                    "{what}: {} bytes hold fewer than {n} {} elements",
                    buf.len(),
                    dtype.name()
                ),
            ));
        }
        Ok(match dtype {
            DType::Bf16 => Bf16Buf::Borrowed(buf),
            DType::F32 => Bf16Buf::Owned(self.converted(op, buf, n, DType::Bf16)?),
        })
    }

    /// q, k and v as bf16 operands (see [`Self::bf16_operand`]).
    fn qkv_operands<'a, Q: FlashIn + ?Sized, K: FlashIn + ?Sized, V: FlashIn + ?Sized>(
        &self,
        op: &'static str,
        (q, k, v): (&'a Q, &'a K, &'a V),
        sh: &CallShape,
    ) -> Result<[Bf16Buf<'a>; 3]> {
        Ok([
            self.bf16_operand(op, "q", q, sh.nq)?,
            self.bf16_operand(op, "k", k, sh.nk)?,
            self.bf16_operand(op, "v", v, sh.nk)?,
        ])
    }

    /// The device address of `b`, for a tensor map (`b` is also passed to the kernel, which
    /// orders the stream's use of it).
    fn dev_ptr(&self, b: &CudaSlice<u8>) -> sys::CUdeviceptr {
        b.device_ptr(&self.stream).0
    }

    /// A bf16 kernel result as the backend's activation dtype: as it is for bf16
    /// activations, widened (exactly) to f32 otherwise. Returns the buffer and its dtype.
    fn flash_result(&self, op: &'static str, b: CudaSlice<u8>, n: usize) -> Result<Tagged> {
        match self.opts.activations {
            DType::Bf16 => Ok((b, DType::Bf16)),
            DType::F32 => Ok((self.converted(op, &b, n, DType::F32)?, DType::F32)),
        }
    }

    /// Forward: returns `(out f32 (Tq*Hq*D), lse f32 (Tq*Hq))` buffers. q, k, v: f32
    /// buffers or storages of either dtype (bf16 ones are used without conversion).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn flash_forward<Q: FlashIn + ?Sized, K: FlashIn + ?Sized, V: FlashIn + ?Sized>(
        &self,
        op: &'static str,
        dims: &AttnDims,
        q: &Q,
        k: &K,
        v: &V,
        mask: &BlockMask,
        scale: f32,
    ) -> Result<(Tagged, CudaSlice<u8>)> {
        let fk = self.flash(op)?;
        let var = self.flash_variant(op, fk, dims)?;
        let sh = CallShape::of(dims);
        let (nq, nl) = (sh.nq, sh.nl);
        let mut lse = self.alloc_f32(op, nl)?;
        if nl == 0 {
            return Ok(((self.alloc_f32(op, nq)?, DType::F32), lse));
        }
        if dims.kv_rows == 0 {
            // No row sees a key: out 0 and lse -inf by definition. (The Hopper forward's
            // tensor maps cannot describe a 0-row k or v.)
            self.fill(op, &mut lse, nl, f32::NEG_INFINITY)?;
            return Ok(((self.zeros_f32(op, nq)?, DType::F32), lse));
        }
        // one item per (query tile, query head)
        let items = grid(dims.q_rows, var.fwd_bm, dims.q_heads)
            .ok_or_else(|| self.shape_err(op, "forward grid too large for cuda-flash"))?;
        // A persistent forward holds one CTA per SM (its shared memory and registers): more
        // would only queue; its CTAs take further items from the `work` counter.
        let ctas = if var.fwd_persist {
            items.min(
                self.opts
                    .attn_forward_ctas
                    .unwrap_or(fk.sms)
                    .clamp(1, fk.sms),
            )
        } else {
            items
        };
        let [qb, kb, vb] = self.qkv_operands(op, (q, k, v), &sh)?;
        let (qb, kb, vb) = (qb.get(), kb.get(), vb.get());
        let mask_dev = self.upload_mask(op, mask)?;
        let mut out_b = self.alloc(op, nq, DType::Bf16)?;
        // The persistent forward's item counter (an int, zero at launch; 4 zero bytes).
        let mut work = self.zeros_f32(op, 1)?;
        let maps = if var.fwd_tma_bn > 0 {
            TensorMap::forward_maps(
                [self.dev_ptr(qb), self.dev_ptr(kb), self.dev_ptr(vb)],
                dims,
                (var.fwd_bm, var.fwd_tma_bn),
            )
            .map_err(|e| self.shape_err(op, format!("cuda-flash forward: {e}")))?
        } else {
            [TensorMap::unused(); 3]
        };
        let tail = KernelTail::new(&sh, scale, fk, items, dims.kv_heads, maps);
        // attn_fwd_d{D}(const bf16* q, k, v, const int* fs, fe, ss, se, bf16* out, float* lse,
        //               int* work, int Tq, int Tk, int Hq, int Hkv, float scale, int hgroup,
        //               TmaDesc tm_q, tm_k, tm_v)
        let mut l = self.stream.launch_builder(&var.fwd);
        l.arg(qb).arg(kb).arg(vb);
        push_mask(&mut l, &mask_dev);
        l.arg(&mut out_b).arg(&mut lse).arg(&mut work);
        tail.push(&mut l);
        self.launch(op, l, launch_1d(ctas, var.fwd_threads, var.fwd_smem))?;
        let out = self.flash_result(op, out_b, nq)?;
        Ok((out, lse))
    }
}

/// The four mask arrays (`fs, fe, ss, se`) as kernel arguments.
fn push_mask<'a>(l: &mut LaunchArgs<'a>, mask: &'a [Arc<CudaSlice<u8>>; 4]) {
    for m in mask {
        l.arg(&**m);
    }
}

/// The arguments the forward and the main backward kernel end with: `int Tq, Tk, Hq, Hkv,
/// float scale, int hgroup, TmaDesc` x 3.
struct KernelTail {
    ints: [i32; 4],
    scale: f32,
    hgroup: i32,
    maps: [TensorMap; 3],
}

impl KernelTail {
    /// `ctas`: the kernel's work items (one per CTA unless it is persistent), for its kv-head
    /// groups ([`head_group`]).
    fn new(
        sh: &CallShape,
        scale: f32,
        fk: &FlashKernels,
        ctas: u32,
        kv_heads: usize,
        maps: [TensorMap; 3],
    ) -> Self {
        KernelTail {
            ints: sh.ints,
            scale,
            hgroup: head_group(ctas as usize, kv_heads, fk.sms as usize),
            maps,
        }
    }

    fn push<'a>(&'a self, l: &mut LaunchArgs<'a>) {
        for x in &self.ints {
            l.arg(x);
        }
        l.arg(&self.scale).arg(&self.hgroup);
        for m in &self.maps {
            l.arg(m);
        }
    }
}

/// Waves of CTAs each kv-head group of an attention kernel should hold (see [`head_group`]).
const GROUP_WAVES: usize = 4;

/// The attention kernels' kv-head group size: their CTAs (forward: one per query tile and
/// query head; backward: one per key tile and kv head) run in groups of this many kv heads,
/// each group heaviest tiles first, so that the K/V (forward) or the dq_accum rows and Q/dO
/// (backward) of a few heads stay in L2. A group should still hold [`GROUP_WAVES`] waves of
/// CTAs: the next group's heavy tiles start only as the previous group drains. Run 31
/// (interleaved A/B on the H200, backward): causal S=8192 x1.05-1.06 (2048 CTAs: groups of
/// 8), DFlash ctx 8192 x1.06 (1024: groups of 4); DFlash ctx 4096 (512 CTAs, 3.9 waves) lost
/// 6% with groups of 4, so it stays one group. The size is rounded up to a divisor of the kv
/// heads, so that no short last group trails (the drafter's 704 CTAs over 8 kv heads: 6 -> 8).
pub(crate) fn head_group(ctas: usize, kv_heads: usize, sms: usize) -> i32 {
    let heads = kv_heads.max(1);
    let min = ((heads * GROUP_WAVES * sms) / ctas.max(1)).clamp(1, heads);
    (min..=heads)
        .find(|g| heads.is_multiple_of(*g))
        .unwrap_or(heads) as i32
}

#[cfg(test)]
mod tests {
    use super::head_group;

    #[test]
    fn head_groups_hold_four_waves_and_never_exceed_the_heads() {
        // (CTAs, kv heads, SMs) -> group size: the bench's shapes on an H200 (132 SMs)
        let cases = [
            ((2048, 32, 132), 8), // causal S=8192: 64 key tiles x 32 heads
            ((1024, 8, 132), 4),  // DFlash ctx 8192 + 512 blocks
            ((512, 8, 132), 8),   // DFlash ctx 4096 + 256 blocks: one group
            ((256, 8, 132), 8),   // DFlash ctx 2048: one group
            ((704, 8, 132), 8),   // the drafter's attention (88 key tiles): 6 rounds up to 8
            ((1 << 20, 4, 132), 1),
            ((1 << 20, 0, 132), 1),
            ((1200, 12, 132), 6), // 5.28: 5 rounds up to 6, a divisor of 12
            ((1, 1, 132), 1),
            ((0, 3, 132), 3),
        ];
        for ((ctas, heads, sms), want) in cases {
            assert_eq!(
                head_group(ctas, heads, sms),
                want,
                "{ctas} CTAs, {heads} kv heads"
            );
        }
    }
}
