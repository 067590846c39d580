//! The cases of the suite: which masks, head layouts and input scales every kernel is run on,
//! and why each is there.

use std::fmt;

use dflash_core::AttnDims;
use dflash_core::mask::BlockMask;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// One numerical case: a mask, dims and input statistics.
#[derive(Debug, Clone)]
pub struct Case {
    pub name: String,
    pub mask: BlockMask,
    pub dims: AttnDims,
    pub scale: f32,
    /// `q` is drawn from `[-q_amp, q_amp)` (2 normally; large to test softmax stability).
    pub q_amp: f32,
}

pub(crate) fn mask_err(e: impl fmt::Display) -> String {
    format!("conformance suite: building a case mask failed: {e}")
}

/// The masks of the suite, by name. Small enough for debug builds, large enough to span several
/// 32-row/32-key tiles and to hit tile edges (no size is a multiple of 32).
pub fn suite_masks() -> Result<Vec<(&'static str, BlockMask)>, String> {
    // 10 anchors sampled without replacement from [0, ctx_len - 1), sorted, plus two padding
    // blocks: what the training batch builder produces.
    let mut rng = ChaCha8Rng::seed_from_u64(0xDF1A5);
    let ctx = 150usize;
    let mut anchors: Vec<i32> = rand::seq::index::sample(&mut rng, ctx - 1, 10)
        .into_iter()
        .map(|a| a as i32)
        .collect();
    anchors.sort_unstable();
    anchors.extend([-1, -1]);
    Ok(vec![
        // Anchors closer than block_size (and one duplicate): positions overlap, the mask must
        // still isolate blocks by block index of the *key rows*, context by anchor position.
        (
            "dflash_overlap",
            BlockMask::dflash(40, 4, &[3, 5, 5, 6, 20, 21, 38, 39]).map_err(mask_err)?,
        ),
        // Anchor 0 (sees no context, only its block) and trailing padding blocks (see nothing).
        (
            "dflash_padding",
            BlockMask::dflash(37, 5, &[0, 2, 15, 16, -1, -1]).map_err(mask_err)?,
        ),
        (
            "dflash_random",
            BlockMask::dflash(ctx, 8, &anchors).map_err(mask_err)?,
        ),
        (
            "dflash_sliding",
            BlockMask::dflash_sliding(48, 4, &[2, 10, 11, 30, 47, -1], 8).map_err(mask_err)?,
        ),
        ("causal", BlockMask::causal(70).map_err(mask_err)?),
        (
            "document",
            BlockMask::document(&[13, 1, 40, 20]).map_err(mask_err)?,
        ),
        (
            "sliding_window",
            BlockMask::sliding_window(80, 17).map_err(mask_err)?,
        ),
        // The device kernels' original mask set (40-50 rows: one and two 32-row tiles):
        // overlapping anchors (5, 6), one block past the end (37) and padding blocks.
        (
            "dflash_s40",
            BlockMask::dflash(40, 4, &[1, 5, 6, 20, 37, -1, -1]).map_err(mask_err)?,
        ),
        (
            "dflash_sliding_s40",
            BlockMask::dflash_sliding(40, 4, &[3, 9, 10, 30, -1], 7).map_err(mask_err)?,
        ),
        ("causal_45", BlockMask::causal(45).map_err(mask_err)?),
        (
            "document_s37",
            BlockMask::document(&[10, 1, 17, 9]).map_err(mask_err)?,
        ),
        (
            "sliding_window_50",
            BlockMask::sliding_window(50, 8).map_err(mask_err)?,
        ),
    ])
}

/// Masks spanning several 128-row query tiles and key tiles, for device kernels (too large
/// for the host suite's debug builds): a DFlash mask of 512 context rows and 48 blocks of 16
/// (two overlapping, two padding); causal 300; 256 context rows with 16 blocks whose last 8
/// are padding (a whole 128-row query tile sees no key).
pub fn large_masks() -> Result<Vec<(&'static str, BlockMask)>, String> {
    let mut anchors: Vec<i32> = (0..46).map(|i| 10 + i * 10).collect();
    anchors[1] = anchors[0] + 3;
    anchors.extend([-1, -1]);
    let mut half_padding: Vec<i32> = (1..=8).map(|i| i * 25).collect();
    half_padding.extend([-1; 8]);
    Ok(vec![
        (
            "dflash_s512_n48_bs16",
            BlockMask::dflash(512, 16, &anchors).map_err(mask_err)?,
        ),
        ("causal_300", BlockMask::causal(300).map_err(mask_err)?),
        (
            "dflash_s256_n16_8_padding",
            BlockMask::dflash(256, 16, &half_padding).map_err(mask_err)?,
        ),
    ])
}

