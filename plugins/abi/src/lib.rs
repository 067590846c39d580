//! The attention plugin ABI: the `#[repr(C)]` mirror of `include/dflash_attention.h`, which is
//! the contract (this file follows it field for field; the C example plugin, compiled against
//! the header and run through the loader, is what proves the two agree).
//!
//! Version rules: [`ABI_MAJOR`] changes break the layout and both sides refuse a major other
//! than their own; [`ABI_MINOR`] changes only append fields at the end of a struct, which each
//! side detects through the struct's leading `struct_size`.

#![allow(non_camel_case_types, non_upper_case_globals)]

mod dlpack;
mod status;

use std::ffi::{c_char, c_void};
use std::mem::{offset_of, size_of};

pub use dlpack::{DLDataType, DLDevice, DLTensor, kDLBfloat, kDLCPU, kDLCUDA, kDLFloat};
pub use status::{Status, status_name};

pub const ABI_MAJOR: u32 = 1;
pub const ABI_MINOR: u32 = 0;
/// The name of the one exported symbol.
pub const ENTRY_POINT: &str = "dflash_attention_plugin";

pub const DTYPE_F32: u32 = 1 << 0;
pub const DTYPE_BF16: u32 = 1 << 1;
pub const DTYPE_F16: u32 = 1 << 2;

pub const CAP_GQA: u32 = 1 << 0;
pub const CAP_DETERMINISTIC: u32 = 1 << 1;
pub const CAP_BACKWARD: u32 = 1 << 2;
pub const CAP_STRIDED: u32 = 1 << 3;

/// Required: the host refuses every call without it (each row's two intervals anywhere in
/// `[0, Tk)`; every mask the host passes, causal ones included, is in this form).
pub const MASK_TWO_INTERVALS: u32 = 1 << 0;
pub const MASK_EMPTY_ROWS: u32 = 1 << 1;

pub const PASS_FORWARD: i32 = 0;
pub const PASS_BACKWARD: i32 = 1;

/// `struct_size` of a struct as this crate defines it.
pub const fn size_of_u32<T>() -> u32 {
    std::mem::size_of::<T>() as u32
}

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DfAttnCapabilities {
    pub struct_size: u32,
    /// A `DLDeviceType` (`kDLCPU`, `kDLCUDA`).
    pub device_type: i32,
    /// `DTYPE_*` bits.
    pub dtypes: u32,
    pub head_dim_min: u32,
    pub head_dim_max: u32,
    pub head_dim_multiple: u32,
    /// `CAP_*` bits.
    pub flags: u32,
    /// `MASK_*` bits.
    pub mask_rules: u32,
}

