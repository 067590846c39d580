//! Backward (FA2 recompute from the forward's `lse`): `dk`/`dv` per key tile and `dq` per query
//! tile, each task owning its output rows so no atomics are needed.

use dflash_core::mask::{KeyTile, TileKind};

use crate::context::Ctx;
use crate::dense::{axpy, axpy_rows, dots_t, exp, fold};
use crate::geometry::Geom;
use crate::simd;
use crate::tiles::visible_ranges;

/// The backward's per-(row, head) inputs besides q, k, v: the forward's `lse`, `d_out`, and
/// `delta = rowsum(dO * O)`.
#[derive(Clone, Copy)]
pub(crate) struct RowTerms<'a> {
    pub(crate) lse: &'a [f32],
    pub(crate) d_out: &'a [f32],
    pub(crate) delta: &'a [f64],
}

/// Per-tile scratch of one task: the key tile's K and V transposed (`(D, w)` each), and one
/// row's `P` and `dS` against it at tile-local positions.
struct Scratch {
    k_t: Vec<f32>,
    v_t: Vec<f32>,
    p: Vec<f32>,
    ds: Vec<f32>,
}

impl Scratch {
    fn new(k_tile: usize, d: usize) -> Self {
        Scratch {
            k_t: vec![0f32; d * k_tile],
            v_t: vec![0f32; d * k_tile],
            p: vec![0f32; k_tile],
            ds: vec![0f32; k_tile],
        }
    }
}

