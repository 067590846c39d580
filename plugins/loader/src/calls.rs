//! The calls into a plugin's table that host and device kernels share: the capability check
//! before a call, the workspace query, and forward/backward on tensors already described for
//! the ABI (host slices or device addresses alike).

use dflash_attention_abi::{
    CAP_BACKWARD, CAP_GQA, DLDataType, DLTensor, DTYPE_F32, DfAttnBackwardArgs, DfAttnForwardArgs,
    DfAttnMask, DfAttnShape, MASK_EMPTY_ROWS, MASK_TWO_INTERVALS, size_of_u32,
};
use dflash_core::AttnDims;
use dflash_core::mask::BlockMask;

use crate::{Plugin, PluginError};

pub(crate) fn call_err(plugin: &Plugin, call: &'static str, detail: &str) -> PluginError {
    PluginError::Call {
        plugin: plugin.label().to_string(),
        call,
        detail: detail.to_string(),
    }
}

/// Checks, when a plugin is opened, that it declares `device_type` (described as `what`) and
/// f32, which the host's calls pass.
pub(crate) fn require_memory(
    plugin: &Plugin,
    device_type: i32,
    what: &str,
) -> Result<(), PluginError> {
    let caps = plugin.capabilities();
    let need = |need: String| PluginError::MissingCapability {
        plugin: plugin.label().to_string(),
        call: "open",
        need,
    };
    if caps.device_type != device_type {
        return Err(need(format!(
            "device {what}; it declares device type {})",
            caps.device_type
        )));
    }
    if caps.dtypes & DTYPE_F32 == 0 {
        return Err(need("dtype f32 (DF_ATTN_DTYPE_F32)".into()));
    }
    Ok(())
}

/// What a `call` (`"forward"` or `"backward"`) of `dims` over `mask` needs that `plugin` does
/// not declare, as the error's "needs ..." text; `None` when it declares all of it.
pub(crate) fn missing(
    plugin: &Plugin,
    call: &'static str,
    dims: &AttnDims,
    mask: &BlockMask,
) -> Option<String> {
    let caps = plugin.capabilities();
    if !caps.supports_head_dim(dims.head_dim as u64) {
        return Some(format!(
            "head dim {} (it declares {}..={}, multiples of {})",
            dims.head_dim, caps.head_dim_min, caps.head_dim_max, caps.head_dim_multiple
        ));
    }
    if dims.q_heads != dims.kv_heads && caps.flags & CAP_GQA == 0 {
        return Some(format!(
            "GQA ({} query heads over {} kv heads; DF_ATTN_CAP_GQA)",
            dims.q_heads, dims.kv_heads
        ));
    }
    if call == "backward" && caps.flags & CAP_BACKWARD == 0 {
        return Some("a backward (DF_ATTN_CAP_BACKWARD)".into());
    }
    // Every mask is two intervals per row; only a row seeing nothing is a rule of its own.
    if caps.mask_rules & MASK_TWO_INTERVALS == 0 {
        return Some("two-interval masks (DF_ATTN_MASK_TWO_INTERVALS)".into());
    }
    let empty_row = (0..mask.q_len()).any(|i| mask.row(i).iter().all(|iv| iv.is_empty()));
    if empty_row && caps.mask_rules & MASK_EMPTY_ROWS == 0 {
        return Some("rows that see no key (DF_ATTN_MASK_EMPTY_ROWS)".into());
    }
    None
}

/// `Err` naming what a `call` of `dims` over `mask` needs that `plugin` does not declare.
pub(crate) fn require(
    plugin: &Plugin,
    call: &'static str,
    dims: &AttnDims,
    mask: &BlockMask,
) -> Result<(), PluginError> {
    match missing(plugin, call, dims, mask) {
        None => Ok(()),
        Some(need) => Err(PluginError::MissingCapability {
            plugin: plugin.label().to_string(),
            call,
            need,
        }),
    }
}