impl DfAttnCapabilities {
    /// Whether head dim `d` is within the declared range and multiple.
    pub fn supports_head_dim(&self, d: u64) -> bool {
        let m = self.head_dim_multiple.max(1) as u64;
        d >= self.head_dim_min as u64 && d <= self.head_dim_max as u64 && d.is_multiple_of(m)
    }
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DfAttnMask {
    pub struct_size: u32,
    pub device: DLDevice,
    pub q_len: i64,
    pub kv_len: i64,
    pub first_start: *const i32,
    pub first_end: *const i32,
    pub second_start: *const i32,
    pub second_end: *const i32,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DfAttnShape {
    pub struct_size: u32,
    pub dtype: DLDataType,
    pub q_rows: i64,
    pub kv_rows: i64,
    pub q_heads: i64,
    pub kv_heads: i64,
    pub head_dim: i64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DfAttnForwardArgs {
    pub struct_size: u32,
    pub q: *const DLTensor,
    pub k: *const DLTensor,
    pub v: *const DLTensor,
    pub mask: *const DfAttnMask,
    pub scale: f32,
    pub out: *mut DLTensor,
    pub lse: *mut DLTensor,
    pub stream: *mut c_void,
    pub workspace: *mut c_void,
    pub workspace_bytes: u64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DfAttnBackwardArgs {
    pub struct_size: u32,
    pub q: *const DLTensor,
    pub k: *const DLTensor,
    pub v: *const DLTensor,
    pub out: *const DLTensor,
    pub lse: *const DLTensor,
    pub d_out: *const DLTensor,
    pub mask: *const DfAttnMask,
    pub scale: f32,
    pub dq: *mut DLTensor,
    pub dk: *mut DLTensor,
    pub dv: *mut DLTensor,
    pub stream: *mut c_void,
    pub workspace: *mut c_void,
    pub workspace_bytes: u64,
}

pub type WorkspaceFn =
    unsafe extern "C" fn(*const DfAttnPlugin, *const DfAttnShape, i32, *mut u64) -> i32;
pub type ForwardFn = unsafe extern "C" fn(*const DfAttnPlugin, *const DfAttnForwardArgs) -> i32;
pub type BackwardFn = unsafe extern "C" fn(*const DfAttnPlugin, *const DfAttnBackwardArgs) -> i32;
pub type LastErrorFn = unsafe extern "C" fn(*const DfAttnPlugin) -> *const c_char;

/// The plugin's table. Function pointers are `Option` so a NULL from C is representable (and
/// checked by the host) rather than undefined behaviour.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DfAttnPlugin {
    pub struct_size: u32,
    pub abi_major: u32,
    pub abi_minor: u32,
    pub reserved: u32,
    pub name: *const c_char,
    pub version: *const c_char,
    pub capabilities: *const DfAttnCapabilities,
    pub workspace_bytes: Option<WorkspaceFn>,
    pub forward: Option<ForwardFn>,
    pub backward: Option<BackwardFn>,
    pub last_error: Option<LastErrorFn>,
}

// A table is immutable static data of its library; its function pointers are thread-safe by
// contract (the header requires last_error to be per thread).
unsafe impl Sync for DfAttnPlugin {}
unsafe impl Send for DfAttnPlugin {}

pub type EntryPointFn = unsafe extern "C" fn(u32, u32) -> *const DfAttnPlugin;

/// Where a struct's last 1.0 field (at `offset`, of `size` bytes) ends.
const fn end(offset: usize, size: usize) -> u32 {
    (offset + size) as u32
}

// The 1.0 size of each struct (the header's `DF_ATTN_*_SIZE_V1_0`): a later minor appends
// fields, so `size_of` grows and a `struct_size` is checked against these, never against the
// reader's own size. The host accepts a table and capabilities of at least these sizes; a
// plugin must accept args, a mask and a shape of at least these sizes. Read such a struct
// with [`read_prefix`].
pub const CAPABILITIES_SIZE_V1_0: u32 =
    end(offset_of!(DfAttnCapabilities, mask_rules), size_of::<u32>());
pub const MASK_SIZE_V1_0: u32 = end(offset_of!(DfAttnMask, second_end), size_of::<usize>());
pub const SHAPE_SIZE_V1_0: u32 = end(offset_of!(DfAttnShape, head_dim), size_of::<i64>());
pub const FORWARD_ARGS_SIZE_V1_0: u32 = end(
    offset_of!(DfAttnForwardArgs, workspace_bytes),
    size_of::<u64>(),
);
pub const BACKWARD_ARGS_SIZE_V1_0: u32 = end(
    offset_of!(DfAttnBackwardArgs, workspace_bytes),
    size_of::<u64>(),
);
pub const PLUGIN_SIZE_V1_0: u32 = end(offset_of!(DfAttnPlugin, last_error), size_of::<usize>());

/// A copy of the struct at `p` holding the first `struct_size` bytes of it (at most
/// `size_of::<T>()`) and zeros past them: a struct from the other side's older minor version
/// stops early, and the fields it lacks read as zero / NULL / `None` rather than past its end.
///
/// # Safety
/// `p` points to at least `min(struct_size, size_of::<T>())` readable bytes, and `T` is one of
/// this crate's `#[repr(C)]` structs (every field valid when all-zero).
pub unsafe fn read_prefix<T: Copy>(p: *const T, struct_size: u32) -> T {
    let n = (struct_size as usize).min(size_of::<T>());
    // SAFETY: all-zero is valid for T (the caller's promise); `n` bytes of `p` are readable
    // and do not overlap the fresh local.
    unsafe {
        let mut out: T = std::mem::zeroed();
        std::ptr::copy_nonoverlapping(p.cast::<u8>(), (&raw mut out).cast::<u8>(), n);
        out
    }
}

/// The struct at `p` as [`read_prefix`] reads it, or `None` when `p` is NULL or its leading
/// `struct_size` is below `size_v1_0` (one of the `*_SIZE_V1_0` constants): how a plugin takes
/// its args without refusing an older host's shorter struct or reading past its end.
///
/// # Safety
/// `p` is NULL or points to one of this crate's structs whose leading `struct_size` is
/// readable and says how many bytes are.
pub unsafe fn read_versioned<T: Copy>(p: *const T, size_v1_0: u32) -> Option<T> {
    if p.is_null() {
        return None;
    }
    // SAFETY: every struct of the ABI starts with its u32 struct_size.
    let size = unsafe { *p.cast::<u32>() };
    // SAFETY: `size` bytes are readable, by the caller's promise.
    (size >= size_v1_0).then(|| unsafe { read_prefix(p, size) })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The offsets a C compiler gives the header's structs on a 64-bit target (LP64/LLP64):
    /// a field moved or resized here breaks every compiled plugin.
    #[test]
    #[cfg(target_pointer_width = "64")]
    fn layouts_match_the_header_on_64_bit() {
        assert_eq!(size_of::<DLTensor>(), 48);
        assert_eq!(offset_of!(DLTensor, ndim), 16);
        assert_eq!(offset_of!(DLTensor, dtype), 20);
        assert_eq!(offset_of!(DLTensor, strides), 32);
        assert_eq!(size_of::<DfAttnCapabilities>(), 32);
        assert_eq!(offset_of!(DfAttnMask, q_len), 16);
        assert_eq!(size_of::<DfAttnMask>(), 64);
        assert_eq!(offset_of!(DfAttnShape, q_rows), 8);
        assert_eq!(offset_of!(DfAttnForwardArgs, scale), 40);
        assert_eq!(offset_of!(DfAttnForwardArgs, workspace_bytes), 80);
        assert_eq!(offset_of!(DfAttnBackwardArgs, scale), 64);
        assert_eq!(size_of::<DfAttnBackwardArgs>(), 120);
        assert_eq!(offset_of!(DfAttnPlugin, name), 16);
        assert_eq!(offset_of!(DfAttnPlugin, last_error), 64);
        assert_eq!(size_of::<DfAttnPlugin>(), 72);
    }

    /// This is 1.0: every struct is exactly its 1.0 size (a minor bump appends fields and
    /// leaves the constants where they are).
    #[test]
    fn the_1_0_sizes_are_todays_sizes() {
        assert_eq!(
            [
                CAPABILITIES_SIZE_V1_0,
                MASK_SIZE_V1_0,
                SHAPE_SIZE_V1_0,
                FORWARD_ARGS_SIZE_V1_0,
                BACKWARD_ARGS_SIZE_V1_0,
                PLUGIN_SIZE_V1_0,
            ],
            [
                size_of_u32::<DfAttnCapabilities>(),
                size_of_u32::<DfAttnMask>(),
                size_of_u32::<DfAttnShape>(),
                size_of_u32::<DfAttnForwardArgs>(),
                size_of_u32::<DfAttnBackwardArgs>(),
                size_of_u32::<DfAttnPlugin>(),
            ]
        );
        assert_eq!((ABI_MAJOR, ABI_MINOR), (1, 0));
    }

    #[test]
    fn read_prefix_zeroes_what_a_short_struct_lacks() {
        let caps = DfAttnCapabilities {
            struct_size: 24,
            device_type: kDLCPU,
            dtypes: DTYPE_F32,
            head_dim_min: 1,
            head_dim_max: 2,
            head_dim_multiple: 1,
            flags: 7,
            mask_rules: 3,
        };
        let got = unsafe { read_prefix(&caps, 24) };
        assert_eq!(
            (got.head_dim_multiple, got.flags, got.mask_rules),
            (1, 0, 0)
        );
        let whole = unsafe { read_prefix(&caps, 1000) };
        assert_eq!((whole.flags, whole.mask_rules), (7, 3));
    }

    #[test]
    fn head_dim_support_follows_range_and_multiple() {
        let caps = DfAttnCapabilities {
            struct_size: size_of_u32::<DfAttnCapabilities>(),
            device_type: kDLCPU,
            dtypes: DTYPE_F32,
            head_dim_min: 16,
            head_dim_max: 128,
            head_dim_multiple: 16,
            flags: 0,
            mask_rules: 0,
        };
        assert!(caps.supports_head_dim(64));
        assert!(!caps.supports_head_dim(8));
        assert!(!caps.supports_head_dim(72));
        assert!(!caps.supports_head_dim(256));
    }
}
