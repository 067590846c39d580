//! The call's ABI descriptions checked and turned into slices and a [`BlockMask`]; every
//! failure is a status and a message for `last_error`.

use dflash_attention_abi::{DLDataType, DLTensor, DfAttnMask, MASK_SIZE_V1_0, Status, kDLCPU};
use dflash_core::mask::{BlockMask, Interval};

/// A failed check: the status to return and why.
pub type Fail = (Status, String);

fn invalid(msg: String) -> Fail {
    (Status::InvalidArgument, msg)
}

/// A checked compact row-major f32 host tensor: its shape and element count.
pub struct Checked {
    pub shape: Vec<usize>,
    pub len: usize,
    data: *mut f32,
}

/// Checks `t` is a compact row-major f32 CPU tensor of `ndim` dims.
///
/// # Safety
/// `t` is null or points to a DLTensor whose shape/strides arrays hold `ndim` values.
pub unsafe fn check(what: &str, t: *const DLTensor, ndim: usize) -> Result<Checked, Fail> {
    let t = unsafe { t.as_ref() }.ok_or_else(|| invalid(format!("{what} is NULL")))?;
    if t.device.device_type != kDLCPU {
        return Err((
            Status::Unsupported,
            format!("{what}: device type {}, only kDLCPU", t.device.device_type),
        ));
    }
    if t.dtype != DLDataType::F32 {
        return Err((
            Status::Unsupported,
            format!("{what}: dtype {:?}, only f32", t.dtype),
        ));
    }
    if t.ndim as usize != ndim || t.shape.is_null() {
        return Err(invalid(format!("{what}: ndim {}, expected {ndim}", t.ndim)));
    }
    let dims = unsafe { std::slice::from_raw_parts(t.shape, ndim) };
    let shape: Vec<usize> = dims
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| invalid(format!("{what}: dim {d} < 0"))))
        .collect::<Result<_, _>>()?;
    if !t.strides.is_null() {
        let strides = unsafe { std::slice::from_raw_parts(t.strides, ndim) };
        let mut want = 1i64;
        for i in (0..ndim).rev() {
            if dims[i] > 1 && strides[i] != want {
                return Err((
                    Status::Unsupported,
                    format!("{what}: strides {strides:?} are not compact row-major"),
                ));
            }
            want = want.saturating_mul(dims[i]);
        }
    }
    let len = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| invalid(format!("{what}: shape {shape:?} overflows")))?;
    if t.byte_offset % 4 != 0 || (len > 0 && t.data.is_null()) {
        return Err(invalid(format!(
            "{what}: data NULL or byte_offset not f32-aligned"
        )));
    }
    let data = unsafe { t.data.cast::<u8>().add(t.byte_offset as usize) }.cast::<f32>();
    Ok(Checked { shape, len, data })
}

impl Checked {
    /// # Safety
    /// The tensor's memory holds `len` f32 values, not written during the borrow.
    pub unsafe fn slice<'a>(&self) -> &'a [f32] {
        if self.len == 0 {
            return &[];
        }
        unsafe { std::slice::from_raw_parts(self.data, self.len) }
    }
    /// # Safety
    /// The tensor's memory holds `len` f32 values, not aliased during the borrow.
    pub unsafe fn slice_mut<'a>(&self) -> &'a mut [f32] {
        if self.len == 0 {
            return &mut [];
        }
        unsafe { std::slice::from_raw_parts_mut(self.data, self.len) }
    }
}

/// The mask's arrays as a [`BlockMask`] (whose constructor checks bounds and overlaps).
///
/// # Safety
/// `m` is null or a DfAttnMask whose four arrays hold `q_len` values.
pub unsafe fn mask(m: *const DfAttnMask) -> Result<BlockMask, Fail> {
    if m.is_null() {
        return Err(invalid("mask is NULL".into()));
    }
    // Against the 1.0 size, not size_of: a host of any 1.x is served (see read_versioned).
    let m = unsafe { dflash_attention_abi::read_versioned(m, MASK_SIZE_V1_0) }
        .ok_or_else(|| invalid(format!("mask struct_size {}", unsafe { (*m).struct_size })))?;
    if m.device.device_type != kDLCPU {
        return Err((Status::Unsupported, "mask not in host memory".into()));
    }
    let (q_len, kv_len) = match (usize::try_from(m.q_len), usize::try_from(m.kv_len)) {
        (Ok(q), Ok(k)) => (q, k),
        _ => return Err(invalid(format!("mask {}x{}", m.q_len, m.kv_len))),
    };
    let ptrs = [m.first_start, m.first_end, m.second_start, m.second_end];
    if q_len > 0 && ptrs.iter().any(|p| p.is_null()) {
        return Err(invalid("a mask array is NULL".into()));
    }
    let arr = |p: *const i32| -> &[i32] {
        if q_len == 0 {
            &[]
        } else {
            unsafe { std::slice::from_raw_parts(p, q_len) }
        }
    };
    let [fs, fe, ss, se] = ptrs.map(arr);
    let ivs = |s: &[i32], e: &[i32]| -> Vec<Interval> {
        s.iter()
            .zip(e)
            .map(|(&a, &b)| Interval::new(a, b))
            .collect()
    };
    BlockMask::from_intervals(kv_len, ivs(fs, fe), ivs(ss, se)).map_err(|e| invalid(e.to_string()))
}
