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
    ])
}

pub(crate) fn dims_for(mask: &BlockMask, group: usize, head_dim: usize) -> AttnDims {
    let kv_heads = 2;
    AttnDims {
        q_rows: mask.q_len(),
        kv_rows: mask.kv_len(),
        q_heads: kv_heads * group,
        kv_heads,
        head_dim,
    }
}

/// Every numerical case: each mask x GQA group {1, 2, 4} (2 kv heads) x head_dim {16, 64},
/// plus large-score cases (scores beyond f32 `exp` overflow) for the online softmax.
pub fn suite_cases() -> Result<Vec<Case>, String> {
    let mut cases = Vec::new();
    let masks = suite_masks()?;
    for (name, mask) in &masks {
        for group in [1, 2, 4] {
            for head_dim in [16, 64] {
                cases.push(Case {
                    name: format!("{name}/gqa{group}/d{head_dim}"),
                    mask: mask.clone(),
                    dims: dims_for(mask, group, head_dim),
                    scale: 1.0 / (head_dim as f32).sqrt(),
                    q_amp: 2.0,
                });
            }
        }
    }
    for (name, mask) in &masks {
        if matches!(*name, "dflash_random" | "causal") {
            // |q| up to 40 with |k| up to 2 and D = 16: scaled scores reach ~100, so a kernel
            // that exponentiates without subtracting the running max overflows f32.
            cases.push(Case {
                name: format!("{name}_large_scores/gqa2/d16"),
                mask: mask.clone(),
                dims: dims_for(mask, 2, 16),
                scale: 0.25,
                q_amp: 40.0,
            });
        }
    }
    Ok(cases)
}
