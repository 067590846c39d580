//! Masks at the edges of their integer types: intervals and windows past `i32`, lengths whose
//! sums overflow. Each is rejected or normalised, never a panic or a wrapped value.

use dflash_mask::{BlockMask, Interval, TileMap};

/// Regression: `Interval::len` subtracted in i32, so `[-2, i32::MAX)` overflowed (a panic in
/// debug; in release a wrapped length of 0 made it "empty" and skipped the bounds check), and a
/// reversed interval (public fields) skipped validation while a kernel walked
/// `start as usize..end as usize` out of bounds. Each input is rejected or normalised, never a
/// panic, and every interval of an accepted mask is EMPTY or inside `[0, kv_len)`.
#[test]
fn from_intervals_rejects_or_normalises_extreme_and_reversed_intervals() {
    assert_eq!(
        Interval::new(-2, i32::MAX).len(),
        i32::MAX as usize + 2,
        "length in i64"
    );
    assert_eq!(
        Interval {
            start: i32::MIN,
            end: i32::MAX
        }
        .len(),
        u32::MAX as usize
    );
    for iv in [
        Interval::new(-2, i32::MAX),
        Interval::new(i32::MIN, i32::MAX),
        Interval::new(i32::MIN, 1),
        Interval::new(0, i32::MAX),
    ] {
        let err = BlockMask::from_intervals(10, vec![iv], vec![Interval::EMPTY]).unwrap_err();
        assert!(err.to_string().contains("outside"), "{iv:?}: {err}");
        let err = BlockMask::from_intervals(10, vec![Interval::EMPTY], vec![iv]).unwrap_err();
        assert!(err.to_string().contains("outside"), "{iv:?}: {err}");
    }
    // Reversed intervals (start >= end) are empty, as the C ABI says: stored as EMPTY.
    let reversed = [
        Interval { start: 2, end: -1 },
        Interval {
            start: i32::MAX,
            end: i32::MIN,
        },
        Interval { start: 7, end: 7 },
        Interval { start: 50, end: 40 },
    ];
    for iv in reversed {
        // Both views agree: `len` is the i64 difference clamped at 0.
        assert!(iv.is_empty(), "{iv:?}");
        assert_eq!(iv.len(), 0, "{iv:?}");
        let mask = BlockMask::from_intervals(
            10,
            vec![iv, Interval::new(1, 4)],
            vec![Interval::new(5, 9), iv],
        )
        .unwrap();
        assert_eq!(
            mask.row(0),
            [Interval::EMPTY, Interval::new(5, 9)],
            "{iv:?}"
        );
        assert_eq!(
            mask.row(1),
            [Interval::new(1, 4), Interval::EMPTY],
            "{iv:?}"
        );
        assert_eq!(mask.visible_pairs(), 7, "{iv:?}");
        // The tile map walks the normalised intervals too.
        let tiles = TileMap::new(&mask, 2, 4);
        assert_eq!(tiles.tiles.len(), 1);
    }
    // kv_len must fit in i32 (the bounds' type); keys past it are never visible.
    let err = BlockMask::from_intervals(1usize << 31, vec![Interval::EMPTY], vec![Interval::EMPTY])
        .unwrap_err();
    assert!(err.to_string().contains("kv_len"), "{err}");
    assert!(!BlockMask::causal(3).unwrap().visible(2, 1usize << 32));
}

/// Regression: `sliding_window` and `dflash_sliding` cast the window (a `usize` from the
/// drafter's config.json) to i32, so a window of 2^32 became 0 (no context at all, silently)
/// and 2^31 overflowed. A window at least as wide as the keys is the same as no window.
#[test]
fn huge_sliding_windows_saturate_to_no_window() {
    let wide = BlockMask::dflash_sliding(20, 4, &[9], 1000).unwrap();
    for w in [1usize << 31, 1 << 32, (1 << 32) + 3, usize::MAX] {
        assert_eq!(
            BlockMask::dflash_sliding(20, 4, &[9], w).unwrap(),
            wide,
            "dflash_sliding window {w}"
        );
        assert_eq!(
            BlockMask::dflash_packed(20, 4, &[9, 15], &[0, 12], Some(w)).unwrap(),
            BlockMask::dflash_packed(20, 4, &[9, 15], &[0, 12], Some(1000)).unwrap(),
            "dflash_packed window {w}"
        );
        assert_eq!(
            BlockMask::sliding_window(10, w).unwrap(),
            BlockMask::causal(10).unwrap(),
            "sliding_window window {w}"
        );
    }
    // The wide DFlash window really shows the whole context before the anchor.
    assert_eq!(wide.row(0)[0], Interval::new(0, 9));
}

/// Overflowing geometry is an error, not an arithmetic panic.
#[test]
fn overflowing_lengths_are_errors() {
    let err = BlockMask::document(&[usize::MAX, 2]).unwrap_err();
    assert!(err.to_string().contains("total length"), "{err}");
    let err = BlockMask::document(&[1usize << 31]).unwrap_err();
    assert!(err.to_string().contains("total length"), "{err}");
    let err = BlockMask::dflash(10, 1 << 30, &[1, 2, 3, 4]).unwrap_err();
    assert!(err.to_string().contains("kv_len"), "{err}");
}
