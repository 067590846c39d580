//! Data-driven tests of the mask builders and the tile map.
//!
//! Every builder is checked against its dense expansion (`to_dense_oracle`, test-only), the
//! DFlash semantics of docs/design.md §2.3 are spot-checked (with regression tests for two bugs of
//! earlier implementations), the tile map is checked to be exact, and the DFlash density at the
//! paper's shape is pinned.

use dflash_mask::{BlockMask, Interval, MaskError, TileKind, TileMap};

/// splitmix64: a tiny deterministic generator, so this crate needs no dev-dependencies.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// `n` distinct anchors from `[0, s - 1)`, sorted: how the training batch samples them
/// (positions `i` with a successor, without replacement).
fn sample_anchors(seed: u64, s: usize, n: usize) -> Vec<i32> {
    let mut rng = SplitMix(seed);
    let mut pool: Vec<i32> = (0..(s - 1) as i32).collect();
    for i in 0..n {
        let j = i + rng.below(pool.len() - i);
        pool.swap(i, j);
    }
    let mut a = pool[..n].to_vec();
    a.sort_unstable();
    a
}

/// The masks every generic property is checked on.
fn cases() -> Vec<(&'static str, BlockMask)> {
    vec![
        (
            "dflash_basic",
            BlockMask::dflash(20, 4, &[3, 9, 15]).unwrap(),
        ),
        // Anchors closer than block_size, and a duplicate: positions overlap.
        (
            "dflash_overlap",
            BlockMask::dflash(40, 4, &[3, 5, 5, 6, 20, 21, 38, 39]).unwrap(),
        ),
        // Anchor 0 sees no context; negative anchors are padding blocks (also in the middle).
        (
            "dflash_padding",
            BlockMask::dflash(37, 5, &[0, 2, -1, 15, 16, -1, -7]).unwrap(),
        ),
        (
            "dflash_all_padding",
            BlockMask::dflash(8, 3, &[-1, -1]).unwrap(),
        ),
        (
            "dflash_random",
            BlockMask::dflash(300, 16, &sample_anchors(7, 300, 24)).unwrap(),
        ),
        ("dflash_bs1", BlockMask::dflash(10, 1, &[0, 4, 9]).unwrap()),
        (
            "dflash_sliding",
            BlockMask::dflash_sliding(48, 4, &[2, 10, 11, 30, 47, -1], 8).unwrap(),
        ),
        (
            "dflash_sliding_w1",
            BlockMask::dflash_sliding(30, 6, &[0, 5, 6, 29], 1).unwrap(),
        ),
        (
            "dflash_sliding_wide",
            BlockMask::dflash_sliding(30, 6, &[3, 20], 100).unwrap(),
        ),
        // Three packed documents starting at rows 0, 12 and 30 (a micro-batch's context).
        (
            "dflash_packed",
            BlockMask::dflash_packed(
                45,
                4,
                &[3, 12, 13, 29, 30, 44, -1],
                &[0, 12, 12, 12, 30, 30, 0],
                None,
            )
            .unwrap(),
        ),
        (
            "dflash_packed_sliding",
            BlockMask::dflash_packed(45, 4, &[3, 20, 40], &[0, 12, 30], Some(5)).unwrap(),
        ),
        ("causal", BlockMask::causal(70).unwrap()),
        ("causal_1", BlockMask::causal(1).unwrap()),
        ("causal_0", BlockMask::causal(0).unwrap()),
        ("document", BlockMask::document(&[13, 1, 40, 20]).unwrap()),
        (
            "document_empty_docs",
            BlockMask::document(&[0, 5, 0, 3]).unwrap(),
        ),
        ("sliding_window", BlockMask::sliding_window(80, 17).unwrap()),
        (
            "sliding_window_1",
            BlockMask::sliding_window(10, 1).unwrap(),
        ),
        (
            "sliding_window_wide",
            BlockMask::sliding_window(10, 50).unwrap(),
        ),
    ]
}

fn dense_count(dense: &[Vec<bool>]) -> u64 {
    dense.iter().flatten().filter(|&&v| v).count() as u64
}

#[test]
fn visible_pairs_equal_dense_oracle_count() {
    for (name, mask) in cases() {
        let dense = mask.to_dense_oracle();
        assert_eq!(dense.len(), mask.q_len(), "{name}");
        assert!(dense.iter().all(|r| r.len() == mask.kv_len()), "{name}");
        let count = dense_count(&dense);
        assert_eq!(
            mask.visible_pairs(),
            count,
            "{name}: visible_pairs vs dense count"
        );
        let cells = (mask.q_len() * mask.kv_len()) as f64;
        let want = if cells == 0.0 {
            0.0
        } else {
            count as f64 / cells
        };
        assert!((mask.density() - want).abs() < 1e-12, "{name}: density");
    }
}

