//! [`Ctx`], read by the forward and both backward passes: one place for the row accessors into
//! the fixed `(T, H, D)` layouts, so the passes cannot disagree on indexing.

use dflash_core::AttnInputs;

use crate::dense::transpose_into;
use crate::geometry::Geom;

/// Inputs shared by every task of one call.
pub(crate) struct Ctx<'a> {
    pub(crate) geo: Geom,
    pub(crate) input: AttnInputs<'a>,
    pub(crate) q_tile: usize,
    pub(crate) k_tile: usize,
}

impl Ctx<'_> {
    #[inline]
    pub(crate) fn q_row(&self, r: usize, h: usize) -> &[f32] {
        let d = self.geo.d;
        &self.input.q[(r * self.geo.hq + h) * d..][..d]
    }
    #[inline]
    pub(crate) fn k_row(&self, j: usize, h: usize) -> &[f32] {
        let d = self.geo.d;
        &self.input.k[(j * self.geo.hkv + h) * d..][..d]
    }
    #[inline]
    pub(crate) fn v_row(&self, j: usize, h: usize) -> &[f32] {
        let d = self.geo.d;
        &self.input.v[(j * self.geo.hkv + h) * d..][..d]
    }
    /// Keys `[k0, k1)` of kv head `h` of `src` (`k` or `v`, `(Tk, Hkv, D)`), transposed into
    /// `t (D, k1 - k0)`: built once per tile and head, read by every row of a query tile.
    #[inline(always)]
    pub(crate) fn transposed_tile(
        &self,
        src: &[f32],
        k0: usize,
        k1: usize,
        h: usize,
        t: &mut [f32],
    ) {
        let (d, hkv) = (self.geo.d, self.geo.hkv);
        transpose_into(t, k1 - k0, d, |j| &src[((k0 + j) * hkv + h) * d..][..d]);
    }
    #[inline]
    pub(crate) fn key_range(&self, kt: usize) -> (usize, usize) {
        let k0 = kt * self.k_tile;
        (k0, (k0 + self.k_tile).min(self.geo.tk))
    }
}
