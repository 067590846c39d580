//! Attention throughput on the DFlash mask and on a causal mask, forward and forward +
//! backward, in TFLOP/s over visible pairs: `4 * Hq * d` FLOPs per pair forward, 3.5x that
//! forward + backward (docs/design.md §4).

use dflash_core::mask::BlockMask;

use crate::{Result, Scale, Suite, Timing};

/// Fixed seed of the sampled anchors and the random q/k/v.
const SEED: u64 = 0xDF1A_5A77;
const BLOCK: usize = 16;
/// Any base: the inputs are rotated at position 0 only (the identity).
const ROPE_THETA: f32 = 1e6;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heads {
    pub q: usize,
    pub kv: usize,
    pub dim: usize,
}

/// One attention problem of the suite.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttnCase {
    /// Figure-name prefix, e.g. `attention.dflash.ctx4096`.
    pub name: &'static str,
    pub heads: Heads,
    pub kind: MaskKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaskKind {
    /// Context of `ctx` rows plus `blocks` blocks of 16, anchors sampled sorted.
    DFlash {
        ctx: usize,
        blocks: usize,
    },
    Causal {
        len: usize,
    },
}

/// The cases at `scale`: the §4 shapes, or the same masks shrunk 64x with tiny heads.
pub fn cases(scale: Scale) -> Vec<AttnCase> {
    let (dflash_heads, causal_heads, shrink) = match scale {
        Scale::Full => (
            Heads {
                q: 32,
                kv: 8,
                dim: 128,
            },
            Heads {
                q: 32,
                kv: 32,
                dim: 128,
            },
            1,
        ),
        Scale::Smoke => (
            Heads {
                q: 4,
                kv: 1,
                dim: 16,
            },
            Heads {
                q: 4,
                kv: 4,
                dim: 16,
            },
            64,
        ),
    };
    let df = |name, ctx: usize, blocks: usize| AttnCase {
        name,
        heads: dflash_heads,
        kind: MaskKind::DFlash {
            ctx: ctx / shrink,
            blocks: blocks / shrink,
        },
    };
    vec![
        df("attention.dflash.ctx4096", 4096, 256),
        df("attention.dflash.ctx8192", 8192, 512),
        df("attention.dflash.ctx2048", 2048, 128),
        AttnCase {
            name: "attention.causal.s8192",
            heads: causal_heads,
            kind: MaskKind::Causal { len: 8192 / shrink },
        },
    ]
}

impl AttnCase {
    /// `(mask, q rows)`; the DFlash anchors are sampled from a fixed seed, sorted.
    pub fn mask(&self) -> Result<(BlockMask, usize)> {
        Ok(match self.kind {
            MaskKind::DFlash { ctx, blocks } => {
                let anchors = dflash_data::sample_anchors(&vec![1u8; ctx], blocks, SEED);
                let m =
                    BlockMask::dflash(ctx, BLOCK, &anchors).map_err(dflash_core::Error::from)?;
                (m, blocks * BLOCK)
            }
            MaskKind::Causal { len } => (
                BlockMask::causal(len).map_err(dflash_core::Error::from)?,
                len,
            ),
        })
    }

    fn describe(&self, pairs: u64) -> String {
        let h = self.heads;
        let what = match self.kind {
            MaskKind::DFlash { ctx, blocks } => format!("ctx {ctx} + {blocks} blocks of {BLOCK}"),
            MaskKind::Causal { len } => format!("causal S={len}"),
        };
        format!(
            "{what}, {}q/{}kv heads, d={}, {pairs} visible pairs",
            h.q, h.kv, h.dim
        )
    }
}

/// A random `(T, heads, D)` input as the drafter's layer hands it to attention: q and k are
/// rope's outputs, v a projection's, d_out an activation gradient, all in the dtype the
/// backend writes activations in (bf16 on CUDA, f32 on wgpu and the reference), not the
/// compute format of frozen tensors. Rope at position 0 is the identity, so this is
/// `random_normal(shape, 1, seed)` in that dtype.
pub fn activation_input(
    b: &dyn dflash_core::Backend,
    shape: &[usize],
    seed: u64,
) -> Result<dflash_core::Tensor> {
    let t = b.random_normal(shape, 1.0, seed)?;
    Ok(b.rope(&t, &vec![0; shape[0]], ROPE_THETA)?)
}

pub fn figure_names() -> Vec<String> {
    cases(Scale::Full)
        .iter()
        .flat_map(|c| [format!("{}.fwd", c.name), format!("{}.fwd_bwd", c.name)])
        .collect()
}

pub(crate) fn run(s: &mut Suite<'_>) -> Result<()> {
    let timing = s.timing(match s.opts.scale {
        Scale::Full => Timing { warmup: 2, runs: 5 },
        Scale::Smoke => Timing { warmup: 1, runs: 3 },
    });
    for case in cases(s.opts.scale) {
        let (fwd_name, bwd_name) = (
            format!("{}.fwd", case.name),
            format!("{}.fwd_bwd", case.name),
        );
        let (want_fwd, want_bwd) = (s.wants(&fwd_name), s.wants(&bwd_name));
        if !want_fwd && !want_bwd {
            continue;
        }
        let backend = s.backend.clone();
        let b = backend.as_ref();
        let (mask, tq) = case.mask()?;
        let tk = mask.kv_len();
        let h = case.heads;
        let input = |shape: &[usize], seed: u64| activation_input(b, shape, seed);
        let q = input(&[tq, h.q, h.dim], SEED + 1)?;
        let k = input(&[tk, h.kv, h.dim], SEED + 2)?;
        let v = input(&[tk, h.kv, h.dim], SEED + 3)?;
        let scale = (h.dim as f32).powf(-0.5);
        let pairs = mask.visible_pairs();
        let fwd_flops = 4.0 * (h.q * h.dim) as f64 * pairs as f64;
        let detail = case.describe(pairs);
        if want_fwd {
            let t = crate::median_seconds(b, timing, || {
                b.attention(&q, &k, &v, &mask, scale)?;
                Ok(())
            })?;
            s.record(&fwd_name, fwd_flops / t / 1e12, t, detail.clone())?;
        }
        if want_bwd {
            let d_out = input(&[tq, h.q, h.dim], SEED + 4)?;
            let t = crate::median_seconds(b, timing, || {
                let (out, lse) = b.attention(&q, &k, &v, &mask, scale)?;
                b.attention_backward(&q, &k, &v, &out, &lse, &d_out, &mask, scale)?;
                Ok(())
            })?;
            s.record(&bwd_name, 3.5 * fwd_flops / t / 1e12, t, detail)?;
        }
    }
    Ok(())
}
