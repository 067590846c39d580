//! `tiled`: a FlashAttention-2-style CPU attention kernel over block-sparse masks.
//!
//! Registered with the kernel registry as `"tiled"` (see [`dflash_core::registry`]). Layouts are
//! the fixed ones of [`dflash_core::ops::attention`]: `q (Tq, Hq, D)`, `k`/`v (Tk, Hkv, D)`,
//! `out (Tq, Hq, D)`, `lse (Tq, Hq)` (natural log), row-major; GQA: query head `h` uses kv head
//! `h / (Hq / Hkv)`.
//!
//! # Design, and why
//!
//! - **Tiles.** The mask is summarised once per call into a [`TileMap`]: for each query tile
//!   (default 32 rows) the key tiles (default 32 keys) that contain any visible pair. Work is
//!   driven by that list, so it is proportional to the visible pairs (DFlash is ~25% dense at
//!   S=4096, N=256: a dense kernel would do 4x the work and a dense mask would not fit), while
//!   each tile is still a small dense block whose K/V rows stay in cache across all rows and
//!   all GQA heads of the query tile. There is no dense fallback anywhere.
//! - **Full tiles skip per-element mask checks.** With sorted anchors most listed tiles are
//!   fully visible to every row of the query tile (the context prefix `[0, a)` of a DFlash
//!   block, the interior of a causal band). For those the kernel uses the whole key range
//!   without consulting the rows' intervals at all; only the thin band of `Partial` tiles
//!   clips each row's (at most two) intervals to the tile, which is exactly the per-element
//!   visibility test expressed as ranges, so invisible keys are never even scored.
//! - **Online softmax** (running max `m` and sum `l` per row and head): one pass over the key
//!   tiles, never materialising a row of scores longer than one tile, and numerically safe for
//!   large scores (every `exp` argument is `<= 0`).
//! - **Precision: f32 inside a tile, f64 across tiles.** Scores, probabilities and the per-tile
//!   partial sums (at most one tile's worth of terms) are f32, which is what makes the inner
//!   loops cheap and vectorisable; every cross-tile accumulator (`l`, the output numerator, and
//!   `dq`/`dk`/`dv`) is f64, so rounding error does not grow with sequence length. Results
//!   match an f64 oracle to ~1e-6 relative on the conformance suite.
//! - **Backward = FA2 recompute**: with the forward's `lse`, `P = exp(s - lse)` is recomputed
//!   per tile instead of stored (storing it would cost memory proportional to visible pairs
//!   times heads), `D_i = rowsum(dO_i * O_i)`, `dS = P * (dP - D_i)`.
//! - **Deterministic by ownership, not by locks.** Every output element is written by exactly
//!   one rayon task, which accumulates in a fixed order: the forward and the `dq` pass are
//!   parallel over query tiles (each owns its rows of `out`/`lse`/`dq`), the `dk`/`dv` pass is
//!   parallel over key tiles (each owns its rows of `dk`/`dv`, walking the transposed tile map).
//!   No atomics or racy reductions, so results are bit-identical across runs and thread counts.
//!   The price is recomputing `s`, `P` and `dP` in both backward passes (GPU FA2 avoids that
//!   with atomic `dq` adds, which are not deterministic).
//! - **Never panics on user input**: dims are checked with [`AttnDims::validate`], every slice
//!   length is checked with overflow-safe arithmetic, and errors come back as `Err(String)`.

use dflash_core::mask::{BlockMask, Interval, KeyTile, TileKind, TileMap};
use dflash_core::registry::AttentionKernelRegistration;
use dflash_core::{AttnDims, HostAttentionKernel};
use rayon::prelude::*;

/// Default query tile (rows). 32 rows x a handful of GQA heads keep the f64 running state of a
/// query tile small (a few tens of KiB at D = 64) while amortising each K/V tile load over many
/// rows.
pub const DEFAULT_Q_TILE: usize = 32;
/// Default key tile (keys). 32 keys x D = 64 x 4 bytes = 8 KiB per K (and V) tile: stays in L1.
pub const DEFAULT_K_TILE: usize = 32;

