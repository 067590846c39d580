//! Block-sparse attention masks, described compactly.
//!
//! Every mask this project needs is, for each query row, the union of at most two
//! half-open key intervals `[start, end)`. That description is:
//! - exact (no dense `[q, k]` matrix is ever built outside test oracles),
//! - cheap to walk (work proportional to visible pairs),
//! - ABI-friendly (four `i32` arrays), so a foreign attention kernel can take it as is.
//!
//! Builders: [`BlockMask::dflash`], [`BlockMask::dflash_sliding`], [`BlockMask::causal`],
//! [`BlockMask::document`], [`BlockMask::sliding_window`]. [`TileMap`] summarises a mask per
//! query tile into key tiles that are fully visible, partially visible, or skipped.

mod builders;
mod tiles;

pub use tiles::{KeyTile, TileKind, TileMap};

/// Errors from building a mask out of user-supplied geometry.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MaskError {
    #[error("mask {builder}: {detail}")]
    Invalid {
        builder: &'static str,
        detail: String,
    },
}

/// A half-open key interval `[start, end)`; empty when `start >= end` (whatever the two
/// values: a reversed interval such as `{ start: 2, end: -1 }` is empty, as the C ABI says).
/// [`BlockMask::from_intervals`] stores every empty interval as [`Interval::EMPTY`], so the
/// intervals of a [`BlockMask`] are either that or inside `[0, kv_len)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Interval {
    pub start: i32,
    pub end: i32,
}

impl Interval {
    pub const EMPTY: Interval = Interval { start: 0, end: 0 };
    pub fn new(start: i32, end: i32) -> Self {
        if start >= end {
            Self::EMPTY
        } else {
            Interval { start, end }
        }
    }
    pub fn len(&self) -> usize {
        // In i64: `end - start` of two i32 overflows i32 (e.g. `[-2, i32::MAX)`), and a
        // wrapped length would call a huge interval empty and skip its bounds check.
        (i64::from(self.end) - i64::from(self.start)).max(0) as usize
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    pub fn contains(&self, k: i32) -> bool {
        k >= self.start && k < self.end
    }
}

/// For each query row, at most two visible key intervals. Rows with both intervals empty
/// (padding blocks) see nothing: attention output is 0 and its log-sum-exp is `-inf`.
///
/// Invariant (checked by the builders): the two intervals of a row do not overlap, and
/// `0 <= start <= end <= kv_len`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockMask {
    q_len: usize,
    kv_len: usize,
    first: Vec<Interval>,
    second: Vec<Interval>,
}

impl BlockMask {
    /// Builds a mask from explicit intervals, validating the invariants. Every empty interval
    /// (`start >= end`, reversed ones included: the C ABI's rule) is stored as
    /// [`Interval::EMPTY`]; every other one must lie in `[0, kv_len)`, and `kv_len` must fit
    /// in `i32` (the type of the interval bounds, which kernels index keys with).
    pub fn from_intervals(
        kv_len: usize,
        mut first: Vec<Interval>,
        mut second: Vec<Interval>,
    ) -> Result<Self, MaskError> {
        let bad = |detail: String| MaskError::Invalid {
            builder: "from_intervals",
            detail,
        };
        if first.len() != second.len() {
            return Err(bad(format!(
                "{} first intervals but {} second",
                first.len(),
                second.len()
            )));
        }
        if i32::try_from(kv_len).is_err() {
            return Err(bad(format!("kv_len = {kv_len} does not fit in i32")));
        }
        for (row, (a, b)) in first.iter_mut().zip(&mut second).enumerate() {
            for iv in [&mut *a, &mut *b] {
                // Normalised so that kernels walking `start as usize..end as usize` (and tile
                // maps) never see a reversed or out-of-range empty interval.
                if iv.is_empty() {
                    *iv = Interval::EMPTY;
                } else if iv.start < 0 || iv.end as usize > kv_len {
                    return Err(bad(format!(
                        "row {row}: interval {iv:?} outside [0, {kv_len})"
                    )));
                }
            }
            if !a.is_empty() && !b.is_empty() && a.start < b.end && b.start < a.end {
                return Err(bad(format!("row {row}: intervals {a:?} and {b:?} overlap")));
            }
        }
        Ok(BlockMask {
            q_len: first.len(),
            kv_len,
            first,
            second,
        })
    }

    pub fn q_len(&self) -> usize {
        self.q_len
    }
    pub fn kv_len(&self) -> usize {
        self.kv_len
    }
    /// The (at most two) visible key intervals of query row `row`.
    pub fn row(&self, row: usize) -> [Interval; 2] {
        [self.first[row], self.second[row]]
    }
    pub fn first(&self) -> &[Interval] {
        &self.first
    }
    pub fn second(&self) -> &[Interval] {
        &self.second
    }

    /// Whether query row `q` may attend to key `k`.
    pub fn visible(&self, q: usize, k: usize) -> bool {
        // A key past i32::MAX is past kv_len (which fits in i32), so nothing sees it.
        let Ok(k) = i32::try_from(k) else {
            return false;
        };
        self.first[q].contains(k) || self.second[q].contains(k)
    }

    /// Number of visible (query, key) pairs: the unit of attention FLOP accounting
    /// (4 * heads * head_dim FLOPs per pair forward, 3.5x that forward + backward).
    pub fn visible_pairs(&self) -> u64 {
        self.first
            .iter()
            .zip(&self.second)
            .map(|(a, b)| (a.len() + b.len()) as u64)
            .sum()
    }

    /// Fraction of the dense `q_len * kv_len` matrix that is visible.
    pub fn density(&self) -> f64 {
        if self.q_len == 0 || self.kv_len == 0 {
            return 0.0;
        }
        self.visible_pairs() as f64 / (self.q_len as f64 * self.kv_len as f64)
    }

    /// Dense boolean expansion `[q_len][kv_len]`. **Test oracle only**: nothing on a training
    /// path may call this (it is what the PyTorch stack silently falls back to and OOMs on).
    pub fn to_dense_oracle(&self) -> Vec<Vec<bool>> {
        (0..self.q_len)
            .map(|q| (0..self.kv_len).map(|k| self.visible(q, k)).collect())
            .collect()
    }

    /// The C-ABI form: `(first_start, first_end, second_start, second_end)`, each `q_len` long.
    pub fn to_i32_arrays(&self) -> [Vec<i32>; 4] {
        [
            self.first.iter().map(|i| i.start).collect(),
            self.first.iter().map(|i| i.end).collect(),
            self.second.iter().map(|i| i.start).collect(),
            self.second.iter().map(|i| i.end).collect(),
        ]
    }
}