/// A head layout: query heads, kv heads (GQA group `q_heads / kv_heads`), head dim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
}

impl Layout {
    pub const fn new(q_heads: usize, kv_heads: usize, head_dim: usize) -> Self {
        Layout {
            q_heads,
            kv_heads,
            head_dim,
        }
    }
}

/// The host suite's layouts: GQA group {1, 2, 4} over 2 kv heads x head_dim {16, 64}.
pub const HOST_LAYOUTS: [Layout; 6] = [
    Layout::new(2, 2, 16),
    Layout::new(2, 2, 64),
    Layout::new(4, 2, 16),
    Layout::new(4, 2, 64),
    Layout::new(8, 2, 16),
    Layout::new(8, 2, 64),
];

/// `gqa{group}/d{head_dim}` with 2 kv heads (the host suite's names, which seed its inputs),
/// `gqa{group}/kv{kv_heads}/d{head_dim}` otherwise.
fn layout_tag(l: Layout) -> String {
    let group = l.q_heads / l.kv_heads.max(1);
    if l.kv_heads == 2 {
        format!("gqa{group}/d{}", l.head_dim)
    } else {
        format!("gqa{group}/kv{}/d{}", l.kv_heads, l.head_dim)
    }
}

/// One case per mask x layout, `q` in `[-2, 2)`, `scale = 1 / sqrt(head_dim)`.
pub fn cases_on(masks: &[(&str, BlockMask)], layouts: &[Layout]) -> Vec<Case> {
    let mut cases = Vec::new();
    for (name, mask) in masks {
        for l in layouts {
            cases.push(Case {
                name: format!("{name}/{}", layout_tag(*l)),
                mask: mask.clone(),
                dims: dims_of(mask, *l),
                scale: 1.0 / (l.head_dim as f32).sqrt(),
                q_amp: 2.0,
            });
        }
    }
    cases
}

/// Large-score cases (scores beyond f32 `exp` overflow) for the online softmax, on the
/// `dflash_random` and `causal` masks in `layout`: `|q|` up to 40 with `|k|` up to 2 and
/// scale 0.25, so at head_dim 16 scaled scores reach ~100 and a kernel that exponentiates
/// without subtracting the running max overflows f32.
pub fn large_score_cases(layout: Layout) -> Result<Vec<Case>, String> {
    Ok(suite_masks()?
        .into_iter()
        .filter(|(name, _)| matches!(*name, "dflash_random" | "causal"))
        .map(|(name, mask)| Case {
            name: format!("{name}_large_scores/{}", layout_tag(layout)),
            dims: dims_of(&mask, layout),
            mask,
            scale: 0.25,
            q_amp: 40.0,
        })
        .collect())
}

pub(crate) fn dims_of(mask: &BlockMask, l: Layout) -> AttnDims {
    AttnDims {
        q_rows: mask.q_len(),
        kv_rows: mask.kv_len(),
        q_heads: l.q_heads,
        kv_heads: l.kv_heads,
        head_dim: l.head_dim,
    }
}

/// The host suite: every mask of [`suite_masks`] in every [`HOST_LAYOUTS`] layout, plus the
/// [`large_score_cases`] at GQA 2, head_dim 16.
pub fn suite_cases() -> Result<Vec<Case>, String> {
    let mut cases = cases_on(&suite_masks()?, &HOST_LAYOUTS);
    cases.extend(large_score_cases(Layout::new(4, 2, 16))?);
    Ok(cases)
}

/// Which input of a [`NanCase`] holds the NaN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NanInput {
    /// `k[row, head, 0]`: `row` is a key, `head` a kv head.
    K,
    /// `v[row, head, 0]`: `row` is a key, `head` a kv head.
    V,
    /// `q[row, head, 0]`: `row` is a query row, `head` a q head.
    Q,
    /// `d_out[row, head, 0]`: `row` is a query row, `head` a q head.
    DOut,
}

impl NanInput {
    /// The input's name, as in case names: `k`, `v`, `q`, `d_out`.
    pub fn name(self) -> &'static str {
        match self {
            NanInput::K => "k",
            NanInput::V => "v",
            NanInput::Q => "q",
            NanInput::DOut => "d_out",
        }
    }

    /// Whether the NaN is in a key-side input (`k`, `v`), so the case's `row` is a key and its
    /// `head` a kv head; otherwise `row` is a query row and `head` a q head.
    pub fn is_key_side(self) -> bool {
        matches!(self, NanInput::K | NanInput::V)
    }
}

