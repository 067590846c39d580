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
//! - **Vectorised inner loops.** A key tile of K (and V, in the backward) is transposed once per
//!   tile and kv head, so a row's scores are a loop across keys with the sum over the head dim
//!   kept in registers; `exp` is a polynomial (no libm call per score) and the tile max uses
//!   fixed partials. Each pass is compiled twice, for baseline x86-64 and for AVX2, and picked
//!   at run time; without FMA and with every sum in a fixed order both give the same bits
//!   (`dense`, `simd`).
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
//! - **Never panics on user input**: calls arrive validated ([`AttnForward::new`] checks the dims
//!   against the mask and every slice length, with overflow-safe arithmetic); the kernel checks
//!   the one thing of its own, a finite scale, and errors come back as `Err(String)`.

mod backward;
mod context;
mod dense;
mod forward;
mod geometry;
mod simd;
mod tiles;

use dflash_core::mask::TileMap;
use dflash_core::registry::AttentionKernelRegistration;
use dflash_core::{AttnBackward, AttnForward, AttnInputs, HostAttentionKernel};
use rayon::prelude::*;

use backward::RowTerms;
use context::Ctx;
use geometry::Geom;
use tiles::transpose;

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

    /// The context every task of one call reads; errors name the op.
    fn ctx<'a>(&self, op: &str, input: AttnInputs<'a>) -> Result<Ctx<'a>, String> {
        Ok(Ctx {
            geo: Geom::new(op, &input.dims, input.scale)?,
            input,
            q_tile: self.q_tile,
            k_tile: self.k_tile,
        })
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

impl HostAttentionKernel for TiledAttention {
    fn name(&self) -> &str {
        NAME
    }

    fn forward(&self, call: AttnForward<'_>) -> Result<(), String> {
        let ctx = self.ctx("forward", call.input)?;
        let tm = TileMap::new(call.input.mask, self.q_tile, self.k_tile);
        let (hq, d) = (ctx.geo.hq, ctx.geo.d);
        // Each task owns one query tile's rows of `out` and `lse` (contiguous in this layout).
        call.out
            .par_chunks_mut(self.q_tile * hq * d)
            .zip(call.lse.par_chunks_mut(self.q_tile * hq))
            .enumerate()
            .for_each(|(qt, (o, l))| ctx.forward_q_tile(qt, &tm.tiles[qt], o, l));
        Ok(())
    }

    fn backward(&self, call: AttnBackward<'_>) -> Result<(), String> {
        let ctx = self.ctx("backward", call.input)?;
        let (lse, d_out) = (call.lse, call.d_out);
        let geo = ctx.geo;
        let d = geo.d;
        // D_i = rowsum(dO_i * O_i), per (row, head), in f64.
        let delta: Vec<f64> = call
            .out
            .par_chunks(d)
            .zip(d_out.par_chunks(d))
            .map(|(o, g)| o.iter().zip(g).map(|(&a, &b)| a as f64 * b as f64).sum())
            .collect();

        let tm = TileMap::new(call.input.mask, self.q_tile, self.k_tile);
        let k_tiles = geo.tk.div_ceil(self.k_tile);
        let by_key = transpose(&tm, k_tiles);
        let terms = RowTerms {
            lse,
            d_out,
            delta: &delta,
        };

        // Pass 1: dk, dv. Each task owns one key tile's rows of dk and dv.
        let kv_chunk = self.k_tile * geo.hkv * d;
        call.dk
            .par_chunks_mut(kv_chunk)
            .zip(call.dv.par_chunks_mut(kv_chunk))
            .enumerate()
            .for_each(|(kt, (dk_c, dv_c))| {
                ctx.backward_k_tile(kt, &by_key[kt], &terms, dk_c, dv_c)
            });
        // Pass 2: dq. Each task owns one query tile's rows of dq.
        call.dq
            .par_chunks_mut(self.q_tile * geo.hq * d)
            .enumerate()
            .for_each(|(qt, dq_c)| ctx.backward_q_tile(qt, &tm.tiles[qt], &terms, dq_c));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dflash_core::AttnDims;
    use dflash_core::mask::BlockMask;

    /// Forward and backward outputs (out, lse, dq, dk, dv) as bits.
    fn run(p: &(AttnDims, BlockMask, [Vec<f32>; 4])) -> Vec<Vec<u32>> {
        let (dims, mask, [q, k, v, d_out]) = p;
        let kernel = TiledAttention::new();
        let nl = dims.q_rows * dims.q_heads;
        let (mut out, mut lse) = (vec![f32::NAN; q.len()], vec![f32::NAN; nl]);
        AttnForward::new(dims, mask, 0.17, [q, k, v], [&mut out, &mut lse])
            .and_then(|c| kernel.forward(c))
            .unwrap();
        let mut dq = vec![f32::NAN; q.len()];
        let (mut dk, mut dv) = (vec![f32::NAN; k.len()], vec![f32::NAN; k.len()]);
        AttnBackward::new(
            dims,
            mask,
            0.17,
            [q, k, v, &out, &lse, d_out],
            [&mut dq, &mut dk, &mut dv],
        )
        .and_then(|c| kernel.backward(c))
        .unwrap();
        [out, lse, dq, dk, dv]
            .iter()
            .map(|t| t.iter().map(|x| x.to_bits()).collect())
            .collect()
    }

    /// The AVX2 copies and the baseline ones give the same bits (a no-op comparison on a CPU
    /// without AVX2). Head dim 43 (32 + 8 + 3 columns) and 142 keys (a last tile of 14 = 8 + 6)
    /// exercise every block width of the helpers.
    #[test]
    fn avx2_and_baseline_copies_agree_bitwise() {
        let anchors: Vec<i32> = (0..9).map(|b| 7 * b + 2).chain([-1]).collect();
        let mask = BlockMask::dflash(70, 8, &anchors).unwrap();
        let dims = AttnDims {
            q_rows: mask.q_len(),
            kv_rows: mask.kv_len(),
            q_heads: 4,
            kv_heads: 2,
            head_dim: 43,
        };
        let fill = |seed: u32, n: usize| -> Vec<f32> {
            (0..n)
                .map(|i| ((i as u32).wrapping_mul(2_654_435_761) ^ seed) % 1000)
                .map(|u| u as f32 / 250.0 - 2.0)
                .collect()
        };
        let nq = dims.q_rows * dims.q_heads * dims.head_dim;
        let nk = dims.kv_rows * dims.kv_heads * dims.head_dim;
        let p = (
            dims,
            mask,
            [fill(1, nq), fill(2, nk), fill(3, nk), fill(4, nq)],
        );
        let best = run(&p);
        simd::BASELINE_ONLY.store(true, std::sync::atomic::Ordering::Relaxed);
        let baseline = run(&p);
        simd::BASELINE_ONLY.store(false, std::sync::atomic::Ordering::Relaxed);
        for (i, name) in ["out", "lse", "dq", "dk", "dv"].iter().enumerate() {
            assert!(best[i] == baseline[i], "{name} differs between the copies");
        }
    }
}
