//! The mask builders. Each states its per-row intervals in one line of its doc comment.

use crate::{BlockMask, Interval, MaskError};

fn invalid(builder: &'static str, detail: String) -> MaskError {
    MaskError::Invalid { builder, detail }
}

fn to_i32(builder: &'static str, what: &str, v: usize) -> Result<i32, MaskError> {
    i32::try_from(v).map_err(|_| invalid(builder, format!("{what} = {v} does not fit in i32")))
}

/// The first key `max(0, i - w + 1)` of a causal window of `w >= 1` keys ending at key `i`
/// (`i >= 0`). `w` comes from a config file, so it may be any `usize`: the arithmetic is in
/// i64 with `w` saturated there, and a window wider than the keys is the same as no window
/// (a cast `w as i32` would wrap `2^32` to 0, silently showing no context at all).
fn window_start(i: i32, w: usize) -> i32 {
    let w = i64::try_from(w).unwrap_or(i64::MAX);
    // In [0, i], so it fits in i32.
    (i64::from(i) - w + 1).max(0) as i32
}

impl BlockMask {
    /// The DFlash training mask. Keys are `ctx_len` context rows followed by the blocks.
    /// Query row `(b, j)` of block `b` (anchor `a_b`) sees `[0, a_b)` and
    /// `[ctx_len + bs*b, ctx_len + bs*(b+1))`. A negative anchor marks a padding block,
    /// which sees nothing. Visibility depends on the anchor *position*, never on the block
    /// index, so overlapping blocks (anchors closer than `block_size`) stay isolated.
    pub fn dflash(ctx_len: usize, block_size: usize, anchors: &[i32]) -> Result<Self, MaskError> {
        Self::dflash_impl("dflash", ctx_len, block_size, anchors, &[], None)
    }

    /// The DFlash mask over packed documents: the context is several documents laid end to
    /// end, and block `b` belongs to the document starting at context row `doc_starts[b]`.
    /// Row `(b, j)` sees `[doc_starts[b], a_b)` and its own block; with `window`, context
    /// `[max(doc_starts[b], a+j-W+1), a)` and its block causally (a sliding DFlash layer).
    /// `doc_starts` empty means one document starting at row 0 ([`BlockMask::dflash`]).
    pub fn dflash_packed(
        ctx_len: usize,
        block_size: usize,
        anchors: &[i32],
        doc_starts: &[i32],
        window: Option<usize>,
    ) -> Result<Self, MaskError> {
        if !doc_starts.is_empty() && doc_starts.len() != anchors.len() {
            return Err(invalid(
                "dflash_packed",
                format!(
                    "{} document starts for {} anchors: expected one per block",
                    doc_starts.len(),
                    anchors.len()
                ),
            ));
        }
        Self::dflash_impl(
            "dflash_packed",
            ctx_len,
            block_size,
            anchors,
            doc_starts,
            window,
        )
    }

    /// A sliding-window DFlash layer: row `(b, j)` sees context `[max(0, a+j-W+1), a)` and
    /// its own block causally, `[ctx_len + bs*b, ctx_len + bs*b + j + 1)`.
    pub fn dflash_sliding(
        ctx_len: usize,
        block_size: usize,
        anchors: &[i32],
        window: usize,
    ) -> Result<Self, MaskError> {
        Self::dflash_impl(
            "dflash_sliding",
            ctx_len,
            block_size,
            anchors,
            &[],
            Some(window),
        )
    }

    fn dflash_impl(
        builder: &'static str,
        ctx_len: usize,
        block_size: usize,
        anchors: &[i32],
        doc_starts: &[i32],
        window: Option<usize>,
    ) -> Result<Self, MaskError> {
        if block_size == 0 {
            return Err(invalid(builder, "block_size must be >= 1".into()));
        }
        if window == Some(0) {
            return Err(invalid(builder, "window must be >= 1".into()));
        }
        let s = to_i32(builder, "ctx_len", ctx_len)?;
        let bs = to_i32(builder, "block_size", block_size)?;
        let kv_len = block_size
            .checked_mul(anchors.len())
            .and_then(|n| n.checked_add(ctx_len))
            .unwrap_or(usize::MAX);
        to_i32(builder, "kv_len", kv_len)?;
        let rows = anchors.len() * block_size;
        let (mut first, mut second) = (Vec::with_capacity(rows), Vec::with_capacity(rows));
        for (b, &a) in anchors.iter().enumerate() {
            if a >= s {
                return Err(invalid(
                    builder,
                    format!("anchor {a} of block {b} is not inside the context of {ctx_len} rows"),
                ));
            }
            let doc = doc_starts.get(b).copied().unwrap_or(0);
            if a >= 0 && !(0..=a).contains(&doc) {
                return Err(invalid(
                    builder,
                    format!("block {b}: document start {doc} is not in [0, anchor {a}]"),
                ));
            }
            let block_start = s + bs * b as i32;
            for j in 0..bs {
                if a < 0 {
                    first.push(Interval::EMPTY);
                    second.push(Interval::EMPTY);
                    continue;
                }
                match window {
                    None => {
                        first.push(Interval::new(doc, a));
                        second.push(Interval::new(block_start, block_start + bs));
                    }
                    Some(w) => {
                        let lo = window_start(a + j, w).max(doc);
                        first.push(Interval::new(lo, a));
                        second.push(Interval::new(block_start, block_start + j + 1));
                    }
                }
            }
        }
        Self::from_intervals(kv_len, first, second)
    }

    /// Causal self-attention over `len` tokens: row `i` sees `[0, i+1)`.
    pub fn causal(len: usize) -> Result<Self, MaskError> {
        Self::document(&[len])
    }

    /// Packed documents, causal within each: row `i` of a document starting at `d` sees `[d, i+1)`.
    pub fn document(doc_lens: &[usize]) -> Result<Self, MaskError> {
        // Saturating: an overflowing sum is rejected as not fitting in i32, never wrapped.
        let total = doc_lens
            .iter()
            .try_fold(0usize, |acc, &n| acc.checked_add(n))
            .unwrap_or(usize::MAX);
        to_i32("document", "total length", total)?;
        let mut first = Vec::with_capacity(total);
        let mut start = 0i32;
        for &len in doc_lens {
            for i in 0..len as i32 {
                first.push(Interval::new(start, start + i + 1));
            }
            start += len as i32;
        }
        let second = vec![Interval::EMPTY; total];
        Self::from_intervals(total, first, second)
    }

    /// Causal sliding window of `window` keys: row `i` sees `[max(0, i-W+1), i+1)`.
    pub fn sliding_window(len: usize, window: usize) -> Result<Self, MaskError> {
        if window == 0 {
            return Err(invalid("sliding_window", "window must be >= 1".into()));
        }
        to_i32("sliding_window", "len", len)?;
        let first = (0..len as i32)
            .map(|i| Interval::new(window_start(i, window), i + 1))
            .collect();
        Self::from_intervals(len, first, vec![Interval::EMPTY; len])
    }
}
