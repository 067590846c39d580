//! The DLPack 1.x structs the ABI uses, layout-identical to `dlpack.h` (so any DLPack producer
//! can fill them; vendored because they are four plain structs).

use std::ffi::c_void;

pub const kDLCPU: i32 = 1;
pub const kDLCUDA: i32 = 2;

pub const kDLFloat: u8 = 2;
pub const kDLBfloat: u8 = 4;

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DLDevice {
    /// `DLDeviceType` (a C enum: `int` sized).
    pub device_type: i32,
    pub device_id: i32,
}

impl DLDevice {
    pub const CPU: DLDevice = DLDevice {
        device_type: kDLCPU,
        device_id: 0,
    };
}

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DLDataType {
    pub code: u8,
    pub bits: u8,
    pub lanes: u16,
}

impl DLDataType {
    pub const F32: DLDataType = DLDataType {
        code: kDLFloat,
        bits: 32,
        lanes: 1,
    };
    pub const F16: DLDataType = DLDataType {
        code: kDLFloat,
        bits: 16,
        lanes: 1,
    };
    pub const BF16: DLDataType = DLDataType {
        code: kDLBfloat,
        bits: 16,
        lanes: 1,
    };
}

#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DLTensor {
    pub data: *mut c_void,
    pub device: DLDevice,
    pub ndim: i32,
    pub dtype: DLDataType,
    pub shape: *mut i64,
    /// In elements; null means compact row-major.
    pub strides: *mut i64,
    pub byte_offset: u64,
}
