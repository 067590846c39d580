//! The measured PyTorch baselines of docs/design.md §4 (one H200, one run, PyTorch 2.11 stack), as data.
//! Every benchmark result is named after the baseline it is compared with.

use serde::{Deserialize, Serialize};

/// Which direction is better for a figure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Orientation {
    /// Throughput: `ratio = ours / baseline`.
    HigherIsBetter,
    /// Memory: `ratio = baseline / ours`.
    LowerIsBetter,
}

/// One measured figure of the PyTorch stack.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Baseline {
    pub name: &'static str,
    pub value: f64,
    pub unit: &'static str,
    pub orientation: Orientation,
    /// What was measured, as docs/design.md §4 says it.
    pub what: &'static str,
}

impl Baseline {
    /// `value` against this baseline, oriented so that > 1.0 is better than PyTorch.
    pub fn ratio(&self, value: f64) -> f64 {
        match self.orientation {
            Orientation::HigherIsBetter => value / self.value,
            Orientation::LowerIsBetter => self.value / value,
        }
    }
}

pub const TFLOPS: &str = "TFLOP/s";
pub const KTOKS: &str = "K tok/s";
pub const GIB: &str = "GiB";
pub const TOKS: &str = "tok/s";

const fn hi(name: &'static str, value: f64, unit: &'static str, what: &'static str) -> Baseline {
    Baseline {
        name,
        value,
        unit,
        orientation: Orientation::HigherIsBetter,
        what,
    }
}

const fn lo(name: &'static str, value: f64, unit: &'static str, what: &'static str) -> Baseline {
    Baseline {
        name,
        value,
        unit,
        orientation: Orientation::LowerIsBetter,
        what,
    }
}

const DFLASH: &str = "flex_attention (compiled) on the DFlash mask, 32 q / 8 kv heads, d=128, bf16";
const CAUSAL: &str = "causal SDPA (FlashAttention path), 32 heads, d=128, S=8192";
const ROOFLINE: &str =
    "decode, Qwen3-8B shape, 512 + 128 tokens: HF generate in the same run, else the HBM roofline";
const DRAFTER: &str = "PyTorch DFlash drafter train step, Qwen3-8B recipe, S=3072, 512 anchors";

