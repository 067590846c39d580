//! `wgpu-tiled`: the block-sparse WGSL attention kernel (`shaders/attention.wgsl`). The host
//! part: tile sizes for a head dim, the tile lists of a mask (a [`TileMap`] and its
//! transpose, uploaded once per distinct mask and reused by every layer), and the dispatches
//! of the forward and the three backward kernels (`dsum`, `dq`, `dk/dv`; atomics-free and
//! deterministic).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use dflash_core::mask::{BlockMask, TileMap};
use dflash_core::{AttnDims, Result};

use crate::pipelines::{Bind, Family, Kernel};
use crate::storage::WgpuStorage;
use crate::{WgpuBackend, groups};

const FWD: Kernel<'static> = Kernel::new(Family::Attention, "attn_fwd");
const DSUM: Kernel<'static> = Kernel::new(Family::Attention, "attn_dsum");
const DQ: Kernel<'static> = Kernel::new(Family::Attention, "attn_dq");
const DKDV: Kernel<'static> = Kernel::new(Family::Attention, "attn_dkdv");

/// attention.wgsl's limits on the tile sizes: BQ * D and BK * D within `TILE` f32, BQ * BK
/// within `PAIRS` scores, BQ at most `MAX_ROWS`.
const TILE: usize = 2048;
const PAIRS: usize = 1024;
const MAX_ROWS: usize = 64;
/// The largest head dim (16 accumulator dims for each of 128 threads over a tile row).
pub(crate) const MAX_HEAD_DIM: usize = 256;
/// The shader's buffers: staged tile rows at the odd stride `D | 1` and score rows at
/// `BK | 1` (against workgroup-memory bank conflicts), so each holds up to `MAX_ROWS` more
/// words than the limits above.
const TILE_BUF: usize = TILE + MAX_ROWS;
const PAIRS_BUF: usize = PAIRS + MAX_ROWS;
/// Workgroup memory the kernels declare, in bytes (three tiles, the scores, two per-thread
/// statistics, the row intervals, the list bounds): 31752, within the 32 KiB every desktop
/// GPU and llvmpipe give.
const WORKGROUP_BYTES: u32 = 4 * (3 * TILE_BUF + PAIRS_BUF + 2 * 128 + 256 + 2) as u32;

/// Masks whose tile lists stay on the device (a step's forward and backward share one).
const CACHED: usize = 4;

/// `(BQ, BK)` for head dim `d`: BQ * D and BK * D within a tile, BQ * BK within the scores,
/// BQ a power of two dividing the 128 threads.
fn tile_sizes(d: usize) -> (usize, usize) {
    let fit = TILE / d.max(1);
    let pow2 = |n: usize| {
        if n == 0 {
            0
        } else {
            1 << (usize::BITS - 1 - n.leading_zeros())
        }
    };
    let bq = pow2(fit.min(MAX_ROWS));
    let bk = pow2(fit.min(32)).min(PAIRS / bq);
    (bq, bk)
}

/// The tile lists and intervals of one mask, as attention.wgsl's `meta` buffer.
pub(crate) struct Meta {
    buf: WgpuStorage,
    /// The longest key-tile list of a query tile, and query-tile list of a key tile.
    max_q_list: usize,
    max_k_list: usize,
    qlist_at: u32,
    koff_at: u32,
    klist_at: u32,
    ivs_at: u32,
}

type MetaKey = (BlockMask, usize, usize);

#[derive(Default)]
pub(crate) struct MetaCache(Mutex<VecDeque<(MetaKey, Arc<Meta>)>>);