/// The registered name of this kernel.
pub const NAME: &str = "tiled";

/// FlashAttention-2-style CPU kernel. Stateless apart from its tile sizes, so it is safe to call
/// from any thread; no warm-up is needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TiledAttention {
    q_tile: usize,
    k_tile: usize,
}

impl Default for TiledAttention {
    fn default() -> Self {
        Self::new()
    }
}

impl TiledAttention {
    /// The kernel with the default tile sizes ([`DEFAULT_Q_TILE`] x [`DEFAULT_K_TILE`]).
    pub fn new() -> Self {
        TiledAttention {
            q_tile: DEFAULT_Q_TILE,
            k_tile: DEFAULT_K_TILE,
        }
    }

    /// The kernel with explicit tile sizes (tests use odd sizes to exercise tile edges).
    pub fn with_tiles(q_tile: usize, k_tile: usize) -> Result<Self, String> {
        if q_tile == 0 || k_tile == 0 {
            return Err(format!(
                "tiled attention: tile sizes must be >= 1 (got q_tile {q_tile}, k_tile {k_tile})"
            ));
        }
        Ok(TiledAttention { q_tile, k_tile })
    }

    /// `(q_tile, k_tile)`.
    pub fn tiles(&self) -> (usize, usize) {
        (self.q_tile, self.k_tile)
    }
}

/// Call this (or name any other item of the crate) from a binary or test to make sure the
/// crate, and with it its `inventory` registration, is linked in.
pub fn link() {}

fn create() -> Box<dyn HostAttentionKernel> {
    Box::new(TiledAttention::new())
}

inventory::submit! {
    AttentionKernelRegistration {
        name: NAME,
        description: "FlashAttention-2-style tiled CPU kernel: block-sparse tiles, online softmax, \
                      deterministic recompute backward",
        create,
    }
}

// ---------------------------------------------------------------------------------------------
// Validation

/// Checked geometry of one call.
#[derive(Debug, Clone, Copy)]
struct Geom {
    tq: usize,
    tk: usize,
    hq: usize,
    hkv: usize,
    /// Query heads per kv head.
    g: usize,
    d: usize,
}

fn mul(op: &str, what: &str, xs: &[usize]) -> Result<usize, String> {
    xs.iter()
        .try_fold(1usize, |acc, &x| acc.checked_mul(x))
        .ok_or_else(|| format!("tiled attention {op}: {what} size {xs:?} overflows usize"))
}

fn check_len(op: &str, name: &str, got: usize, want: usize, shape: &str) -> Result<(), String> {
    if got != want {
        return Err(format!(
            "tiled attention {op}: {name} has {got} elements, expected {want} = {shape}"
        ));
    }
    Ok(())
}