/// The workspace bytes `plugin` asks for a `pass` of `dims` (f32 operands).
pub(crate) fn workspace_bytes(
    plugin: &Plugin,
    call: &'static str,
    dims: &AttnDims,
    pass: i32,
) -> Result<u64, PluginError> {
    let shape = DfAttnShape {
        struct_size: size_of_u32::<DfAttnShape>(),
        dtype: DLDataType::F32,
        q_rows: dims.q_rows as i64,
        kv_rows: dims.kv_rows as i64,
        q_heads: dims.q_heads as i64,
        kv_heads: dims.kv_heads as i64,
        head_dim: dims.head_dim as i64,
    };
    let t = plugin.table();
    let mut bytes = 0u64;
    let f = t
        .workspace_bytes
        .ok_or_else(|| call_err(plugin, call, "no workspace_bytes"))?;
    // SAFETY: a checked table's function, with valid pointers.
    let status = unsafe { f(plugin.raw_table(), &shape, pass, &mut bytes) };
    plugin.check_status("workspace_bytes", status)?;
    Ok(bytes)
}

/// What a call runs with besides its tensors.
pub(crate) struct Launch<'a> {
    pub mask: &'a DfAttnMask,
    pub scale: f32,
    pub stream: *mut std::ffi::c_void,
    pub workspace: (*mut std::ffi::c_void, u64),
}

/// The forward on `[q, k, v]` into `[out, lse]`.
///
/// # Safety
/// Every tensor and the mask describe live memory of their stated shapes on the plugin's
/// device; the workspace holds its stated bytes.
pub(crate) unsafe fn forward(
    plugin: &Plugin,
    [q, k, v]: [&DLTensor; 3],
    [out, lse]: [&mut DLTensor; 2],
    launch: &Launch<'_>,
) -> Result<(), PluginError> {
    let args = DfAttnForwardArgs {
        struct_size: size_of_u32::<DfAttnForwardArgs>(),
        q,
        k,
        v,
        mask: launch.mask,
        scale: launch.scale,
        out,
        lse,
        stream: launch.stream,
        workspace: launch.workspace.0,
        workspace_bytes: launch.workspace.1,
    };
    let t = plugin.table();
    let f = t
        .forward
        .ok_or_else(|| call_err(plugin, "forward", "no forward"))?;
    // SAFETY: the caller's contract covers every pointer in `args`.
    let status = unsafe { f(plugin.raw_table(), &args) };
    plugin.check_status("forward", status)
}

/// The backward on `[q, k, v, out, lse, d_out]` into `[dq, dk, dv]`.
///
/// # Safety
/// As [`forward`].
pub(crate) unsafe fn backward(
    plugin: &Plugin,
    [q, k, v, out, lse, d_out]: [&DLTensor; 6],
    [dq, dk, dv]: [&mut DLTensor; 3],
    launch: &Launch<'_>,
) -> Result<(), PluginError> {
    let args = DfAttnBackwardArgs {
        struct_size: size_of_u32::<DfAttnBackwardArgs>(),
        q,
        k,
        v,
        out,
        lse,
        d_out,
        mask: launch.mask,
        scale: launch.scale,
        dq,
        dk,
        dv,
        stream: launch.stream,
        workspace: launch.workspace.0,
        workspace_bytes: launch.workspace.1,
    };
    let t = plugin.table();
    let f = t
        .backward
        .ok_or_else(|| call_err(plugin, "backward", "no backward"))?;
    // SAFETY: as in forward.
    let status = unsafe { f(plugin.raw_table(), &args) };
    plugin.check_status("backward", status)
}

/// The dims of `q`, `k`/`v` and `lse` of a call.
pub(crate) fn shapes(d: &AttnDims) -> ([usize; 3], [usize; 3], [usize; 2]) {
    (
        [d.q_rows, d.q_heads, d.head_dim],
        [d.kv_rows, d.kv_heads, d.head_dim],
        [d.q_rows, d.q_heads],
    )
}
