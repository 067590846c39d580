//! The geometry of one call, read from its already validated dims ([`AttnForward::new`]
//! checked them and the slice lengths), plus the kernel's own check of a finite scale, so
//! malformed input is an `Err`, never a panic.
//!
//! [`AttnForward::new`]: dflash_core::AttnForward::new

use dflash_core::AttnDims;

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
    /// The geometry of `dims`, for a finite `scale`; errors name the plugin and the op.
    pub(crate) fn new(op: &str, dims: &AttnDims, scale: f32) -> Result<Self, String> {
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
