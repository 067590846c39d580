//! An attention kernel from outside a backend that runs in the backend's own device memory, on
//! its stream: a CUDA plugin loaded through the C ABI. The backend allocates every operand and
//! the workspace and hands the kernel raw device addresses; nothing crosses to the host.
//!
//! [`AttentionKernel`] is what a kernel source builds: a host kernel any backend can run, or a
//! device kernel that only a backend of its [`DeviceKind`] can.

use std::ffi::c_void;

use crate::HostAttentionKernel;
use crate::mask::BlockMask;
use crate::ops::attention::AttnDims;

/// Where a device kernel runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    /// CUDA device memory; the stream is a `CUstream`.
    Cuda,
}

impl std::fmt::Display for DeviceKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeviceKind::Cuda => f.write_str("CUDA"),
        }
    }
}

/// What every device call shares: the shape, the mask (its host copy, for capability checks,
/// and its four i32 interval arrays `first_start, first_end, second_start, second_end`, each
/// `(Tq)`, in device memory), the stream and the workspace.
#[derive(Debug, Clone, Copy)]
pub struct DeviceCall<'a> {
    pub dims: &'a AttnDims,
    pub mask: &'a BlockMask,
    pub mask_arrays: [u64; 4],
    pub scale: f32,
    pub device_id: i32,
    /// The backend's stream (a `CUstream`), on which the kernel must enqueue its work.
    pub stream: *mut c_void,
    pub workspace: u64,
    pub workspace_bytes: u64,
}

/// Device addresses of a forward's f32 operands: `q (Tq, Hq, D)`, `k`/`v (Tk, Hkv, D)` in,
/// `out (Tq, Hq, D)`, `lse (Tq, Hq)` out; dense and row-major.
#[derive(Debug, Clone, Copy)]
pub struct DeviceAttnForward<'a> {
    pub call: DeviceCall<'a>,
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub out: u64,
    pub lse: u64,
}

/// Device addresses of a backward's f32 operands: the forward's inputs, `out`, `lse` and
/// `d_out` in; `dq`, `dk`, `dv` (shaped as `q`, `k`, `v`) out.
#[derive(Debug, Clone, Copy)]
pub struct DeviceAttnBackward<'a> {
    pub call: DeviceCall<'a>,
    pub q: u64,
    pub k: u64,
    pub v: u64,
    pub out: u64,
    pub lse: u64,
    pub d_out: u64,
    pub dq: u64,
    pub dk: u64,
    pub dv: u64,
}

/// An attention kernel that works on device memory it did not allocate.
pub trait DeviceAttentionKernel: Send + Sync {
    fn name(&self) -> &str;
    fn device(&self) -> DeviceKind;
    /// Checks that the kernel can run a call of `dims` over `mask` (head dim, GQA, backward,
    /// mask rules), before the backend allocates anything for it.
    fn supports(
        &self,
        backward: bool,
        dims: &AttnDims,
        mask: &BlockMask,
    ) -> std::result::Result<(), String>;
    /// Device workspace bytes a forward (or backward) of `dims` needs.
    fn workspace_bytes(&self, backward: bool, dims: &AttnDims) -> std::result::Result<u64, String>;
    /// # Safety
    /// Every address is a live allocation of the stated shape on device `device_id`, the
    /// workspace holds `workspace_bytes`, the stream belongs to that device and the device's
    /// context is current on the calling thread.
    unsafe fn forward(&self, call: &DeviceAttnForward<'_>) -> std::result::Result<(), String>;
    /// # Safety
    /// As [`forward`](Self::forward).
    unsafe fn backward(&self, call: &DeviceAttnBackward<'_>) -> std::result::Result<(), String>;
}

/// A kernel as a source builds it.
pub enum AttentionKernel {
    /// Host memory: any backend can run it (a device backend through a host round trip).
    Host(Box<dyn HostAttentionKernel>),
    /// Device memory of one kind of backend.
    Device(Box<dyn DeviceAttentionKernel>),
}

impl AttentionKernel {
    pub fn name(&self) -> &str {
        match self {
            AttentionKernel::Host(k) => k.name(),
            AttentionKernel::Device(k) => k.name(),
        }
    }
}
