//! The tile configurations against the kernels and the limits, and the passes of a list
//! (`plan.rs`).

use super::*;
use crate::attention::plan::pass_words;

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
                let seen: Vec<u32> = words.iter().flat_map(|&w| pass_range(w, lo, hi)).collect();
                assert_eq!(
                    seen,
                    (lo..hi).collect::<Vec<_>>(),
                    "per {per} len {len} lo {lo}"
                );
            }
        }
    }
}

/// The wide-tile forward at head dim 128 (what `attn_wide_tiles` is for): 32 x 64 tiles,
/// 256 threads, within the 48 KiB the H200's Vulkan driver gives a workgroup, and taken
/// by 32-lane subgroups; without query registers its tiles would not fit.
#[test]
fn wide_tiles_fit_head_dim_128_in_48_kib() {
    let c = AttnCfg::choose(AttnKind::Fwd, 128, false, 48 * 1024).unwrap();
    assert!(c.fits_subgroups(32, 32), "{c:?}");
    let wide = c.with_wide_tiles();
    assert_eq!((wide.bq, wide.bk, wide.threads()), (32, 64, 256));
    assert!(wide.fits_subgroups(32, 32), "{wide:?}");
    assert!(wide.bytes() + MARGIN <= 48 * 1024, "{} bytes", wide.bytes());
    let staged = AttnCfg {
        qreg: false,
        ..wide
    };
    assert!(!staged.fits_subgroups(32, 32));
    assert!(AttnCfg { kpl: 1, ..staged }.bytes() + MARGIN > 48 * 1024);
}

#[test]
fn configurations_fit_the_kernels_and_the_limits() {
    for limit in [32 * 1024, 48 * 1024, 64 * 1024] {
        for d in 1..=MAX_HEAD_DIM {
            for kind in [AttnKind::Fwd, AttnKind::Dq, AttnKind::Dkdv] {
                let c = AttnCfg::choose(kind, d, false, limit).unwrap();
                assert!(c.bytes() + MARGIN <= limit, "{c:?}");
                // Whole-vec4 reads only where every row starts on a vec4, never from an
                // empty operand (a vec4 binding needs 16 bytes).
                assert_eq!(c.vec4, d.is_multiple_of(4), "{c:?}");
                assert!(!AttnCfg::choose(kind, d, true, limit).unwrap().vec4);
                assert!(c.dp as usize >= d && c.dp.is_power_of_two() && c.dp >= 32);
                // 4-row (4-key) groups, 2-key (2-row) score blocks, whole thread groups.
                assert!(c.bq.is_multiple_of(8) && c.bk.is_multiple_of(8), "{c:?}");
                assert!(
                    c.threads().is_multiple_of(32) && c.threads() <= 256,
                    "{c:?}"
                );
                let rows = if kind == AttnKind::Dkdv { c.bk } else { c.bq };
                assert_eq!(c.threads(), rows / 4 * (c.dp / 8), "{c:?}");
                assert_eq!(c.threads(), 128, "{c:?}");
                // The forward's row phase: every row's threads take at least one key.
                if kind == AttnKind::Fwd {
                    assert!(c.threads().is_multiple_of(c.bq) && c.threads() / c.bq <= c.bk);
                }
            }
        }
    }
    // The H200's 48 KiB at head dim 128.
    let c = |k| AttnCfg::choose(k, 128, false, 48 * 1024).unwrap().tiles();
    assert_eq!(
        [c(AttnKind::Fwd), c(AttnKind::Dq), c(AttnKind::Dkdv)],
        [(32, 32), (32, 32), (32, 32)]
    );
    // lavapipe's and llvmpipe's 32 KiB.
    let c = |k| AttnCfg::choose(k, 128, false, 32 * 1024).unwrap().tiles();
    assert_eq!(
        [c(AttnKind::Fwd), c(AttnKind::Dq), c(AttnKind::Dkdv)],
        [(32, 16), (32, 16), (16, 32)]
    );
    assert!(AttnCfg::choose(AttnKind::Fwd, 128, false, 16 * 1024).is_err());
}

#[test]
fn the_subgroup_softmax_fits_the_head_dim_128_forward_only() {
    let c = |k, d| AttnCfg::choose(k, d, false, 48 * 1024).unwrap();
    let fwd = c(AttnKind::Fwd, 128);
    // NVIDIA's and Apple's 32 lanes, AMD's 32 or 64: a 32-lane row group in one subgroup.
    assert!(fwd.fits_subgroups(32, 32));
    assert!(fwd.fits_subgroups(32, 64));
    // lavapipe's 8 lanes and 16-lane subgroups split a row group; a subgroup wider than
    // the workgroup.
    assert!(!fwd.fits_subgroups(8, 8));
    assert!(!fwd.fits_subgroups(16, 32));
    assert!(!fwd.fits_subgroups(512, 512));
    assert_eq!(AttnCfg { sg: true, ..fwd }.threads(), 256);
    // Tiles whose keys do not match the accumulators' dims; the backward kernels.
    assert!(!c(AttnKind::Fwd, 64).fits_subgroups(32, 32));
    assert!(!c(AttnKind::Fwd, 256).fits_subgroups(32, 32));
    assert!(
        !AttnCfg::choose(AttnKind::Fwd, 128, false, 64 * 1024)
            .unwrap()
            .fits_subgroups(32, 32)
    );
    assert!(!c(AttnKind::Dq, 128).fits_subgroups(32, 32));
    // dq on subgroups holds q and d_out in registers: only so.
    let dq = AttnCfg {
        qreg: true,
        ..c(AttnKind::Dq, 128)
    };
    assert!(dq.fits_subgroups(32, 32), "{dq:?}");
    assert_eq!(AttnCfg { sg: true, ..dq }.threads(), 256);
    assert!(!c(AttnKind::Dkdv, 128).fits_subgroups(32, 32));
}