#[test]
fn intervals_are_well_formed_and_round_trip_through_i32_arrays() {
    for (name, mask) in cases() {
        for r in 0..mask.q_len() {
            let [a, b] = mask.row(r);
            for iv in [a, b] {
                assert!(
                    iv.is_empty() || (iv.start >= 0 && iv.end as usize <= mask.kv_len()),
                    "{name} row {r}"
                );
            }
            assert!(
                a.is_empty() || b.is_empty() || a.end <= b.start || b.end <= a.start,
                "{name} row {r}"
            );
        }
        let [fs, fe, ss, se] = mask.to_i32_arrays();
        let first = fs
            .iter()
            .zip(&fe)
            .map(|(&s, &e)| Interval::new(s, e))
            .collect();
        let second = ss
            .iter()
            .zip(&se)
            .map(|(&s, &e)| Interval::new(s, e))
            .collect();
        let back = BlockMask::from_intervals(mask.kv_len(), first, second).unwrap();
        assert_eq!(back, mask, "{name}: i32 arrays round trip");
    }
}

/// DFlash geometry: `(ctx_len, block_size, anchors)`, for the semantic checks.
fn dflash_geometries() -> Vec<(usize, usize, Vec<i32>)> {
    vec![
        (20, 4, vec![3, 9, 15]),
        (40, 4, vec![3, 5, 5, 6, 20, 21, 38, 39]),
        (37, 5, vec![0, 2, -1, 15, 16, -1, -7]),
        (300, 16, sample_anchors(7, 300, 24)),
        // Unsorted anchors: visibility still follows each block's own anchor.
        (50, 4, vec![30, 2, 17, 17]),
    ]
}

/// Regression: "context visible up to and including the anchor". A row of a block anchored at
/// `a` sees context position `p` iff `p < a` (the anchor's own feature is not yet known at
/// inference); padding blocks see no context.
#[test]
fn dflash_context_visible_strictly_before_anchor() {
    for (s, bs, anchors) in dflash_geometries() {
        let mask = BlockMask::dflash(s, bs, &anchors).unwrap();
        for (b, &a) in anchors.iter().enumerate() {
            for j in 0..bs {
                let r = b * bs + j;
                for p in 0..s {
                    let want = a >= 0 && (p as i32) < a;
                    assert_eq!(
                        mask.visible(r, p),
                        want,
                        "S={s} bs={bs} block {b} (anchor {a}) slot {j}, context {p}"
                    );
                }
                if a >= 0 {
                    assert!(
                        !mask.visible(r, a as usize),
                        "anchor {a} itself must be invisible"
                    );
                }
                if a > 0 {
                    assert!(
                        mask.visible(r, a as usize - 1),
                        "position a-1 = {} must be visible",
                        a - 1
                    );
                }
            }
        }
    }
}

/// Regression: "visibility decided by block id instead of position when blocks overlap". Each
/// block's rows see exactly their own block's `bs` key rows, whatever the anchors: even when
/// anchors are closer than `bs` (the blocks cover overlapping *positions*), or equal, a block
/// never sees another block's keys; padding blocks see nothing at all.
#[test]
fn dflash_blocks_see_exactly_their_own_block() {
    for (s, bs, anchors) in dflash_geometries() {
        let mask = BlockMask::dflash(s, bs, &anchors).unwrap();
        let n = anchors.len();
        for (b, &a) in anchors.iter().enumerate() {
            for j in 0..bs {
                let r = b * bs + j;
                for b2 in 0..n {
                    for j2 in 0..bs {
                        let key = s + b2 * bs + j2;
                        let want = a >= 0 && b2 == b;
                        assert_eq!(
                            mask.visible(r, key),
                            want,
                            "S={s} bs={bs} anchors {anchors:?}: row (block {b}, slot {j}) vs key (block {b2}, slot {j2})"
                        );
                    }
                }
            }
        }
        // Blocks with equal or overlapping anchors have identical context visibility iff their
        // anchors are equal: context follows position, not block index.
        for b in 0..n {
            for b2 in 0..n {
                let same = (0..s).all(|p| mask.visible(b * bs, p) == mask.visible(b2 * bs, p));
                let want = anchors[b] == anchors[b2] || (anchors[b] <= 0 && anchors[b2] <= 0);
                assert_eq!(
                    same, want,
                    "blocks {b} and {b2} (anchors {} and {})",
                    anchors[b], anchors[b2]
                );
            }
        }
    }
}

