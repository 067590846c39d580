//! The tile lists of a mask on the device (attention.wgsl's `tiles` buffer): which key tiles
//! each query tile visits and the transpose, full-tile flags, the order workgroups take tiles
//! in, and each query row's key intervals; built on the host once per distinct mask and tile
//! size and reused by every layer of a step (a small cache).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use dflash_core::Result;
use dflash_core::mask::{BlockMask, TileKind, TileMap};

use crate::WgpuBackend;
use crate::storage::WgpuStorage;

/// Masks whose tile lists stay on the device (a step's forward and backward share them; each
/// kernel has its own tile sizes).
const CACHED: usize = 8;

/// The tile lists and intervals of one mask, as attention.wgsl's `meta` buffer.
pub(crate) struct Meta {
    pub(super) buf: WgpuStorage,
    /// The longest key-tile list of a query tile, and query-tile list of a key tile.
    pub(super) max_q_list: usize,
    pub(super) max_k_list: usize,
    pub(super) qlist_at: u32,
    pub(super) koff_at: u32,
    pub(super) klist_at: u32,
    pub(super) ivs_at: u32,
}

type MetaKey = (BlockMask, usize, usize);

#[derive(Default)]
pub(crate) struct MetaCache(Mutex<VecDeque<(MetaKey, Arc<Meta>)>>);

/// The list entries' full-tile flag (attention.wgsl's `FULL`).
const FULL: u32 = 1 << 31;

/// `[q_off][q_order][q_list][k_off][k_order][k_list][ivs]` of `mask` for tiles `(bq, bk)`;
/// list entries carry [`FULL`] on tiles whose every pair is visible. The orders are the tiles
/// by descending list length (ties by index), the order in which the kernels' workgroups take
/// them: the longest first, so that short ones fill the end of the dispatch instead of a long
/// one running alone (causal and DFlash masks list more tiles the later the row).
fn meta_words(mask: &BlockMask, bq: usize, bk: usize) -> (Vec<u32>, [u32; 4], [usize; 2]) {
    let map = TileMap::new(mask, bq, bk);
    let nkt = mask.kv_len().div_ceil(bk);
    let mut by_key: Vec<Vec<u32>> = vec![Vec::new(); nkt];
    let mut words = vec![0u32];
    let mut list = Vec::new();
    for (qt, tiles) in map.tiles.iter().enumerate() {
        for t in tiles {
            let full = if t.kind == TileKind::Full { FULL } else { 0 };
            list.push(t.index as u32 | full);
            by_key[t.index].push(qt as u32 | full);
        }
        words.push(list.len() as u32);
    }
    words.extend(longest_first(map.tiles.iter().map(Vec::len)));
    let qlist_at = words.len() as u32;
    words.extend(list);
    let koff_at = words.len() as u32;
    let mut at = 0u32;
    words.push(0);
    for qs in &by_key {
        at += qs.len() as u32;
        words.push(at);
    }
    words.extend(longest_first(by_key.iter().map(Vec::len)));
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

/// The indices of `lens` by descending length, ties in index order.
fn longest_first(lens: impl Iterator<Item = usize>) -> Vec<u32> {
    let lens: Vec<usize> = lens.collect();
    let mut order: Vec<u32> = (0..lens.len() as u32).collect();
    order.sort_by_key(|&i| std::cmp::Reverse(lens[i as usize]));
    order
}

impl WgpuBackend {
    pub(super) fn meta(
        &self,
        op: &'static str,
        mask: &BlockMask,
        bq: usize,
        bk: usize,
    ) -> Result<Arc<Meta>> {
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
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let full: Vec<bool> = pairs.iter().map(|p| p.1 & FULL != 0).collect();
        assert!(full.iter().any(|&f| f) && full.iter().any(|&f| !f));
        let mut back = Vec::new();
        for kt in 0..nkt {
            let (lo, hi) = (w[ko as usize + kt], w[ko as usize + kt + 1]);
            for it in lo..hi {
                back.push((w[kl as usize + it as usize], kt as u32));
            }
        }
        // The orders (after each offset array, where attention.wgsl's q_tile_of / k_tile_of
        // read them): every tile once, lists never growing, ties in index order.
        let q_order = &w[nqt + 1..ql as usize];
        let k_order = &w[ko as usize + nkt + 1..kl as usize];
        for (order, off, n) in [(q_order, 0, nqt), (k_order, ko as usize, nkt)] {
            let len = |t: u32| w[off + t as usize + 1] - w[off + t as usize];
            let mut seen: Vec<u32> = order.to_vec();
            seen.sort();
            assert_eq!(seen, (0..n as u32).collect::<Vec<_>>());
            for p in order.windows(2) {
                assert!(len(p[0]) > len(p[1]) || (len(p[0]) == len(p[1]) && p[0] < p[1]));
            }
            assert!(
                order.windows(2).any(|p| p[0] > p[1]),
                "not the identity here"
            );
        }
        back.sort_by_key(|&(q, k)| (q & !FULL, k));
        let back: Vec<(u32, u32)> = back.iter().map(|&(q, k)| (q & !FULL, k)).collect();
        let pairs: Vec<(u32, u32)> = pairs.iter().map(|&(q, k)| (q, k & !FULL)).collect();
        assert_eq!(pairs, back);
        for (i, (qt, kt)) in pairs.iter().enumerate() {
            let rows = (0..8)
                .map(|r| *qt as usize * 8 + r)
                .filter(|&r| r < mask.q_len());
            let keys: Vec<usize> = (0..4)
                .map(|j| *kt as usize * 4 + j)
                .filter(|&j| j < mask.kv_len())
                .collect();
            let all = rows
                .clone()
                .all(|r| keys.iter().all(|&j| mask.visible(r, j)));
            assert_eq!(all, full[i], "tile ({qt}, {kt}) full flag");
        }
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