impl Geom {
    fn new(op: &str, dims: &AttnDims, mask: &BlockMask, scale: f32) -> Result<Self, String> {
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

    fn q_len(&self, op: &str) -> Result<usize, String> {
        mul(op, "q", &[self.tq, self.hq, self.d])
    }
    fn kv_len(&self, op: &str) -> Result<usize, String> {
        mul(op, "k/v", &[self.tk, self.hkv, self.d])
    }
    fn q_shape(&self) -> String {
        format!("(Tq {}, Hq {}, D {})", self.tq, self.hq, self.d)
    }
    fn kv_shape(&self) -> String {
        format!("(Tk {}, Hkv {}, D {})", self.tk, self.hkv, self.d)
    }
    fn lse_shape(&self) -> String {
        format!("(Tq {}, Hq {})", self.tq, self.hq)
    }
}

// ---------------------------------------------------------------------------------------------
// Small dense helpers (fixed summation order, so results are reproducible bit for bit)

/// f32 dot product with 8 independent partial sums: lets the compiler vectorise, and the fixed
/// lane structure keeps the result deterministic.
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let ca = a.chunks_exact(8);
    let cb = b.chunks_exact(8);
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..8 {
            acc[l] += x[l] * y[l];
        }
    }
    let mut tail = 0f32;
    for (x, y) in ra.iter().zip(rb) {
        tail += x * y;
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// `y += alpha * x`.
#[inline]
fn axpy(y: &mut [f32], alpha: f32, x: &[f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += alpha * xi;
    }
}

/// `y += x`, folding an f32 per-tile partial into an f64 cross-tile accumulator.
#[inline]
fn fold(y: &mut [f64], x: &[f32]) {
    for (yi, xi) in y.iter_mut().zip(x) {
        *yi += *xi as f64;
    }
}

/// The visible keys of one query row inside the key tile `[k0, k1)`, as at most two ranges.
///
/// `Full` tiles return the whole tile without looking at the row: the tile map already proved
/// every pair visible, which is what lets the bulk of the work skip masking. `Partial` tiles
/// clip the row's intervals to the tile (the per-element test `first.contains(k) ||
/// second.contains(k)`, evaluated for whole ranges at once).
#[inline]
fn visible_ranges(
    row: [Interval; 2],
    k0: usize,
    k1: usize,
    kind: TileKind,
) -> ([(usize, usize); 2], usize) {
    let mut out = [(0, 0); 2];
    if kind == TileKind::Full {
        out[0] = (k0, k1);
        return (out, 1);
    }
    let mut n = 0;
    for iv in row {
        if iv.is_empty() {
            continue;
        }
        // Builders guarantee 0 <= start <= end <= kv_len, so the casts are lossless.
        let lo = (iv.start as usize).max(k0);
        let hi = (iv.end as usize).min(k1);
        if lo < hi {
            out[n] = (lo, hi);
            n += 1;
        }
    }
    (out, n)
}

/// For each key tile, the query tiles that list it (in increasing query-tile order), for the
/// key-tile-parallel `dk`/`dv` pass.
fn transpose(tm: &TileMap, k_tiles: usize) -> Vec<Vec<(usize, TileKind)>> {
    let mut by_key = vec![Vec::new(); k_tiles];
    for (qt, list) in tm.tiles.iter().enumerate() {
        for &KeyTile { index, kind } in list {
            by_key[index].push((qt, kind));
        }
    }
    by_key
}

// ---------------------------------------------------------------------------------------------
// Forward

/// Inputs shared by every task of one call.
struct Ctx<'a> {
    geo: Geom,
    q: &'a [f32],
    k: &'a [f32],
    v: &'a [f32],
    mask: &'a BlockMask,
    scale: f32,
    q_tile: usize,
    k_tile: usize,
}