#[test]
fn dflash_padding_blocks_see_nothing() {
    let anchors = [4, -1, 9, -3];
    let (s, bs) = (12, 3);
    let mask = BlockMask::dflash(s, bs, &anchors).unwrap();
    for (b, &a) in anchors.iter().enumerate() {
        for j in 0..bs {
            let row = mask.row(b * bs + j);
            assert_eq!(row.iter().all(Interval::is_empty), a < 0, "block {b}");
        }
    }
    assert_eq!(mask.visible_pairs(), (bs * (4 + bs) + bs * (9 + bs)) as u64);
}

#[test]
fn dflash_sliding_semantics() {
    let (s, bs, w) = (48usize, 4usize, 8i32);
    let anchors = [2, 10, 11, 30, 47, -1];
    let mask = BlockMask::dflash_sliding(s, bs, &anchors, w as usize).unwrap();
    for (b, &a) in anchors.iter().enumerate() {
        for j in 0..bs as i32 {
            let r = b * bs + j as usize;
            for p in 0..s as i32 {
                let want = a >= 0 && p < a && p >= (a + j - w + 1).max(0);
                assert_eq!(
                    mask.visible(r, p as usize),
                    want,
                    "block {b} slot {j} context {p}"
                );
            }
            for b2 in 0..anchors.len() {
                for j2 in 0..bs as i32 {
                    let key = s + b2 * bs + j2 as usize;
                    let want = a >= 0 && b2 == b && j2 <= j;
                    assert_eq!(
                        mask.visible(r, key),
                        want,
                        "block {b} slot {j} key ({b2},{j2})"
                    );
                }
            }
        }
    }
    // A window wider than the context is plain DFlash with a causal block.
    let wide = BlockMask::dflash_sliding(20, 4, &[3, 9], 1000).unwrap();
    let plain = BlockMask::dflash(20, 4, &[3, 9]).unwrap();
    for r in 0..wide.q_len() {
        for k in 0..20 {
            assert_eq!(wide.visible(r, k), plain.visible(r, k));
        }
    }
}

#[test]
fn causal_document_sliding_window_semantics() {
    let causal = BlockMask::causal(33).unwrap();
    for i in 0..33 {
        for k in 0..33 {
            assert_eq!(causal.visible(i, k), k <= i, "causal ({i},{k})");
        }
    }
    assert_eq!(causal.visible_pairs(), 33 * 34 / 2);

    let docs = [13usize, 1, 0, 40, 20];
    let doc = BlockMask::document(&docs).unwrap();
    let mut start_of = Vec::new();
    let mut start = 0;
    for &len in &docs {
        start_of.extend(std::iter::repeat_n(start, len));
        start += len;
    }
    for (i, &doc_start) in start_of.iter().enumerate() {
        for k in 0..start {
            assert_eq!(
                doc.visible(i, k),
                k >= doc_start && k <= i,
                "document ({i},{k})"
            );
        }
    }
    let pairs: usize = docs.iter().map(|&l| l * (l + 1) / 2).sum();
    assert_eq!(doc.visible_pairs(), pairs as u64);

    let (len, w) = (50usize, 7usize);
    let sw = BlockMask::sliding_window(len, w).unwrap();
    for i in 0..len {
        for k in 0..len {
            assert_eq!(
                sw.visible(i, k),
                k <= i && i - k < w,
                "sliding_window ({i},{k})"
            );
        }
    }
}

