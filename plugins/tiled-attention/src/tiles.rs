//! Walking the tile map: the visible key ranges of a row inside one key tile, and the map
//! transposed (key tile -> query tiles) for the key-tile-parallel backward pass.

use dflash_core::mask::{Interval, KeyTile, TileKind, TileMap};

/// The visible keys of one query row inside the key tile `[k0, k1)`, as at most two ranges.
///
/// `Full` tiles return the whole tile without looking at the row: the tile map already proved
/// every pair visible, which is what lets the bulk of the work skip masking. `Partial` tiles
/// clip the row's intervals to the tile (the per-element test `first.contains(k) ||
/// second.contains(k)`, evaluated for whole ranges at once).
#[inline]
pub(crate) fn visible_ranges(
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
pub(crate) fn transpose(tm: &TileMap, k_tiles: usize) -> Vec<Vec<(usize, TileKind)>> {
    let mut by_key = vec![Vec::new(); k_tiles];
    for (qt, list) in tm.tiles.iter().enumerate() {
        for &KeyTile { index, kind } in list {
            by_key[index].push((qt, kind));
        }
    }
    by_key
}