impl Ctx<'_> {
    /// Loads key tile `[k0, k1)` of kv head `kvh` into `sc`, transposed.
    #[inline(always)]
    fn load_tile(&self, sc: &mut Scratch, k0: usize, k1: usize, kvh: usize) {
        let dw = self.geo.d * (k1 - k0);
        self.transposed_tile(self.input.k, k0, k1, kvh, &mut sc.k_t[..dw]);
        self.transposed_tile(self.input.v, k0, k1, kvh, &mut sc.v_t[..dw]);
    }

    /// `P` and `dS` of row `r`, head `h` against the loaded tile (`w` keys), over the tile-local
    /// range `[lo, hi)`: `P = exp(scale * q.k - lse)`, `dS = P * (dO.v - delta)`.
    #[inline(always)]
    fn row_p_ds(
        &self,
        sc: &mut Scratch,
        terms: &RowTerms,
        (r, h): (usize, usize),
        w: usize,
        (lo, hi): (usize, usize),
    ) {
        let Geom { hq, d, .. } = self.geo;
        let qrow = self.q_row(r, h);
        let dorow = &terms.d_out[(r * hq + h) * d..][..d];
        let lse_r = terms.lse[r * hq + h];
        let delta_r = terms.delta[r * hq + h];
        let (p, ds) = (&mut sc.p[lo..hi], &mut sc.ds[lo..hi]);
        dots_t(p, qrow, &sc.k_t, w, lo);
        dots_t(ds, dorow, &sc.v_t, w, lo);
        for (pj, dsj) in p.iter_mut().zip(ds.iter_mut()) {
            *pj = exp(self.input.scale * *pj - lse_r);
            *dsj = (*pj as f64 * (*dsj as f64 - delta_r)) as f32;
        }
    }

    /// `dk`/`dv` for key tile `kt` (all kv heads), from every query tile that lists it.
    pub(crate) fn backward_k_tile(
        &self,
        kt: usize,
        q_tiles: &[(usize, TileKind)],
        terms: &RowTerms,
        dk: &mut [f32],
        dv: &mut [f32],
    ) {
        #[cfg(target_arch = "x86_64")]
        if simd::has_avx2() {
            // SAFETY: the CPU has AVX2 (just checked), the only requirement of the call.
            return unsafe { self.backward_k_tile_avx2(kt, q_tiles, terms, dk, dv) };
        }
        self.backward_k_tile_body(kt, q_tiles, terms, dk, dv)
    }

    /// [`Self::backward_k_tile_body`] compiled for AVX2 (same results, see [`simd`]).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn backward_k_tile_avx2(
        &self,
        kt: usize,
        q_tiles: &[(usize, TileKind)],
        terms: &RowTerms,
        dk: &mut [f32],
        dv: &mut [f32],
    ) {
        self.backward_k_tile_body(kt, q_tiles, terms, dk, dv)
    }

    #[inline(always)]
    fn backward_k_tile_body(
        &self,
        kt: usize,
        q_tiles: &[(usize, TileKind)],
        terms: &RowTerms,
        dk: &mut [f32],
        dv: &mut [f32],
    ) {
        let Geom {
            tq, hq, hkv, g, d, ..
        } = self.geo;
        let (k0, k1) = self.key_range(kt);
        let width = k1 - k0;
        let mut sc = Scratch::new(self.k_tile, d);
        let mut dk64 = vec![0f64; width * d];
        let mut dv64 = vec![0f64; width * d];
        let mut dk32 = vec![0f32; width * d];
        let mut dv32 = vec![0f32; width * d];
        for kvh in 0..hkv {
            dk64.fill(0.0);
            dv64.fill(0.0);
            self.load_tile(&mut sc, k0, k1, kvh);
            for &(qt, kind) in q_tiles {
                // f32 partials over one query tile, folded into f64 afterwards.
                dk32.fill(0.0);
                dv32.fill(0.0);
                let r0 = qt * self.q_tile;
                let r1 = (r0 + self.q_tile).min(tq);
                for r in r0..r1 {
                    let (ranges, nr) = visible_ranges(self.input.mask.row(r), k0, k1, kind);
                    for &(lo, hi) in &ranges[..nr] {
                        let (lo, hi) = (lo - k0, hi - k0);
                        for gi in 0..g {
                            let h = kvh * g + gi;
                            self.row_p_ds(&mut sc, terms, (r, h), width, (lo, hi));
                            let qrow = self.q_row(r, h);
                            let dorow = &terms.d_out[(r * hq + h) * d..][..d];
                            for jj in lo..hi {
                                axpy(&mut dv32[jj * d..][..d], sc.p[jj], dorow);
                                axpy(&mut dk32[jj * d..][..d], sc.ds[jj], qrow);
                            }
                        }
                    }
                }
                fold(&mut dk64, &dk32);
                fold(&mut dv64, &dv32);
            }
            let scale = self.input.scale as f64;
            for jj in 0..width {
                let dst = (jj * hkv + kvh) * d;
                for x in 0..d {
                    dk[dst + x] = (scale * dk64[jj * d + x]) as f32;
                    dv[dst + x] = dv64[jj * d + x] as f32;
                }
            }
        }
    }

    /// `dq` for query tile `qt`, walking its key tiles like the forward.
    pub(crate) fn backward_q_tile(
        &self,
        qt: usize,
        tiles: &[KeyTile],
        terms: &RowTerms,
        dq: &mut [f32],
    ) {
        #[cfg(target_arch = "x86_64")]
        if simd::has_avx2() {
            // SAFETY: the CPU has AVX2 (just checked), the only requirement of the call.
            return unsafe { self.backward_q_tile_avx2(qt, tiles, terms, dq) };
        }
        self.backward_q_tile_body(qt, tiles, terms, dq)
    }

    /// [`Self::backward_q_tile_body`] compiled for AVX2 (same results, see [`simd`]).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn backward_q_tile_avx2(&self, qt: usize, tiles: &[KeyTile], terms: &RowTerms, dq: &mut [f32]) {
        self.backward_q_tile_body(qt, tiles, terms, dq)
    }

    #[inline(always)]
    fn backward_q_tile_body(&self, qt: usize, tiles: &[KeyTile], terms: &RowTerms, dq: &mut [f32]) {
        let Geom { hq, hkv, g, d, .. } = self.geo;
        let r0 = qt * self.q_tile;
        let rows = dq.len() / (hq * d);
        let mut sc = Scratch::new(self.k_tile, d);
        let mut dq64 = vec![0f64; rows * g * d];
        let mut dq32 = vec![0f32; d];
        for kvh in 0..hkv {
            dq64.fill(0.0);
            for kt in tiles {
                let (k0, k1) = self.key_range(kt.index);
                self.load_tile(&mut sc, k0, k1, kvh);
                for ri in 0..rows {
                    let r = r0 + ri;
                    let (ranges, nr) = visible_ranges(self.input.mask.row(r), k0, k1, kt.kind);
                    if nr == 0 {
                        continue;
                    }
                    for gi in 0..g {
                        let h = kvh * g + gi;
                        dq32.fill(0.0);
                        for &(lo, hi) in &ranges[..nr] {
                            let (lo, hi) = (lo - k0, hi - k0);
                            self.row_p_ds(&mut sc, terms, (r, h), k1 - k0, (lo, hi));
                            axpy_rows(&mut dq32, &sc.ds[lo..hi], |jj| {
                                self.k_row(k0 + lo + jj, kvh)
                            });
                        }
                        fold(&mut dq64[(ri * g + gi) * d..][..d], &dq32);
                    }
                }
            }
            let scale = self.input.scale as f64;
            for ri in 0..rows {
                for gi in 0..g {
                    let dst = &mut dq[(ri * hq + kvh * g + gi) * d..][..d];
                    for (o, &x) in dst.iter_mut().zip(&dq64[(ri * g + gi) * d..][..d]) {
                        *o = (scale * x) as f32;
                    }
                }
            }
        }
    }
}
