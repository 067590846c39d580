//! Per-tile summary of a [`BlockMask`], the shape tiled kernels iterate over.
//!
//! With anchors sorted, a query tile spans a narrow anchor range, so most key tiles are either
//! fully visible (no per-element masking needed) or invisible (skipped); only a thin band is
//! partial.

use crate::BlockMask;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TileKind {
    /// Every (row, key) pair of the tile is visible: no per-element mask check needed.
    Full,
    /// Some pairs are visible: check each element against the row's intervals.
    Partial,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyTile {
    pub index: usize,
    pub kind: TileKind,
}

/// For each query tile, the key tiles with any visible pair, in increasing order.
#[derive(Debug, Clone)]
pub struct TileMap {
    pub q_tile: usize,
    pub k_tile: usize,
    pub tiles: Vec<Vec<KeyTile>>,
}

impl TileMap {
    pub fn new(mask: &BlockMask, q_tile: usize, k_tile: usize) -> Self {
        assert!(
            q_tile > 0 && k_tile > 0,
            "tile sizes are positive constants of the kernel"
        );
        let q_tiles = mask.q_len().div_ceil(q_tile);
        let k_tiles = mask.kv_len().div_ceil(k_tile);
        let mut tiles = Vec::with_capacity(q_tiles);
        for qt in 0..q_tiles {
            let rows = qt * q_tile..((qt + 1) * q_tile).min(mask.q_len());
            let mut list = Vec::new();
            // Only key tiles touched by some row's interval can be visible.
            let (mut lo, mut hi) = (usize::MAX, 0usize);
            for r in rows.clone() {
                for iv in mask.row(r) {
                    if !iv.is_empty() {
                        lo = lo.min(iv.start as usize / k_tile);
                        hi = hi.max((iv.end as usize - 1) / k_tile + 1);
                    }
                }
            }
            for kt in lo..hi.min(k_tiles) {
                let k0 = (kt * k_tile) as i32;
                let k1 = (((kt + 1) * k_tile).min(mask.kv_len())) as i32;
                let width = (k1 - k0) as usize;
                let (mut any, mut all) = (false, true);
                for r in rows.clone() {
                    let seen: usize = mask
                        .row(r)
                        .iter()
                        .map(|iv| (iv.end.min(k1) - iv.start.max(k0)).max(0) as usize)
                        .sum();
                    any |= seen > 0;
                    all &= seen == width;
                }
                if any {
                    let kind = if all {
                        TileKind::Full
                    } else {
                        TileKind::Partial
                    };
                    list.push(KeyTile { index: kt, kind });
                }
            }
            tiles.push(list);
        }
        TileMap {
            q_tile,
            k_tile,
            tiles,
        }
    }

    /// Counts of (full, partial) tiles over the whole mask.
    pub fn counts(&self) -> (usize, usize) {
        let mut full = 0;
        let mut partial = 0;
        for t in self.tiles.iter().flatten() {
            match t.kind {
                TileKind::Full => full += 1,
                TileKind::Partial => partial += 1,
            }
        }
        (full, partial)
    }
}
