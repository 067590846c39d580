//! Forward of one query tile: online softmax over its listed key tiles, f32 inside a tile and
//! f64 across tiles.

use dflash_core::mask::KeyTile;

use crate::context::Ctx;
use crate::dense::{axpy_rows, dots_t, exp, scale_max, sum};
use crate::geometry::Geom;
use crate::simd;
use crate::tiles::visible_ranges;

impl Ctx<'_> {
    /// Forward for query tile `qt`: fills its rows of `out` and `lse`.
    pub(crate) fn forward_q_tile(
        &self,
        qt: usize,
        tiles: &[KeyTile],
        out: &mut [f32],
        lse: &mut [f32],
    ) {
        #[cfg(target_arch = "x86_64")]
        if simd::has_avx2() {
            // SAFETY: the CPU has AVX2 (just checked), the only requirement of the call.
            return unsafe { self.forward_q_tile_avx2(qt, tiles, out, lse) };
        }
        self.forward_q_tile_body(qt, tiles, out, lse)
    }

    /// [`Self::forward_q_tile_body`] compiled for AVX2 (same results, see [`simd`]).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn forward_q_tile_avx2(&self, qt: usize, tiles: &[KeyTile], out: &mut [f32], lse: &mut [f32]) {
        self.forward_q_tile_body(qt, tiles, out, lse)
    }

    #[inline(always)]
    fn forward_q_tile_body(&self, qt: usize, tiles: &[KeyTile], out: &mut [f32], lse: &mut [f32]) {
        let Geom { hq, g, d, .. } = self.geo;
        let r0 = qt * self.q_tile;
        let rows = lse.len() / hq;
        // Scores (then probabilities) of one row against one key tile, at tile-local positions.
        let mut scores = vec![0f32; self.k_tile];
        // The key tile of the current kv head, transposed: `(D, w)`.
        let mut kt_t = vec![0f32; d * self.k_tile];
        let mut pv = vec![0f32; d];
        // Running state of (row, head-in-group): max (an f32 score, so kept in f32), sum and
        // output numerator in f64.
        let mut m = vec![f32::NEG_INFINITY; rows * g];
        let mut l = vec![0f64; rows * g];
        let mut acc = vec![0f64; rows * g * d];
        for kvh in 0..self.geo.hkv {
            m.fill(f32::NEG_INFINITY);
            l.fill(0.0);
            acc.fill(0.0);
            for kt in tiles {
                let (k0, k1) = self.key_range(kt.index);
                let w = k1 - k0;
                let kt_t = &mut kt_t[..d * w];
                self.transposed_tile(self.input.k, k0, k1, kvh, kt_t);
                for ri in 0..rows {
                    let (ranges, nr) =
                        visible_ranges(self.input.mask.row(r0 + ri), k0, k1, kt.kind);
                    if nr == 0 {
                        continue;
                    }
                    // Tile-local ranges: only visible keys are ever scored.
                    let ranges = ranges[..nr].iter().map(|&(lo, hi)| (lo - k0, hi - k0));
                    // Same K/V tile rows for every head of the group: they stay in cache.
                    for gi in 0..g {
                        let qrow = self.q_row(r0 + ri, kvh * g + gi);
                        let mut tile_max = f32::NEG_INFINITY;
                        let mut nan = false;
                        for (lo, hi) in ranges.clone() {
                            let s = &mut scores[lo..hi];
                            dots_t(s, qrow, kt_t, w, lo);
                            let (range_max, range_nan) = scale_max(s, self.input.scale);
                            nan |= range_nan;
                            tile_max = tile_max.max(range_max);
                        }
                        let st = ri * g + gi;
                        if nan || l[st].is_nan() {
                            // A NaN score makes the whole row NaN (the NaN policy): the state
                            // stays NaN through every later tile and the row is written NaN.
                            l[st] = f64::NAN;
                            continue;
                        }
                        let m_old = m[st];
                        let m_new = m_old.max(tile_max);
                        if m_new == f32::NEG_INFINITY {
                            // Only reachable with -inf scores (infinite inputs); nothing to add.
                            continue;
                        }
                        // Rescale factor of the old state; exp(-inf) = 0 handles the first tile.
                        // An unchanged max (the common case past the first tiles) needs no exp:
                        // exp(0) is exactly 1.
                        let alpha = if m_new == m_old {
                            1.0
                        } else {
                            ((m_old - m_new) as f64).exp()
                        };
                        pv.fill(0.0);
                        let mut psum = 0f32;
                        for (lo, hi) in ranges.clone() {
                            let p = &mut scores[lo..hi];
                            for v in p.iter_mut() {
                                *v = exp(*v - m_new);
                            }
                            psum += sum(p);
                            axpy_rows(&mut pv, p, |jj| self.v_row(k0 + lo + jj, kvh));
                        }
                        m[st] = m_new;
                        l[st] = l[st] * alpha + psum as f64;
                        for (a, &x) in acc[st * d..][..d].iter_mut().zip(&pv) {
                            *a = *a * alpha + x as f64;
                        }
                    }
                }
            }
            self.finish_rows(kvh, (&m, &l, &acc), out, lse);
        }
    }

    /// The rows of kv head `kvh`'s heads from their final state (max `m`, sum `l`, numerator
    /// `acc (rows * g, D)`): `out = acc / l` and `lse = m + ln l`; NaN where the state is NaN,
    /// out 0 and lse -inf where no key is visible.
    #[inline(always)]
    fn finish_rows(
        &self,
        kvh: usize,
        (m, l, acc): (&[f32], &[f64], &[f64]),
        out: &mut [f32],
        lse: &mut [f32],
    ) {
        let Geom { hq, g, d, .. } = self.geo;
        let rows = lse.len() / hq;
        for ri in 0..rows {
            for gi in 0..g {
                let st = ri * g + gi;
                let h = kvh * g + gi;
                let o = &mut out[(ri * hq + h) * d..][..d];
                if l[st] > 0.0 {
                    let inv = 1.0 / l[st];
                    for (oi, &a) in o.iter_mut().zip(&acc[st * d..][..d]) {
                        *oi = (a * inv) as f32;
                    }
                    lse[ri * hq + h] = (m[st] as f64 + l[st].ln()) as f32;
                } else if l[st].is_nan() {
                    // NaN scores, or an overflow to inf - inf: propagate, never hide.
                    o.fill(f32::NAN);
                    lse[ri * hq + h] = f32::NAN;
                } else {
                    // No visible key (padding block): defined as out 0, lse -inf.
                    o.fill(0.0);
                    lse[ri * hq + h] = f32::NEG_INFINITY;
                }
            }
        }
    }
}
