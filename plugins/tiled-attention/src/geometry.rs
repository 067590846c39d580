//! Validation of one call: the checked geometry, and slice-length checks whose sizes are
//! computed with overflow-safe arithmetic, so malformed input is an `Err`, never a panic.

use dflash_core::AttnDims;
use dflash_core::mask::BlockMask;

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

fn mul(op: &str, what: &str, xs: &[usize]) -> Result<usize, String> {
    xs.iter()
        .try_fold(1usize, |acc, &x| acc.checked_mul(x))
        .ok_or_else(|| format!("tiled attention {op}: {what} size {xs:?} overflows usize"))
}

pub(crate) fn check_len(
    op: &str,
    name: &str,
    got: usize,
    want: usize,
    shape: &str,
) -> Result<(), String> {
    if got != want {
        return Err(format!(
            "tiled attention {op}: {name} has {got} elements, expected {want} = {shape}"
        ));
    }
    Ok(())
}

impl Geom {
    pub(crate) fn new(
        op: &str,
        dims: &AttnDims,
        mask: &BlockMask,
        scale: f32,
    ) -> Result<Self, String> {
        dims.validate(mask)
            .map_err(|e| format!("tiled attention {op}: {e}"))?;
        if dims.q_heads == 0 || dims.head_dim == 0 {
            return Err(format!(
                "tiled attention {op}: q_heads ({}) and head_dim ({}) must be >= 1",
                dims.q_heads, dims.head_dim
            ));
        }
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

    pub(crate) fn q_len(&self, op: &str) -> Result<usize, String> {
        mul(op, "q", &[self.tq, self.hq, self.d])
    }
    pub(crate) fn kv_len(&self, op: &str) -> Result<usize, String> {
        mul(op, "k/v", &[self.tk, self.hkv, self.d])
    }
    pub(crate) fn q_shape(&self) -> String {
        format!("(Tq {}, Hq {}, D {})", self.tq, self.hq, self.d)
    }
    pub(crate) fn kv_shape(&self) -> String {
        format!("(Tk {}, Hkv {}, D {})", self.tk, self.hkv, self.d)
    }
    pub(crate) fn lse_shape(&self) -> String {
        format!("(Tq {}, Hq {})", self.tq, self.hq)
    }
}
