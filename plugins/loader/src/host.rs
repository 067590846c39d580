//! Memory described for the ABI: `f32` host slices or device addresses as DLPack tensors, a
//! [`BlockMask`] as its four `i32` arrays, and a host-allocated workspace.

use std::ffi::c_void;

use dflash_attention_abi::{DLDataType, DLDevice, DLTensor, DfAttnMask, size_of_u32};
use dflash_core::mask::BlockMask;

/// The shape and (compact row-major) strides a [`DLTensor`] points at; build the tensor with
/// [`HostTensor::dl`] and keep this alive (and unmoved) while the tensor is in use.
pub struct HostTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: usize,
    shape: [i64; 3],
    strides: [i64; 3],
}

impl HostTensor {
    fn new(data: *mut c_void, device: DLDevice, dims: &[usize]) -> Self {
        let mut shape = [0i64; 3];
        let mut strides = [0i64; 3];
        let mut stride = 1i64;
        for i in (0..dims.len()).rev() {
            shape[i] = dims[i] as i64;
            strides[i] = stride;
            stride = stride.saturating_mul(dims[i] as i64);
        }
        HostTensor {
            data,
            device,
            ndim: dims.len(),
            shape,
            strides,
        }
    }
    /// A read-only input; the plugin receives it through a `const DLTensor*`.
    pub fn input(data: &[f32], dims: &[usize]) -> Self {
        Self::new(data.as_ptr().cast_mut().cast(), DLDevice::CPU, dims)
    }
    pub fn output(data: &mut [f32], dims: &[usize]) -> Self {
        Self::new(data.as_mut_ptr().cast(), DLDevice::CPU, dims)
    }
    /// `f32` elements at device address `addr` of `device` (the caller owns the allocation).
    pub fn device(addr: u64, device: DLDevice, dims: &[usize]) -> Self {
        Self::new(addr as *mut c_void, device, dims)
    }
    pub fn dl(&mut self) -> DLTensor {
        DLTensor {
            data: self.data,
            device: self.device,
            ndim: self.ndim as i32,
            dtype: DLDataType::F32,
            shape: self.shape.as_mut_ptr(),
            strides: self.strides.as_mut_ptr(),
            byte_offset: 0,
        }
    }
}

/// A mask's four interval arrays, owned, and their ABI description.
pub struct HostMask {
    arrays: [Vec<i32>; 4],
    q_len: i64,
    kv_len: i64,
}

impl HostMask {
    pub fn new(mask: &BlockMask) -> Self {
        HostMask {
            arrays: mask.to_i32_arrays(),
            q_len: mask.q_len() as i64,
            kv_len: mask.kv_len() as i64,
        }
    }
    pub fn abi(&self) -> DfAttnMask {
        let [fs, fe, ss, se] = &self.arrays;
        DfAttnMask {
            struct_size: size_of_u32::<DfAttnMask>(),
            device: DLDevice::CPU,
            q_len: self.q_len,
            kv_len: self.kv_len,
            first_start: fs.as_ptr(),
            first_end: fe.as_ptr(),
            second_start: ss.as_ptr(),
            second_end: se.as_ptr(),
        }
    }
}

/// Scratch the host allocates for one call, 16-byte aligned.
pub struct Workspace(Vec<u128>);

impl Workspace {
    /// `Err` (the message) when `bytes` cannot be allocated.
    pub fn new(bytes: u64) -> Result<Self, String> {
        let n = usize::try_from(bytes.div_ceil(16))
            .map_err(|_| format!("workspace of {bytes} bytes does not fit in memory"))?;
        let mut v = Vec::new();
        v.try_reserve_exact(n)
            .map_err(|e| format!("cannot allocate a workspace of {bytes} bytes: {e}"))?;
        v.resize(n, 0);
        Ok(Workspace(v))
    }
    /// `(pointer, bytes)`; the pointer is null for an empty workspace.
    pub fn raw(&mut self) -> (*mut c_void, u64) {
        if self.0.is_empty() {
            (std::ptr::null_mut(), 0)
        } else {
            (
                self.0.as_mut_ptr().cast::<c_void>(),
                (self.0.len() * 16) as u64,
            )
        }
    }
}