/// The tile map is exact: every visible pair lies in a listed tile, `Full` tiles really are
/// fully visible, no listed tile is empty, and tiles are listed once, in increasing order.
#[test]
fn tile_map_is_exact() {
    for (name, mask) in cases() {
        let dense = mask.to_dense_oracle();
        for (qt, kt) in [(1, 1), (4, 4), (7, 5), (32, 32), (64, 16), (128, 128)] {
            let tm = TileMap::new(&mask, qt, kt);
            assert_eq!(
                tm.tiles.len(),
                mask.q_len().div_ceil(qt),
                "{name} {qt}x{kt}"
            );
            let k_tiles = mask.kv_len().div_ceil(kt);
            let mut listed = vec![vec![None; k_tiles]; tm.tiles.len()];
            for (i, list) in tm.tiles.iter().enumerate() {
                assert!(
                    list.windows(2).all(|w| w[0].index < w[1].index),
                    "{name} {qt}x{kt}: order"
                );
                for t in list {
                    assert!(
                        t.index < k_tiles,
                        "{name} {qt}x{kt}: tile index out of range"
                    );
                    listed[i][t.index] = Some(t.kind);
                }
            }
            for (i, row_tiles) in listed.iter().enumerate() {
                let rows = i * qt..((i + 1) * qt).min(mask.q_len());
                for (j, kind) in row_tiles.iter().enumerate() {
                    let keys = j * kt..((j + 1) * kt).min(mask.kv_len());
                    let cells = || rows.clone().flat_map(|r| keys.clone().map(move |k| (r, k)));
                    let visible = cells().filter(|&(r, k)| dense[r][k]).count();
                    let area = rows.len() * keys.len();
                    let at = format!("{name} {qt}x{kt}: q tile {i}, k tile {j}");
                    match kind {
                        None => assert_eq!(visible, 0, "{at}: unlisted tile has visible pairs"),
                        Some(TileKind::Full) => {
                            assert_eq!(visible, area, "{at}: Full tile not fully visible")
                        }
                        Some(TileKind::Partial) => {
                            assert!(visible > 0, "{at}: listed tile is empty");
                            assert!(visible < area, "{at}: fully visible tile marked Partial");
                        }
                    }
                }
            }
        }
    }
}

/// DFlash at the paper's shape: S = 4096 context rows, N = 256 blocks of bs = 16.
///
/// Derivation: Tq = N*bs = 4096 query rows, Tk = S + N*bs = 8192 keys; a row of block b sees
/// `a_b + bs` keys, so density = (mean(a) + bs) / Tk. With anchors drawn uniformly without
/// replacement from [0, S-1), E[mean(a)] = (S-2)/2 = 2047, density ~= 2063/8192 = 0.2518. The
/// mean of 256 such draws has sd ~ (S/sqrt(12))/sqrt(256) * sqrt(1 - 256/4095) ~= 71.5, i.e.
/// ~0.0087 in density, so [0.22, 0.285] is a > 3.5-sigma band around the expectation.
#[test]
fn dflash_density_at_paper_shape() {
    let (s, n, bs) = (4096usize, 256usize, 16usize);
    let tk = (s + n * bs) as f64;

    // Evenly spaced anchors a_b = 16 b: mean 2040, density exactly 2056/8192.
    let even: Vec<i32> = (0..n as i32).map(|b| b * bs as i32).collect();
    let mask = BlockMask::dflash(s, bs, &even).unwrap();
    assert_eq!((mask.q_len(), mask.kv_len()), (n * bs, s + n * bs));
    assert_eq!(mask.density(), 2056.0 / 8192.0);

    for seed in [1u64, 2, 3] {
        let anchors = sample_anchors(seed, s, n);
        let mask = BlockMask::dflash(s, bs, &anchors).unwrap();
        let mean_a = anchors.iter().map(|&a| a as f64).sum::<f64>() / n as f64;
        let density = mask.density();
        let tm = TileMap::new(&mask, 32, 32);
        let (full, partial) = tm.counts();
        // Work a 32x32-tiled kernel does (listed tiles' area) per visible pair.
        let tile_work = (full + partial) as f64 * 32.0 * 32.0 / mask.visible_pairs() as f64;
        println!(
            "DFlash S={s} N={n} bs={bs} seed={seed}: density {density:.4} (mean anchor {mean_a:.1}); \
             32x32 tiles: {full} full, {partial} partial, tiled work / visible pairs = {tile_work:.3}"
        );
        assert!((density - (mean_a + bs as f64) / tk).abs() < 1e-12);
        assert!(
            (0.22..=0.285).contains(&density),
            "density {density} outside [0.22, 0.285]"
        );
        // Block sparsity pays off: sorted anchors leave only a thin partial band, so a tiled
        // kernel touches few masked-out pairs (measured ~1.02; allow 1.15).
        assert!(tile_work < 1.15, "tiled work {tile_work} per visible pair");
        assert!(partial < full, "{partial} partial tiles vs {full} full");
    }
}

fn builder_of(e: &MaskError) -> &'static str {
    match e {
        MaskError::Invalid { builder, .. } => builder,
    }
}

