//! The drafter's loss against the frozen LM head (`LossOps::linear_cross_entropy`) at the 8B
//! recipe's shape, in TFLOP/s: one micro-batch of 512 blocks of 16 query rows, hidden 4096,
//! vocabulary 151936. Slot 0 of each block carries no loss weight, as in the job (DESIGN §2.3),
//! so 15 of 16 rows are active, and the figure counts only their two products with the head:
//! the logits and the input gradient, `2 * 2 * active * V * H` FLOPs (the softmax and CE pass
//! over the logits is memory work on top). The head is frozen, so there is no weight gradient.
//! Read against `gemm.compute`: the LM head is ~20% of the 8B job's FLOPs, and how close its
//! chunked products come to a square GEMM's rate is what this figure says.

use crate::util::SplitMix;
use crate::{Result, Scale, Suite, Timing};

const SEED: u64 = 0x10C5_CE8B;
pub const NAME: &str = "loss.ce.8b";
/// The recipe's weight decay along a block (gamma 7 for block 16).
const GAMMA: f64 = 7.0;

/// `(blocks, block size, hidden, vocab)`.
fn shape(scale: Scale) -> (usize, usize, usize, usize) {
    match scale {
        Scale::Full => (512, 16, 4096, 151_936),
        Scale::Smoke => (4, 16, 32, 320),
    }
}

pub fn figure_names() -> Vec<String> {
    vec![NAME.to_string()]
}

/// The loss weights of `blocks` blocks of `bs` slots: slot 0 none, slot k `exp(-(k-1)/gamma)`.
fn block_weights(blocks: usize, bs: usize) -> Vec<f32> {
    (0..blocks * bs)
        .map(|r| match r % bs {
            0 => 0.0,
            k => (-((k - 1) as f64) / GAMMA).exp() as f32,
        })
        .collect()
}

pub(crate) fn run(s: &mut Suite<'_>) -> Result<()> {
    if !s.wants(NAME) {
        return Ok(());
    }
    let timing = s.timing(match s.opts.scale {
        Scale::Full => Timing {
            warmup: 3,
            runs: 10,
        },
        Scale::Smoke => Timing { warmup: 1, runs: 3 },
    });
    let (blocks, bs, h, v) = shape(s.opts.scale);
    let rows = blocks * bs;
    let backend = s.backend.clone();
    let b = backend.as_ref();
    // Fresh random operands in the compute format, as the job's final norm output and its
    // frozen head (uploaded in the compute format) are.
    let x = b.to_compute_format(b.random_normal(&[rows, h], 1.0, SEED)?)?;
    let head = b.to_compute_format(b.random_normal(&[v, h], 0.02, SEED + 1)?)?;
    let labels = SplitMix::new(SEED + 2).tokens(rows, v);
    let weights = block_weights(blocks, bs);
    let weight_sum: f64 = weights.iter().map(|&w| w as f64).sum();
    let active = weights.iter().filter(|&&w| w > 0.0).count();
    let grad_scale = (1.0 / weight_sum) as f32;
    let t = crate::median_seconds(b, timing, || {
        b.linear_cross_entropy(&x, &head, &labels, &weights, grad_scale)?;
        Ok(())
    })?;
    let flops = 4.0 * active as f64 * v as f64 * h as f64;
    let tflops = flops / t / 1e12;
    // The yardstick that matters is the GEMM on this card now, where this run measured it.
    let vs_gemm = s
        .results
        .iter()
        .find(|r| r.name == crate::gemm::COMPUTE)
        .map(|g| format!("; {:.2} of {} in this run", tflops / g.value, g.name))
        .unwrap_or_default();
    let detail = format!(
        "{blocks} blocks x {bs} rows ({active} with loss weight), hidden {h}, vocab {v}: \
         logits and input gradient against a frozen head, operands in the compute format; \
         FLOPs 4 x active x V x H{vs_gemm}"
    );
    s.record(NAME, tflops, t, detail)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_zero_carries_no_weight_and_the_rest_decay() {
        let w = block_weights(3, 16);
        assert_eq!(w.len(), 48);
        for block in w.chunks(16) {
            assert_eq!(block[0], 0.0);
            assert_eq!(block[1], 1.0);
            assert!(block[2..].windows(2).all(|p| p[1] < p[0]));
            assert!((block[8] as f64 - (-1.0f64).exp()).abs() < 1e-7);
        }
        assert_eq!(w.iter().filter(|&&x| x > 0.0).count(), 45);
    }
}
