//! Square matrix products through `GemmOps::matmul`, in TFLOP/s (`2 * n^3` FLOPs): once with
//! f32 operands (the backend's f32 path: CUDA's depends on `DFLASH_CUDA_GEMM`, WGSL's tiled
//! kernel on wgpu) and once with operands in the backend's compute format (bf16 on CUDA, f32
//! where the backend has no narrower one). These are the ceilings the model figures are read
//! against: a drafter step at 0.7 of `gemm.compute` is near what its GEMMs allow.

use dflash_core::ops::gemm::Transpose;

use crate::{Result, Scale, Suite, Timing};

const SEED: u64 = 0x6E33_0F32;
pub const F32: &str = "gemm.f32.8192";
pub const COMPUTE: &str = "gemm.compute.8192";

/// The side of the square product: 8192 fills the H200; smoke scale keeps it tiny.
pub fn side(scale: Scale) -> usize {
    match scale {
        Scale::Full => 8192,
        Scale::Smoke => 64,
    }
}

pub fn figure_names() -> Vec<String> {
    vec![F32.to_string(), COMPUTE.to_string()]
}

pub(crate) fn run(s: &mut Suite<'_>) -> Result<()> {
    let timing = s.timing(match s.opts.scale {
        Scale::Full => Timing { warmup: 2, runs: 5 },
        Scale::Smoke => Timing { warmup: 1, runs: 3 },
    });
    let n = side(s.opts.scale);
    let flops = 2.0 * (n as f64).powi(3);
    for (name, compute) in [(F32, false), (COMPUTE, true)] {
        if !s.wants(name) {
            continue;
        }
        let backend = s.backend.clone();
        let b = backend.as_ref();
        // Fresh random operands: zeros can run faster than real data on tensor cores.
        let operand = |seed: u64| -> Result<dflash_core::Tensor> {
            let t = b.random_normal(&[n, n], 1.0, seed)?;
            Ok(if compute { b.to_compute_format(t)? } else { t })
        };
        let (a, w) = (operand(SEED)?, operand(SEED + 1)?);
        let t = crate::median_seconds(b, timing, || {
            b.matmul(&a, Transpose::No, &w, Transpose::Yes)?;
            Ok(())
        })?;
        let format = if compute {
            "operands in the compute format"
        } else {
            "f32 operands"
        };
        let detail = format!("{n} x {n} x {n}, a @ b^T, {format}, f32 result");
        s.record(name, flops / t / 1e12, t, detail)?;
    }
    Ok(())
}
