//! The workgroup memory each GEMM kernel declares, which the adapter's
//! `max_compute_workgroup_storage_size` must hold ([`crate::limits::gemm_for`]);
//! `pipelines/tests.rs` checks every figure against its WGSL.

use super::GemmKernel;

/// Workgroup memory of `matmul`: a's and b's 16 x 65 f32 tiles (`gemm.wgsl`'s `tile_a`,
/// `tile_b`, 1040 f32 each).
pub(crate) const SMALL_WORKGROUP_BYTES: u32 = 2 * 1040 * 4;

/// Workgroup memory of `matmul128` and `matmul128_w`: a's and b's 16 x 132-vec4 tiles
/// (`gemm.wgsl`'s `wa`, `wb`, 528 vec4 each), 16,896 bytes: more than WebGPU's guaranteed
/// 16 KiB.
pub(crate) const LARGE_WORKGROUP_BYTES: u32 = 2 * 528 * 16;

/// Workgroup memory of `matmul128_n`: `matmul128`'s a tile and its own 272-vec4 b tile
/// (`gemm_narrow.wgsl`'s `wb_n`).
pub(crate) const NARROW_WORKGROUP_BYTES: u32 = 528 * 16 + 272 * 16;

/// Workgroup memory of `matmul128_db`: two buffers of a's and b's 16 x 128 tiles, f32
/// (`gemm_db.wgsl`'s `wa2` and `wb2`, 2 x 512 vec4 each).
pub(crate) const DB_WORKGROUP_BYTES: u32 = 2 * 2 * 512 * 16;

/// Workgroup memory of `matmul_coop`: a's and b's f16 tiles of 3072 halves each and the 8
/// subgroups' 16 x 16 f32 scratch (`gemm_coop.wgsl`'s `ha`, `hb`, `hc`), 20 KiB; the device
/// checks the adapter's limit against it before it opens for the kernel.
pub(crate) const COOP_WORKGROUP_BYTES: u32 = 2 * 3072 * 2 + 2048 * 4;

impl GemmKernel {
    /// The bytes of workgroup memory the kernel declares (`pipelines/tests.rs` checks each
    /// against its WGSL): what [`crate::limits::gemm_for`] fits to the adapter.
    pub(crate) fn workgroup_bytes(self) -> u32 {
        match self {
            GemmKernel::Small => SMALL_WORKGROUP_BYTES,
            GemmKernel::Large | GemmKernel::Wide => LARGE_WORKGROUP_BYTES,
            GemmKernel::Narrow => NARROW_WORKGROUP_BYTES,
            GemmKernel::DoubleBuffered => DB_WORKGROUP_BYTES,
            GemmKernel::Coop => COOP_WORKGROUP_BYTES,
        }
    }
}
