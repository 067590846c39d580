//! Backward (FA2 recompute from the forward's `lse`): `dk`/`dv` per key tile and `dq` per query
//! tile, each task owning its output rows so no atomics are needed.

use dflash_core::mask::{KeyTile, TileKind};

use crate::context::Ctx;
use crate::dense::{axpy, dot, fold};
use crate::geometry::Geom;
use crate::tiles::visible_ranges;

/// The backward's per-(row, head) inputs besides q, k, v: the forward's `lse`, `d_out`, and
/// `delta = rowsum(dO * O)`.
#[derive(Clone, Copy)]
pub(crate) struct RowTerms<'a> {
    pub(crate) lse: &'a [f32],
    pub(crate) d_out: &'a [f32],
    pub(crate) delta: &'a [f64],
}

impl Ctx<'_> {
    /// `dk`/`dv` for key tile `kt` (all kv heads), from every query tile that lists it.
    pub(crate) fn backward_k_tile(
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
        let RowTerms { lse, d_out, delta } = *terms;
        let (k0, k1) = self.key_range(kt);
        let width = k1 - k0;
        let mut dk64 = vec![0f64; width * d];
        let mut dv64 = vec![0f64; width * d];
        let mut dk32 = vec![0f32; width * d];
        let mut dv32 = vec![0f32; width * d];
        for kvh in 0..hkv {
            dk64.fill(0.0);
            dv64.fill(0.0);
            for &(qt, kind) in q_tiles {
                // f32 partials over one query tile, folded into f64 afterwards.
                dk32.fill(0.0);
                dv32.fill(0.0);
                let r0 = qt * self.q_tile;
                let r1 = (r0 + self.q_tile).min(tq);
                for r in r0..r1 {
                    let (ranges, nr) = visible_ranges(self.input.mask.row(r), k0, k1, kind);
                    if nr == 0 {
                        continue;
                    }
                    for gi in 0..g {
                        let h = kvh * g + gi;
                        let qrow = self.q_row(r, h);
                        let dorow = &d_out[(r * hq + h) * d..][..d];
                        let lse_r = lse[r * hq + h];
                        let delta_r = delta[r * hq + h];
                        for &(lo, hi) in &ranges[..nr] {
                            for j in lo..hi {
                                let s = self.input.scale * dot(qrow, self.k_row(j, kvh));
                                let p = (s - lse_r).exp();
                                let dp = dot(dorow, self.v_row(j, kvh));
                                let ds = (p as f64 * (dp as f64 - delta_r)) as f32;
                                let jj = (j - k0) * d;
                                axpy(&mut dv32[jj..jj + d], p, dorow);
                                axpy(&mut dk32[jj..jj + d], ds, qrow);
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
        let Geom { hq, hkv, g, d, .. } = self.geo;
        let RowTerms { lse, d_out, delta } = *terms;
        let r0 = qt * self.q_tile;
        let rows = dq.len() / (hq * d);
        let mut dq64 = vec![0f64; rows * g * d];
        let mut dq32 = vec![0f32; d];
        for kvh in 0..hkv {
            dq64.fill(0.0);
            for kt in tiles {
                let (k0, k1) = self.key_range(kt.index);
                for ri in 0..rows {
                    let r = r0 + ri;
                    let (ranges, nr) = visible_ranges(self.input.mask.row(r), k0, k1, kt.kind);
                    if nr == 0 {
                        continue;
                    }
                    for gi in 0..g {
                        let h = kvh * g + gi;
                        let qrow = self.q_row(r, h);
                        let dorow = &d_out[(r * hq + h) * d..][..d];
                        let lse_r = lse[r * hq + h];
                        let delta_r = delta[r * hq + h];
                        dq32.fill(0.0);
                        for &(lo, hi) in &ranges[..nr] {
                            for j in lo..hi {
                                let krow = self.k_row(j, kvh);
                                let s = self.input.scale * dot(qrow, krow);
                                let p = (s - lse_r).exp();
                                let dp = dot(dorow, self.v_row(j, kvh));
                                let ds = (p as f64 * (dp as f64 - delta_r)) as f32;
                                axpy(&mut dq32, ds, krow);
                            }
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