impl Ctx<'_> {
    #[inline]
    fn q_row(&self, r: usize, h: usize) -> &[f32] {
        let d = self.geo.d;
        &self.q[(r * self.geo.hq + h) * d..][..d]
    }
    #[inline]
    fn k_row(&self, j: usize, h: usize) -> &[f32] {
        let d = self.geo.d;
        &self.k[(j * self.geo.hkv + h) * d..][..d]
    }
    #[inline]
    fn v_row(&self, j: usize, h: usize) -> &[f32] {
        let d = self.geo.d;
        &self.v[(j * self.geo.hkv + h) * d..][..d]
    }
    #[inline]
    fn key_range(&self, kt: usize) -> (usize, usize) {
        let k0 = kt * self.k_tile;
        (k0, (k0 + self.k_tile).min(self.geo.tk))
    }

    /// Forward for query tile `qt`: fills its rows of `out` and `lse`.
    fn forward_q_tile(&self, qt: usize, tiles: &[KeyTile], out: &mut [f32], lse: &mut [f32]) {
        let Geom { hq, g, d, .. } = self.geo;
        let r0 = qt * self.q_tile;
        let rows = lse.len() / hq;
        let mut scores = vec![0f32; self.k_tile];
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
                for ri in 0..rows {
                    let (ranges, nr) = visible_ranges(self.mask.row(r0 + ri), k0, k1, kt.kind);
                    if nr == 0 {
                        continue;
                    }
                    // Same K/V tile rows for every head of the group: they stay in cache.
                    for gi in 0..g {
                        let qrow = self.q_row(r0 + ri, kvh * g + gi);
                        let mut n = 0;
                        let mut tile_max = f32::NEG_INFINITY;
                        for &(lo, hi) in &ranges[..nr] {
                            for j in lo..hi {
                                let s = self.scale * dot(qrow, self.k_row(j, kvh));
                                scores[n] = s;
                                n += 1;
                                tile_max = tile_max.max(s);
                            }
                        }
                        let st = ri * g + gi;
                        let m_old = m[st];
                        let m_new = m_old.max(tile_max);
                        if m_new == f32::NEG_INFINITY {
                            // Only reachable with -inf scores (infinite inputs); nothing to add.
                            continue;
                        }
                        // Rescale factor of the old state; exp(-inf) = 0 handles the first tile.
                        let alpha = ((m_old - m_new) as f64).exp();
                        pv.fill(0.0);
                        let mut psum = 0f32;
                        n = 0;
                        for &(lo, hi) in &ranges[..nr] {
                            for j in lo..hi {
                                let p = (scores[n] - m_new).exp();
                                n += 1;
                                psum += p;
                                axpy(&mut pv, p, self.v_row(j, kvh));
                            }
                        }
                        m[st] = m_new;
                        l[st] = l[st] * alpha + psum as f64;
                        for (a, &x) in acc[st * d..][..d].iter_mut().zip(&pv) {
                            *a = *a * alpha + x as f64;
                        }
                    }
                }
            }
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
                    } else {
                        // No visible key (padding block): defined as out 0, lse -inf.
                        o.fill(0.0);
                        lse[ri * hq + h] = f32::NEG_INFINITY;
                    }
                }
            }
        }
    }

    // -----------------------------------------------------------------------------------------
    // Backward

    /// `dk`/`dv` for key tile `kt` (all kv heads), from every query tile that lists it.
    #[allow(clippy::too_many_arguments)]
    fn backward_k_tile(
        &self,
        kt: usize,
        q_tiles: &[(usize, TileKind)],
        lse: &[f32],
        d_out: &[f32],
        delta: &[f64],
        dk: &mut [f32],
        dv: &mut [f32],
    ) {
        let Geom {
            tq, hq, hkv, g, d, ..
        } = self.geo;
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
                    let (ranges, nr) = visible_ranges(self.mask.row(r), k0, k1, kind);
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
                                let s = self.scale * dot(qrow, self.k_row(j, kvh));
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
            let scale = self.scale as f64;
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
    #[allow(clippy::too_many_arguments)]
    fn backward_q_tile(
        &self,
        qt: usize,
        tiles: &[KeyTile],
        lse: &[f32],
        d_out: &[f32],
        delta: &[f64],
        dq: &mut [f32],
    ) {
        let Geom { hq, hkv, g, d, .. } = self.geo;
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
                    let (ranges, nr) = visible_ranges(self.mask.row(r), k0, k1, kt.kind);
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
                                let s = self.scale * dot(qrow, krow);
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
            let scale = self.scale as f64;
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

impl HostAttentionKernel for TiledAttention {
    fn name(&self) -> &str {
        NAME
    }

    fn forward(
        &self,
        dims: &AttnDims,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        mask: &BlockMask,
        scale: f32,
        out: &mut [f32],
        lse: &mut [f32],
    ) -> Result<(), String> {
        const OP: &str = "forward";
        let geo = Geom::new(OP, dims, mask, scale)?;
        let (ql, kl) = (geo.q_len(OP)?, geo.kv_len(OP)?);
        check_len(OP, "q", q.len(), ql, &geo.q_shape())?;
        check_len(OP, "k", k.len(), kl, &geo.kv_shape())?;
        check_len(OP, "v", v.len(), kl, &geo.kv_shape())?;
        check_len(OP, "out", out.len(), ql, &geo.q_shape())?;
        check_len(OP, "lse", lse.len(), geo.tq * geo.hq, &geo.lse_shape())?;

        let tm = TileMap::new(mask, self.q_tile, self.k_tile);
        let ctx = Ctx {
            geo,
            q,
            k,
            v,
            mask,
            scale,
            q_tile: self.q_tile,
            k_tile: self.k_tile,
        };
        // Each task owns one query tile's rows of `out` and `lse` (contiguous in this layout).
        out.par_chunks_mut(self.q_tile * geo.hq * geo.d)
            .zip(lse.par_chunks_mut(self.q_tile * geo.hq))
            .enumerate()
            .for_each(|(qt, (o, l))| ctx.forward_q_tile(qt, &tm.tiles[qt], o, l));
        Ok(())
    }

    fn backward(
        &self,
        dims: &AttnDims,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        out: &[f32],
        lse: &[f32],
        d_out: &[f32],
        mask: &BlockMask,
        scale: f32,
        dq: &mut [f32],
        dk: &mut [f32],
        dv: &mut [f32],
    ) -> Result<(), String> {
        const OP: &str = "backward";
        let geo = Geom::new(OP, dims, mask, scale)?;
        let (ql, kl) = (geo.q_len(OP)?, geo.kv_len(OP)?);
        check_len(OP, "q", q.len(), ql, &geo.q_shape())?;
        check_len(OP, "k", k.len(), kl, &geo.kv_shape())?;
        check_len(OP, "v", v.len(), kl, &geo.kv_shape())?;
        check_len(OP, "out", out.len(), ql, &geo.q_shape())?;
        check_len(OP, "lse", lse.len(), geo.tq * geo.hq, &geo.lse_shape())?;
        check_len(OP, "d_out", d_out.len(), ql, &geo.q_shape())?;
        check_len(OP, "dq", dq.len(), ql, &geo.q_shape())?;
        check_len(OP, "dk", dk.len(), kl, &geo.kv_shape())?;
        check_len(OP, "dv", dv.len(), kl, &geo.kv_shape())?;

        let d = geo.d;
        // D_i = rowsum(dO_i * O_i), per (row, head), in f64.
        let delta: Vec<f64> = out
            .par_chunks(d)
            .zip(d_out.par_chunks(d))
            .map(|(o, g)| o.iter().zip(g).map(|(&a, &b)| a as f64 * b as f64).sum())
            .collect();

        let tm = TileMap::new(mask, self.q_tile, self.k_tile);
        let k_tiles = geo.tk.div_ceil(self.k_tile);
        let by_key = transpose(&tm, k_tiles);
        let ctx = Ctx {
            geo,
            q,
            k,
            v,
            mask,
            scale,
            q_tile: self.q_tile,
            k_tile: self.k_tile,
        };

        // Pass 1: dk, dv. Each task owns one key tile's rows of dk and dv.
        let kv_chunk = self.k_tile * geo.hkv * d;
        dk.par_chunks_mut(kv_chunk)
            .zip(dv.par_chunks_mut(kv_chunk))
            .enumerate()
            .for_each(|(kt, (dk_c, dv_c))| {
                ctx.backward_k_tile(kt, &by_key[kt], lse, d_out, &delta, dk_c, dv_c)
            });
        // Pass 2: dq. Each task owns one query tile's rows of dq.
        dq.par_chunks_mut(self.q_tile * geo.hq * d)
            .enumerate()
            .for_each(|(qt, dq_c)| {
                ctx.backward_q_tile(qt, &tm.tiles[qt], lse, d_out, &delta, dq_c)
            });
        Ok(())
    }
}