#[test]
fn builder_errors_name_the_builder() {
    let cases: Vec<(&str, Result<BlockMask, MaskError>, &str)> = vec![
        ("dflash", BlockMask::dflash(10, 4, &[3, 10]), "anchor 10"),
        ("dflash", BlockMask::dflash(10, 4, &[3, 11]), "anchor 11"),
        ("dflash", BlockMask::dflash(0, 4, &[0]), "anchor 0"),
        ("dflash", BlockMask::dflash(10, 0, &[3]), "block_size"),
        (
            "dflash_sliding",
            BlockMask::dflash_sliding(10, 4, &[10], 4),
            "anchor 10",
        ),
        (
            "dflash_sliding",
            BlockMask::dflash_sliding(10, 0, &[3], 4),
            "block_size",
        ),
        (
            "dflash_sliding",
            BlockMask::dflash_sliding(10, 4, &[3], 0),
            "window",
        ),
        ("sliding_window", BlockMask::sliding_window(10, 0), "window"),
        (
            "from_intervals",
            BlockMask::from_intervals(5, vec![Interval::new(0, 6)], vec![Interval::EMPTY]),
            "outside",
        ),
        (
            "from_intervals",
            BlockMask::from_intervals(5, vec![Interval::new(0, 3)], vec![Interval::new(2, 4)]),
            "overlap",
        ),
        (
            "from_intervals",
            BlockMask::from_intervals(5, vec![Interval::EMPTY], vec![]),
            "second",
        ),
    ];
    for (builder, result, detail) in cases {
        let err = result.expect_err(builder);
        let msg = err.to_string();
        println!("{msg}");
        assert_eq!(builder_of(&err), builder, "{msg}");
        assert!(
            msg.starts_with(&format!("mask {builder}:")),
            "message should name the builder: {msg}"
        );
        assert!(
            msg.contains(detail),
            "message should mention {detail:?}: {msg}"
        );
    }
    // The boundary cases just inside the limits are fine.
    assert!(BlockMask::dflash(10, 1, &[9]).is_ok());
    assert!(BlockMask::sliding_window(10, 1).is_ok());
}

/// A packed DFlash mask is the per-document masks laid side by side: block `b` of document
/// `d` (context rows `[start_d, start_d + len_d)`) sees exactly what it would see alone, shifted
/// by `start_d`, and nothing of any other document. Regression guard for packed micro-batches.
#[test]
fn dflash_packed_equals_per_document_masks() {
    let docs = [(0usize, 17usize), (17, 1), (18, 40), (58, 9)];
    let s: usize = docs.iter().map(|d| d.1).sum();
    let bs = 5;
    for window in [None, Some(3)] {
        let mut anchors = Vec::new();
        let mut starts = Vec::new();
        let mut singles = Vec::new();
        for (d, &(start, len)) in docs.iter().enumerate() {
            let local = if len > 1 {
                sample_anchors(d as u64 + 11, len, (len - 1).min(6))
            } else {
                vec![]
            };
            let single = match window {
                None => BlockMask::dflash(len, bs, &local).unwrap(),
                Some(w) => BlockMask::dflash_sliding(len, bs, &local, w).unwrap(),
            };
            for &a in &local {
                anchors.push(a + start as i32);
                starts.push(start as i32);
            }
            singles.push((start, local.len(), single));
        }
        let packed = BlockMask::dflash_packed(s, bs, &anchors, &starts, window).unwrap();
        assert_eq!(packed.q_len(), anchors.len() * bs);
        let mut block0 = 0;
        for (start, n, single) in &singles {
            for qb in 0..n * bs {
                let q = block0 * bs + qb;
                // Context keys: same visibility, shifted by the document start.
                for k in 0..s {
                    let want = k >= *start
                        && k < start + single.kv_len() - n * bs
                        && single.visible(qb, k - start);
                    assert_eq!(
                        packed.visible(q, k),
                        want,
                        "window {window:?} row {q} ctx key {k}"
                    );
                }
                // Block keys: only its own block, as in the single-document mask.
                for kb in 0..anchors.len() * bs {
                    let own = kb / bs == q / bs;
                    let want = own
                        && single.visible(qb, single.kv_len() - n * bs + (qb / bs) * bs + kb % bs);
                    assert_eq!(
                        packed.visible(q, s + kb),
                        want,
                        "window {window:?} row {q} block key {kb}"
                    );
                }
            }
            block0 += n;
        }
    }
    let err = BlockMask::dflash_packed(10, 2, &[3, 5], &[0], None).unwrap_err();
    assert!(err.to_string().contains("document starts"), "{err}");
    let err = BlockMask::dflash_packed(10, 2, &[3, 5], &[0, 6], None).unwrap_err();
    assert!(err.to_string().contains("document start 6"), "{err}");
}
