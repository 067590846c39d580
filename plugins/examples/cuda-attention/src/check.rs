//! The call's descriptions checked for device memory: compact row-major f32 CUDA tensors of
//! the right shapes, a mask on the device; each failure a status and a message.

use dflash_attention_abi::{DLDataType, DLTensor, DfAttnMask, MASK_SIZE_V1_0, Status, kDLCUDA};

pub type Fail = (Status, String);

pub fn invalid(msg: impl Into<String>) -> Fail {
    (Status::InvalidArgument, msg.into())
}

/// The device address of a checked tensor.
pub fn checked(what: &str, t: *const DLTensor, want: &[i64]) -> Result<u64, Fail> {
    // SAFETY: the header's contract: null or a valid DLTensor with `ndim` shape/stride values.
    let t = unsafe { t.as_ref() }.ok_or_else(|| invalid(format!("{what} is NULL")))?;
    if t.device.device_type != kDLCUDA {
        return Err((Status::Unsupported, format!("{what}: not in CUDA memory")));
    }
    if t.dtype != DLDataType::F32 {
        return Err((
            Status::Unsupported,
            format!("{what}: dtype {:?}, only f32", t.dtype),
        ));
    }
    if t.ndim as usize != want.len() || t.shape.is_null() {
        return Err(invalid(format!(
            "{what}: ndim {}, expected {}",
            t.ndim,
            want.len()
        )));
    }
    let shape = unsafe { std::slice::from_raw_parts(t.shape, want.len()) };
    if shape != want {
        return Err(invalid(format!(
            "{what}: shape {shape:?}, expected {want:?}"
        )));
    }
    if !t.strides.is_null() {
        let strides = unsafe { std::slice::from_raw_parts(t.strides, want.len()) };
        let mut s = 1i64;
        for i in (0..want.len()).rev() {
            if shape[i] > 1 && strides[i] != s {
                return Err((Status::Unsupported, format!("{what}: non-compact strides")));
            }
            s *= shape[i];
        }
    }
    if t.data.is_null() || t.byte_offset % 4 != 0 {
        return Err(invalid(format!(
            "{what}: data NULL or byte_offset not f32-aligned"
        )));
    }
    Ok(t.data as u64 + t.byte_offset)
}

/// The dims `(Tq, Tk, Hq, Hkv, D)` from q and k (checked for ndim 3), before full checks.
pub fn dims(q: *const DLTensor, k: *const DLTensor) -> Result<[i64; 5], Fail> {
    let shape = |what: &str, t: *const DLTensor| -> Result<[i64; 3], Fail> {
        let t = unsafe { t.as_ref() }.ok_or_else(|| invalid(format!("{what} is NULL")))?;
        if t.ndim != 3 || t.shape.is_null() {
            return Err(invalid(format!("{what}: ndim {}, expected 3", t.ndim)));
        }
        let s = unsafe { std::slice::from_raw_parts(t.shape, 3) };
        Ok([s[0], s[1], s[2]])
    };
    let (q, k) = (shape("q", q)?, shape("k", k)?);
    if q[2] != k[2] || k[1] <= 0 || q[1] % k[1] != 0 || q[2] <= 0 || q[2] > 1024 {
        return Err(invalid(format!(
            "q {q:?} and k {k:?} do not form (Tq, Hq, D) / (Tk, Hkv, D) with Hkv | Hq, 1 <= D <= 1024"
        )));
    }
    if [q[0], k[0], q[1] * q[0]]
        .iter()
        .any(|&x| x < 0 || x > i32::MAX as i64)
    {
        return Err(invalid("dims beyond i32"));
    }
    Ok([q[0], k[0], q[1], k[1], q[2]])
}

/// The mask's four device arrays, checked against `(Tq, Tk)`.
pub fn mask(m: *const DfAttnMask, tq: i64, tk: i64) -> Result<[u64; 4], Fail> {
    if m.is_null() {
        return Err(invalid("mask is NULL"));
    }
    // Against the 1.0 size, not size_of: a host of any 1.x is served (see read_versioned).
    let m = unsafe { dflash_attention_abi::read_versioned(m, MASK_SIZE_V1_0) }
        .ok_or_else(|| invalid("mask struct_size too small"))?;
    if m.device.device_type != kDLCUDA {
        return Err((Status::Unsupported, "mask not in CUDA memory".into()));
    }
    if m.q_len != tq || m.kv_len != tk {
        return Err(invalid(format!(
            "mask {}x{} but q/k {tq}x{tk}",
            m.q_len, m.kv_len
        )));
    }
    let a = [m.first_start, m.first_end, m.second_start, m.second_end].map(|p| p as u64);
    if tq > 0 && a.contains(&0) {
        return Err(invalid("a mask array is NULL"));
    }
    Ok(a)
}