/// A NaN-propagation case (the NaN policy in ARCHITECTURE.md): `case`'s usual inputs with
/// element 0 of one (row, head) of one input ([`NanCase::input`]) set to NaN. In every case a
/// row that sees no key stays exactly 0 with `lse = -inf`, and nothing is hidden or spread
/// beyond what follows. The backward is the usual one: `D = rowsum(dO * O)`, `dP = dO V^T`,
/// `dS = P * (dP - D)`, `dq = scale * dS K`, `dk = scale * dS^T Q`, `dv = P^T dO`.
///
/// - **NaN in `k[key, kv_head, 0]`** ([`nan_cases_on`]): every (row, head) whose mask sees
///   `key` through `kv_head` has NaN scores and must come out NaN (`out` and `lse`, and `dq`
///   in the backward) with `dk`/`dv` of that key NaN; every other row stays finite, its `dq`
///   included. So a kernel can neither hide a NaN (the `l > 0` test of an online softmax is
///   false for NaN) nor spread it to rows that never read it.
/// - **NaN in `v[key, kv_head, 0]`** ([`nan_v_cases_on`]): the scores stay finite, so a row
///   that sees `key` has a finite `lse`, `out[.., 0]` NaN and `dq` NaN (its `dO . v` is),
///   `dk` of the key is NaN and its `dv` finite; every other row stays finite. This catches a
///   kernel that multiplies a zero weight (a masked pair inside a partial tile) by the NaN
///   value.
/// - **NaN in `q[r, h, 0]`** ([`nan_q_cases_on`]; `r` sees keys): every score of (r, h) is
///   NaN, so (r, h) has `out`, `lse` and `dq` all NaN (its P row is NaN, so is `D_r`, so is
///   its dS row). `dk` and `dv` of every key (r, h) sees, in kv head `h / group`, are all NaN
///   (`dk_j` holds `dS[r, j] q_r`, `dv_j` holds `P[r, j] dO_r`, each NaN in every dim). Every
///   other (row, head), the other heads of row r included, keeps a finite `out`, `lse` and
///   `dq` (the forward and `dq = dS K` are row-wise); `dk`/`dv` of the keys r does not see in
///   kv head `h / group` are finite, and so is every key's in the other kv heads.
/// - **NaN in `d_out[r, h, 0]`** ([`nan_dout_cases_on`]; `r` sees keys): the forward never
///   reads `d_out`, so every `out` and `lse` is finite (or 0 and -inf for a row that sees no
///   key). `D_r` and the whole `dP` row of (r, h) are NaN, so its dS row is NaN at every key
///   it sees: `dq` of (r, h) all NaN, `dk` of every key (r, h) sees (kv head `h / group`) all
///   NaN. `dv = P^T dO` reads only `dO`'s NaN column, with a finite P: `dv` of those keys is
///   NaN at dim 0 and finite in every other dim, and dims 1.. of every key's `dv` are finite.
///   Every other (row, head) has
///   a finite `dq`; `dk` and `dv[.., 0]` of the keys r does not see are finite, and so is
///   every key's in the other kv heads.
///
/// [`NanCase::within_tiles`] is the weaker contract of kernels whose products with P and dS
/// are matrix multiplies over whole tiles (tensor cores: 0 x NaN is NaN inside the MMA, and
/// skipping zero weights there would cost every tile a check). A NaN key may also reach the
/// `dq` of the other rows of the query tiles that hold it (dS K), and a NaN value their `out`
/// and `dq` (P V), so those are not checked; it must still never be hidden (the rows that
/// read it as above), never touch an lse, never reach the `out` of a row that sees no key
/// (exactly 0), and a NaN key never any other row's `out`. A NaN in `q` or `d_out` makes the
/// dS row of (r, h) NaN at keys r does not see as well (`0 x (dP - D_r)` with `D_r` NaN, and
/// for `q` possibly P itself), so `dk` (and, for `q`, `dv`) of the keys of kv head `h / group`
/// that r does not see are not checked, nor `dv[.., 0]` of those keys for `d_out` (0 times
/// the NaN `dO[r, 0]`); everything else is as strict: the forward and `dq` of every other
/// (row, head) are row-wise, so they stay finite, and dims 1.. of `dv` stay finite for
/// `d_out` (P is finite).
#[derive(Debug, Clone)]
pub struct NanCase {
    pub case: Case,
    /// The input that holds the NaN.
    pub input: NanInput,
    /// A key row for `k`/`v`, a query row for `q`/`d_out`.
    pub row: usize,
    /// A kv head for `k`/`v`, a q head for `q`/`d_out`.
    pub head: usize,
    /// Rows that do not read the NaN input are checked at tile granularity (see above).
    pub within_tiles: bool,
}