/// `[q_off][q_list][k_off][k_list][ivs]` of `mask` for tiles `(bq, bk)`.
fn meta_words(mask: &BlockMask, bq: usize, bk: usize) -> (Vec<u32>, [u32; 4], [usize; 2]) {
    let map = TileMap::new(mask, bq, bk);
    let nkt = mask.kv_len().div_ceil(bk);
    let mut by_key: Vec<Vec<u32>> = vec![Vec::new(); nkt];
    let mut words = vec![0u32];
    let mut list = Vec::new();
    for (qt, tiles) in map.tiles.iter().enumerate() {
        for t in tiles {
            list.push(t.index as u32);
            by_key[t.index].push(qt as u32);
        }
        words.push(list.len() as u32);
    }
    let qlist_at = words.len() as u32;
    words.extend(list);
    let koff_at = words.len() as u32;
    let mut at = 0u32;
    words.push(0);
    for qs in &by_key {
        at += qs.len() as u32;
        words.push(at);
    }
    let klist_at = words.len() as u32;
    let max_k = by_key.iter().map(Vec::len).max().unwrap_or(0);
    words.extend(by_key.into_iter().flatten());
    let ivs_at = words.len() as u32;
    for r in 0..mask.q_len() {
        for iv in mask.row(r) {
            words.push(iv.start as u32);
            words.push(iv.end as u32);
        }
    }
    let max_q = map.tiles.iter().map(Vec::len).max().unwrap_or(0);
    (words, [qlist_at, koff_at, klist_at, ivs_at], [max_q, max_k])
}

impl WgpuBackend {
    fn meta(&self, op: &'static str, mask: &BlockMask, bq: usize, bk: usize) -> Result<Arc<Meta>> {
        let key = (mask.clone(), bq, bk);
        let mut cache = self.attn_meta.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = cache.iter().position(|(k, _)| *k == key) {
            let hit = cache.remove(i).expect("index from position");
            let m = hit.1.clone();
            cache.push_front(hit);
            return Ok(m);
        }
        let (words, [qlist_at, koff_at, klist_at, ivs_at], [max_q_list, max_k_list]) =
            meta_words(mask, bq, bk);
        let m = Arc::new(Meta {
            buf: self.ctx.upload_u32(op, &words)?,
            max_q_list,
            max_k_list,
            qlist_at,
            koff_at,
            klist_at,
            ivs_at,
        });
        cache.push_front((key, m.clone()));
        cache.truncate(CACHED);
        Ok(m)
    }

    /// Checks what `wgpu-tiled` supports: the head dim, the adapter's workgroup memory, and
    /// operands that fit one binding each (large tensors are not chunked here yet).
    fn tiled_check(&self, op: &'static str, dims: &AttnDims, sizes: &[usize]) -> Result<()> {
        let d = dims.head_dim;
        if d == 0 || d > MAX_HEAD_DIM {
            return Err(self.err(
                op,
                format!("wgpu-tiled supports head_dim 1..={MAX_HEAD_DIM}, got {d}"),
            ));
        }
        let have = self.ctx.limits.max_compute_workgroup_storage_size;
        if have < WORKGROUP_BYTES {
            return Err(self.err(
                op,
                format!(
                    "wgpu-tiled needs {WORKGROUP_BYTES} bytes of workgroup memory; the adapter \
                     has {have}"
                ),
            ));
        }
        let max = self.max_binding_elems();
        if let Some(&n) = sizes.iter().find(|&&n| n > max) {
            return Err(self.err(
                op,
                format!(
                    "wgpu-tiled: an operand of {n} elements exceeds one storage binding \
                     ({max} elements); chunked attention is not yet implemented on wgpu"
                ),
            ));
        }
        Ok(())
    }

    fn attn_params(
        &self,
        dims: &AttnDims,
        scale: f32,
        m: &Meta,
        (bq, bk): (usize, usize),
    ) -> [u32; 16] {
        [
            dims.q_rows as u32,
            dims.kv_rows as u32,
            dims.q_heads as u32,
            dims.kv_heads as u32,
            dims.head_dim as u32,
            bq as u32,
            bk as u32,
            dims.group() as u32,
            scale.to_bits(),
            m.qlist_at,
            m.koff_at,
            m.klist_at,
            m.ivs_at,
            0,
            0,
            0,
        ]
    }

    /// List iterations one dispatch may run: unbounded on GPUs; on a CPU adapter (llvmpipe
    /// stops every invocation after 65535 loop iterations in all) as many as keep an
    /// invocation's loop iterations under 60000, counted generously for the heaviest kernel
    /// (three dot-product phases over its pairs, two accumulation phases of BQ or BK steps
    /// with 16 dims each, the tile loads).
    fn per_pass(&self, d: usize, (bq, bk): (usize, usize)) -> usize {
        if self.ctx.info.device_type != wgpu::DeviceType::Cpu {
            return usize::MAX;
        }
        let cost = 3 * (bq * bk).div_ceil(128) * d + 2 * 17 * bq.max(bk) + 4 * TILE / 128 + 64;
        (60_000 / cost).max(1)
    }

