//! TMA tensor maps (`CUtensorMap`) for the Hopper attention kernels. The forward loads its Q
//! tile and every K/V tile by TMA from one thread (run 30). The backward loads each step's
//! Q and dO tiles with `cp.async.bulk.tensor` from one thread instead of 64 threads of
//! `cp.async`, and adds each step's dQ tile into the f32 accumulator with TMA tensor
//! reductions (docs/kernel-lab-attention.md, run 24). Encoded on the host by
//! `cuTensorMapEncodeTiled` for every launch (a few microseconds, no device work) and passed by
//! value as the kernel's `const __grid_constant__ TmaDesc` parameters (`kernels/attention/common.cuh`).

use cudarc::driver::{DeviceRepr, sys};
use dflash_core::AttnDims;

/// One box: 128 bytes of columns (one row of a 128-byte swizzled shared-memory panel: 64 bf16
/// or 32 f32) by 64 rows for the backward (its query tile, `BWD_BM`; the forward's boxes are
/// its own tiles, from `attn_config`).
const BOX_ROW_BYTES: usize = 128;
const BOX_ROWS: u32 = 64;

/// Element types of the maps: the driver's type, its name for errors, its size in bytes.
type Elem = (sys::CUtensorMapDataType, &'static str, usize);
const BF16: Elem = (
    sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
    "bf16",
    2,
);
const F32: Elem = (
    sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
    "f32",
    4,
);

/// One encoded `CUtensorMap` (128 opaque bytes, 128-byte aligned as CUDA 13 declares it).
#[repr(transparent)]
#[derive(Clone, Copy)]
pub(crate) struct TensorMap(sys::CUtensorMap);

// SAFETY: plain bytes that the driver copies into the kernel's parameter space as they are.
unsafe impl DeviceRepr for TensorMap {}

impl TensorMap {
    /// A map that no kernel reads: the parameter of a kernel compiled without TMA (devices
    /// other than compute capability 9.0 run the mma.sync kernels).
    pub(crate) fn unused() -> Self {
        TensorMap(sys::CUtensorMap { opaque: [0; 16] })
    }

    /// The maps of the Hopper backward `attn_bwd_dkdv_d{D}`: q and d_out (bf16) and the dq
    /// accumulator (f32), all `(q_rows, q_heads, head_dim)`, in the kernel's parameter order.
    pub(crate) fn backward_maps(
        [q, d_out, dq_accum]: [sys::CUdeviceptr; 3],
        dims: &AttnDims,
    ) -> Result<[Self; 3], String> {
        let (rows, heads, head_dim) = (dims.q_rows, dims.q_heads, dims.head_dim);
        // q and d_out are loaded in boxes of 64 bf16 columns (rows past `rows` arrive as zeros);
        // dq_accum is reduced into in boxes of 32 f32 columns (rows past `rows` are left out).
        let map = |ptr, elem, what: &str| {
            Self::rows(ptr, elem, (rows, heads, head_dim), BOX_ROWS)
                .map_err(|e| format!("tensor map of {what}: {e}"))
        };
        Ok([
            map(q, BF16, "q")?,
            map(d_out, BF16, "d_out")?,
            map(dq_accum, F32, "dq_accum")?,
        ])
    }

    /// The maps of the Hopper forward `attn_fwd_d{D}`: q `(q_rows, q_heads, head_dim)` in boxes
    /// of `box_rows.0` rows (its query tile) and k, v `(kv_rows, kv_heads, head_dim)` in boxes of
    /// `box_rows.1` rows (its key tile), all bf16, rows past the end arriving as zeros.
    pub(crate) fn forward_maps(
        [q, k, v]: [sys::CUdeviceptr; 3],
        dims: &AttnDims,
        (q_box, kv_box): (u32, u32),
    ) -> Result<[Self; 3], String> {
        let (d, q_shape) = (dims.head_dim, (dims.q_rows, dims.q_heads, dims.head_dim));
        let kv_shape = (dims.kv_rows, dims.kv_heads, d);
        let map = |ptr, shape, box_rows, what: &str| {
            Self::rows(ptr, BF16, shape, box_rows).map_err(|e| format!("tensor map of {what}: {e}"))
        };
        Ok([
            map(q, q_shape, q_box, "q")?,
            map(k, kv_shape, kv_box, "k")?,
            map(v, kv_shape, kv_box, "v")?,
        ])
    }

    /// `(rows, heads, head_dim)` of `elem` (driver type, name, bytes) in boxes of 128 bytes of
    /// columns x 1 head x `box_rows` rows. `Err` carries the driver's reason and the shape.
    fn rows(
        ptr: sys::CUdeviceptr,
        elem: Elem,
        (rows, heads, head_dim): (usize, usize, usize),
        box_rows: u32,
    ) -> Result<Self, String> {
        let (ty, name, size) = elem;
        let mut map = sys::CUtensorMap { opaque: [0; 16] };
        // Innermost dimension first; strides (bytes) of dimensions 1 and 2.
        let dims: [u64; 3] = [head_dim as u64, heads as u64, rows as u64];
        let strides: [u64; 2] = [(head_dim * size) as u64, (heads * head_dim * size) as u64];
        let boxes: [u32; 3] = [(BOX_ROW_BYTES / size) as u32, 1, box_rows];
        let element_strides: [u32; 3] = [1, 1, 1];
        // SAFETY: every pointer refers to a live local array of the length the rank (3) implies;
        // the call only encodes `map` on the host.
        let r = unsafe {
            sys::cuTensorMapEncodeTiled(
                &mut map,
                ty,
                3,
                ptr as *mut std::ffi::c_void,
                dims.as_ptr(),
                strides.as_ptr(),
                boxes.as_ptr(),
                element_strides.as_ptr(),
                sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
                sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
                sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
                sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
            )
        };
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(format!(
                "cuTensorMapEncodeTiled of a {name} ({rows}, {heads}, {head_dim}) tensor: {r:?}"
            ));
        }
        Ok(TensorMap(map))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensor_map_is_the_kernels_128_bytes() {
        // The kernel declares `struct __align__(128) TmaDesc { unsigned long long w[16]; }`.
        assert_eq!(std::mem::size_of::<TensorMap>(), 128);
        assert_eq!(std::mem::align_of::<TensorMap>(), 128);
    }
}