impl NanCase {
    /// This case under the tile-granular contract (see [`NanCase`]).
    pub fn within_tiles(self) -> Self {
        NanCase {
            within_tiles: true,
            ..self
        }
    }
}

/// The NaN cases: `dflash_padding` (key 10 is seen by the blocks anchored at 15 and 16, not
/// by those at 0 and 2, and the padding blocks see nothing) and `causal_45` (key 30: rows
/// 30.. see it), at GQA 2, head_dim 16, NaN in kv head 1.
pub fn nan_cases() -> Result<Vec<NanCase>, String> {
    nan_cases_on(Layout::new(4, 2, 16))
}

/// [`nan_cases`] on `layout` (a kernel that supports only some head dims picks one of them;
/// the NaN goes into kv head 1, so `layout` needs at least two kv heads).
pub fn nan_cases_on(layout: Layout) -> Result<Vec<NanCase>, String> {
    nan_cases_in(layout, NanInput::K)
}

/// [`nan_cases_on`] with the NaN in `v` ([`NanInput::V`]).
pub fn nan_v_cases_on(layout: Layout) -> Result<Vec<NanCase>, String> {
    nan_cases_in(layout, NanInput::V)
}

/// The NaN in `q` ([`NanInput::Q`]) on the masks of [`nan_cases`]: query row 7 of
/// `dflash_padding` (block 1, anchor 2: it sees keys 0, 1 and its block's 42..47, while the
/// other rows of its 16-, 32- and 64-row query tiles see block 0's keys, context up to 16 and
/// blocks 2 and 3, or nothing) and row 20 of `causal_45` (rows 21.. of its tiles see keys
/// 21..), in the last q head of kv head 1 (`2 * group - 1`, so with GQA a sibling head of the
/// same kv head stays clean; `layout` needs at least two kv heads).
pub fn nan_q_cases_on(layout: Layout) -> Result<Vec<NanCase>, String> {
    nan_cases_in(layout, NanInput::Q)
}

/// [`nan_q_cases_on`] with the NaN in `d_out` ([`NanInput::DOut`]).
pub fn nan_dout_cases_on(layout: Layout) -> Result<Vec<NanCase>, String> {
    nan_cases_in(layout, NanInput::DOut)
}

/// All four kinds on `layout`: [`nan_cases_on`] (k), [`nan_v_cases_on`],
/// [`nan_q_cases_on`] and [`nan_dout_cases_on`], in that order.
pub fn nan_input_cases_on(layout: Layout) -> Result<Vec<NanCase>, String> {
    let mut cases = Vec::new();
    for input in [NanInput::K, NanInput::V, NanInput::Q, NanInput::DOut] {
        cases.extend(nan_cases_in(layout, input)?);
    }
    Ok(cases)
}

fn nan_cases_in(layout: Layout, input: NanInput) -> Result<Vec<NanCase>, String> {
    let group = layout.q_heads / layout.kv_heads.max(1);
    // (poisoned key, poisoned query row) of each mask.
    let (head, pick): (usize, fn(&str) -> Option<usize>) = if input.is_key_side() {
        let key = |name: &str| match name {
            "dflash_padding" => Some(10),
            "causal_45" => Some(30),
            _ => None,
        };
        (1, key)
    } else {
        let row = |name: &str| match name {
            "dflash_padding" => Some(7),
            "causal_45" => Some(20),
            _ => None,
        };
        (2 * group - 1, row)
    };
    Ok(suite_masks()?
        .into_iter()
        .filter_map(|(name, mask)| {
            let row = pick(name)?;
            Some(NanCase {
                case: Case {
                    name: format!("{name}_nan_{}{row}/{}", input.name(), layout_tag(layout)),
                    dims: dims_of(&mask, layout),
                    mask,
                    scale: 1.0 / (layout.head_dim as f32).sqrt(),
                    q_amp: 2.0,
                },
                input,
                row,
                head,
                within_tiles: false,
            })
        })
        .collect())
}