/// docs/design.md §4, in table order. Attention TFLOP/s count visible pairs only
/// (4 * heads * d per pair forward, 3.5x that forward + backward).
pub const BASELINES: &[Baseline] = &[
    hi(
        "gemm.bf16.8192",
        780.0,
        TFLOPS,
        "bf16 GEMM 8192^3 (cuBLAS via torch), 776-784",
    ),
    // The suite's own GEMM figures. `gemm.compute` is bf16 on CUDA, so cuBLAS's bf16 rate is
    // its yardstick; the f32 one is read against the H200's non-tensor f32 peak (datasheet,
    // ~67 TFLOP/s), which no f32 GEMM without TF32 can pass.
    hi(
        "gemm.compute.8192",
        780.0,
        TFLOPS,
        "bf16 GEMM 8192^3 (cuBLAS via torch), 776-784",
    ),
    hi(
        "gemm.f32.8192",
        67.0,
        TFLOPS,
        "H200 f32 peak without tensor cores (datasheet)",
    ),
    // The LM head's two products in the drafter's loss: read against the same square bf16 GEMM.
    hi(
        "loss.ce.8b",
        780.0,
        TFLOPS,
        "bf16 GEMM 8192^3 (cuBLAS via torch), 776-784: the LM head's products at that rate",
    ),
    hi("copy.d2d", 4.22, "TB/s", "device-to-device copy"),
    hi("attention.dflash.ctx4096.fwd", 246.0, TFLOPS, DFLASH),
    hi("attention.dflash.ctx4096.fwd_bwd", 207.0, TFLOPS, DFLASH),
    hi("attention.dflash.ctx8192.fwd", 270.0, TFLOPS, DFLASH),
    hi("attention.dflash.ctx8192.fwd_bwd", 237.0, TFLOPS, DFLASH),
    hi("attention.dflash.ctx2048.fwd", 107.0, TFLOPS, DFLASH),
    hi("attention.dflash.ctx2048.fwd_bwd", 88.0, TFLOPS, DFLASH),
    hi("attention.causal.s8192.fwd", 602.0, TFLOPS, CAUSAL),
    hi("attention.causal.s8192.fwd_bwd", 519.0, TFLOPS, CAUSAL),
    hi(
        "target.forward.4x4096",
        30.5,
        KTOKS,
        "HF transformers Qwen3-8B-shape target forward (SDPA, bf16), 4x4096 tokens (461 TFLOP/s)",
    ),
    hi("drafter.step.b1.throughput", 17.8, KTOKS, DRAFTER),
    lo("drafter.step.b1.peak_memory", 36.0, GIB, DRAFTER),
    hi("drafter.step.b4.throughput", 18.3, KTOKS, DRAFTER),
    lo("drafter.step.b4.peak_memory", 119.0, GIB, DRAFTER),
    // With recomputation on, compared with the same PyTorch step (which keeps all
    // activations); issue 3's goal at batch 1 is <= 24 GiB.
    hi("drafter.step.recompute.b1.throughput", 17.8, KTOKS, DRAFTER),
    lo("drafter.step.recompute.b1.peak_memory", 36.0, GIB, DRAFTER),
    hi("drafter.step.recompute.b4.throughput", 18.3, KTOKS, DRAFTER),
    lo("drafter.step.recompute.b4.peak_memory", 119.0, GIB, DRAFTER),
    hi(
        "e2e.8b.1gpu",
        8.4,
        KTOKS,
        "the whole job, 8B recipe: the PyTorch pipeline's 16.7 K tok/s on 2 GPUs, per GPU",
    ),
    hi(
        "e2e.8b.2gpu",
        16.7,
        KTOKS,
        "the whole job, 8B recipe on 2 GPUs (target on one, drafter on the other): the PyTorch pipeline's layout",
    ),
    hi(
        "e2e.8b.2gpu.dp",
        16.7,
        KTOKS,
        "the whole job, 8B recipe on 2 GPUs, each with a target worker and a drafter replica (NCCL all-reduce): against the PyTorch pipeline on 2 GPUs",
    ),
    hi(
        "e2e.small.1gpu",
        301.6,
        KTOKS,
        "the whole job, small shape (6-layer hidden-256 target, 1-layer drafter): PyTorch eager, batched",
    ),
    // No PyTorch figure: the goal of the job-speed issue (issue 12), 30 s, stands in.
    lo(
        "load.8b",
        30.0,
        "s",
        "time to first step with a 16 GB sharded bf16 checkpoint: goal, not a PyTorch figure",
    ),
    // Decoding (`dflash regenerate`): HF `generate` is measured in the same run
    // (`bench/hf_generate.py`, `--baselines`); without it the H200's HBM roofline stands in:
    // a decode step reads the non-embedding weights once (7.57 G bf16 values, 15.14 GB) and
    // each sequence's bf16 KV cache at its mean length of 576 tokens (147 KB a token, 84.9 MB),
    // at 4.8 TB/s: batch / (bytes / 4.8e12) tokens per second.
    hi("generate.8b.b1", 315.0, TOKS, ROOFLINE),
    hi("generate.8b.b16", 4655.0, TOKS, ROOFLINE),
    hi("generate.8b.b64", 14934.0, TOKS, ROOFLINE),
    hi(
        "pipeline.2gpu.throughput",
        16.7,
        KTOKS,
        "whole pipeline, 2 GPUs: target on GPU 0, bounded queue, drafter on GPU 1, sustained",
    ),
];

/// The baseline named `name`.
pub fn baseline(name: &str) -> Option<&'static Baseline> {
    BASELINES.iter().find(|a| a.name == name)
}