    /// Dispatches `k` once per pass over `len` list iterations (at least one pass), setting
    /// each pass's range and first/last flags in `p`.
    #[allow(clippy::too_many_arguments)]
    fn passes(
        &self,
        op: &'static str,
        k: &Kernel<'_>,
        mut p: [u32; 16],
        per: usize,
        len: usize,
        reads: &[Bind<'_>],
        writes: &[Bind<'_>],
        groups: u64,
    ) -> Result<()> {
        for [first, count, flags] in pass_words(per, len) {
            (p[13], p[14], p[15]) = (first, count, flags);
            self.ctx.dispatch(op, k, &p, reads, writes, groups)?;
        }
        Ok(())
    }

    /// The forward into `out (Tq, Hq, D)` and `lse (Tq, Hq)`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn tiled_forward(
        &self,
        op: &'static str,
        dims: &AttnDims,
        mask: &BlockMask,
        scale: f32,
        [q, k, v]: [&WgpuStorage; 3],
        out: &WgpuStorage,
        lse: &WgpuStorage,
    ) -> Result<()> {
        self.tiled_check(op, dims, &[q.len, k.len])?;
        if out.len == 0 {
            return Ok(());
        }
        let tiles = tile_sizes(dims.head_dim);
        let m = self.meta(op, mask, tiles.0, tiles.1)?;
        let p = self.attn_params(dims, scale, &m, tiles);
        let per = self.per_pass(dims.head_dim, tiles);
        // The row state between passes: (max, sum, NaN seen) per (row, head).
        let state_len = if m.max_q_list > per { 3 * lse.len } else { 3 };
        let state = self.ctx.alloc(op, state_len)?;
        let reads = [q.bind(), k.bind(), v.bind(), m.buf.bind()];
        let writes = [out.bind(), lse.bind(), state.bind()];
        let g = (dims.q_rows.div_ceil(tiles.0) * dims.q_heads) as u64;
        self.passes(op, &FWD, p, per, m.max_q_list, &reads, &writes, g)
    }

    /// The backward into `dq`, `dk`, `dv` (shaped as `q`, `k`, `v`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn tiled_backward(
        &self,
        op: &'static str,
        dims: &AttnDims,
        mask: &BlockMask,
        scale: f32,
        [q, k, v, out, lse, d_out]: [&WgpuStorage; 6],
        [dq, dk, dv]: [&WgpuStorage; 3],
    ) -> Result<()> {
        self.tiled_check(op, dims, &[q.len, k.len])?;
        let tiles = tile_sizes(dims.head_dim);
        let m = self.meta(op, mask, tiles.0, tiles.1)?;
        let p = self.attn_params(dims, scale, &m, tiles);
        let dsum = self.ctx.alloc(op, lse.len)?;
        let base: [Bind<'_>; 4] = [q.bind(), k.bind(), v.bind(), m.buf.bind()];
        let rows = dims.q_rows * dims.q_heads;
        let mut reads = base.to_vec();
        reads.extend([d_out.bind(), out.bind()]);
        self.ctx
            .dispatch(op, &DSUM, &p, &reads, &[dsum.bind()], groups(rows, 128))?;
        let mut reads = base.to_vec();
        reads.extend([d_out.bind(), lse.bind(), dsum.bind()]);
        let per = self.per_pass(dims.head_dim, tiles);
        if dq.len > 0 {
            let g = (dims.q_rows.div_ceil(tiles.0) * dims.q_heads) as u64;
            self.passes(op, &DQ, p, per, m.max_q_list, &reads, &[dq.bind()], g)?;
        }
        if dk.len > 0 {
            let g = (dims.kv_rows.div_ceil(tiles.1) * dims.kv_heads) as u64;
            let len = m.max_k_list * dims.group();
            let writes = [dk.bind(), dv.bind()];
            self.passes(op, &DKDV, p, per, len, &reads, &writes, g)?;
        }
        Ok(())
    }
}

/// `[w_first, w_count, flags]` of each pass over `len` list iterations, `per` at a time (at
/// least one pass). A count never exceeds `len`: the shader adds it to where a tile's list
/// starts in the concatenated lists, so `u32::MAX` standing for "all" would wrap.
fn pass_words(per: usize, len: usize) -> Vec<[u32; 3]> {
    let per = per.clamp(1, len.max(1));
    let n = len.div_ceil(per).max(1);
    (0..n)
        .map(|i| {
            let flags = (i == 0) as u32 | (((i + 1 == n) as u32) << 1);
            [(i * per) as u32, per as u32, flags]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shader's `pass_range` on the host: the iterations a pass runs of the list
    /// `[lo, hi)`.
    fn pass_range([first, count, _]: [u32; 3], lo: u32, hi: u32) -> std::ops::Range<u32> {
        let a = lo + first.min(hi - lo);
        a..a + count.min(hi - a)
    }

    #[test]
    fn passes_cover_every_list_once_without_wrapping() {
        // (per, max list length): a GPU's single pass (per = usize::MAX), a CPU adapter's
        // splits, a pass longer than the lists, empty lists.
        for (per, len) in [
            (usize::MAX, 7),
            (3, 7),
            (7, 7),
            (100, 7),
            (usize::MAX, 0),
            (1, 1),
        ] {
            let words = pass_words(per, len);
            assert_eq!(words[0][2] & 1, 1, "the first pass is flagged first");
            assert_eq!(
                words.last().unwrap()[2] & 2,
                2,
                "the last pass is flagged last"
            );
            assert!(
                words.iter().all(|w| w[1] as usize <= len.max(1)),
                "{words:?}"
            );
            // Lists of every length up to `len`, starting deep into the concatenated lists
            // (near u32::MAX, where an unclamped count wraps).
            for lo in [0u32, 5, u32::MAX - 10] {
                for l in 0..=len as u32 {
                    let hi = lo + l;
                    let seen: Vec<u32> =
                        words.iter().flat_map(|&w| pass_range(w, lo, hi)).collect();
                    assert_eq!(
                        seen,
                        (lo..hi).collect::<Vec<_>>(),
                        "per {per} len {len} lo {lo}"
                    );
                }
            }
        }
    }

    #[test]
    fn tile_sizes_fit_the_kernel_buffers() {
        for d in 1..=MAX_HEAD_DIM {
            let (bq, bk) = tile_sizes(d);
            assert!(bq.is_power_of_two() && bq <= 64 && 128 % bq == 0, "d {d}");
            assert!(bk >= 1 && 128 % bk == 0 && bk <= 32, "d {d}");
            assert!(
                bq * d <= TILE && bk * d <= TILE && bq * bk <= PAIRS,
                "d {d}"
            );
            // The padded layouts fit the shader's buffers.
            assert!(
                bq * (d | 1) <= TILE_BUF && bk * (d | 1) <= TILE_BUF,
                "d {d}"
            );
            assert!(bq * (bk | 1) <= PAIRS_BUF, "d {d}");
            // 16 accumulator dims per thread suffice.
            assert!(
                d.div_ceil(128 / bq) <= 16 && d.div_ceil(128 / bk) <= 16,
                "d {d}"
            );
        }
    }

    /// The lists name exactly the tiles with a visible pair, in both directions.
    #[test]
    fn meta_lists_are_each_others_transpose() {
        let mask = BlockMask::dflash(40, 4, &[3, 9, 10, 30, -1]).unwrap();
        let (w, [ql, ko, kl, iv], _) = meta_words(&mask, 8, 4);
        let nqt = mask.q_len().div_ceil(8);
        let nkt = mask.kv_len().div_ceil(4);
        let mut pairs = Vec::new();
        for qt in 0..nqt {
            for it in w[qt]..w[qt + 1] {
                pairs.push((qt as u32, w[ql as usize + it as usize]));
            }
        }
        let mut back = Vec::new();
        for kt in 0..nkt {
            let (lo, hi) = (w[ko as usize + kt], w[ko as usize + kt + 1]);
            for it in lo..hi {
                back.push((w[kl as usize + it as usize], kt as u32));
            }
        }
        back.sort();
        assert_eq!(pairs, back);
        for (qt, kt) in &pairs {
            let any = (0..8)
                .map(|i| *qt as usize * 8 + i)
                .filter(|&r| r < mask.q_len())
                .any(|r| (0..4).any(|j| mask.visible(r, *kt as usize * 4 + j)));
            assert!(any, "tile ({qt}, {kt}) listed without a visible pair");
        }
        assert_eq!(w.len() - iv as usize, 4 * mask.q_len());
    }
}
