//! Validation of one call (dims, mask, slice lengths through `AttnDims::host_lens`, whose sizes
//! are overflow-safe, and scale), so malformed input is an `Err`, never a panic.

use dflash_core::mask::BlockMask;
use dflash_core::{AttnDims, HostAttnLens};

/// Checked geometry of one call.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Geom {
    pub(crate) tq: usize,
    pub(crate) tk: usize,
    pub(crate) hq: usize,
    pub(crate) hkv: usize,
    /// Query heads per kv head.
    pub(crate) g: usize,
    pub(crate) d: usize,
}

impl Geom {
    /// Checks one call: `dims` against the mask, the slice lengths with `check_lens` (sizes
    /// overflow-safe, see [`AttnDims::host_lens`]) and a finite `scale`; errors name the plugin
    /// and the op.
    pub(crate) fn new(
        op: &str,
        dims: &AttnDims,
        mask: &BlockMask,
        scale: f32,
        check_lens: impl FnOnce(&HostAttnLens) -> Result<(), String>,
    ) -> Result<Self, String> {
        dims.host_lens(mask)
            .and_then(|lens| check_lens(&lens))
            .map_err(|e| format!("tiled attention {op}: {e}"))?;
        if !scale.is_finite() {
            return Err(format!("tiled attention {op}: scale {scale} is not finite"));
        }
        Ok(Geom {
            tq: dims.q_rows,
            tk: dims.kv_rows,
            hq: dims.q_heads,
            hkv: dims.kv_heads,
            g: dims.group(),
            d: dims.head_dim,
        })
    }
}
