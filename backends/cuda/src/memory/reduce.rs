//! The two-pass reductions of `sum_squares`, `sum_squares_many` and `all_finite`: block
//! counts, launch shapes and the f64 sums of squares.

use cudarc::driver::{LaunchConfig, PushKernelArg};
use dflash_core::{Result, Tensor};

use crate::CudaBackend;
use crate::kernels::pick;
use crate::storage::DType;

/// Blocks of the first pass of the two-pass reductions (a function of nothing but the
/// element count, so the summation order, hence the result, is the same on every run).
pub(super) fn reduce_blocks(n: usize) -> usize {
    n.div_ceil(256 * 8).clamp(1, 1024)
}

impl CudaBackend {
    /// `sum(t^2)` in f64 of each tensor (any dtype): two passes per tensor (block partials,
    /// then one block sums them in a fixed order), every tensor's partials in one buffer, the
    /// sums read back at once.
    pub(super) fn sum_squares_of(&self, op: &'static str, ts: &[&Tensor]) -> Result<Vec<f64>> {
        let xs = ts
            .iter()
            .map(|t| self.any(op, t))
            .collect::<Result<Vec<_>>>()?;
        let blocks: Vec<usize> = xs.iter().map(|x| reduce_blocks(x.len)).collect();
        let total: usize = blocks.iter().sum();
        let mut partial = self.alloc(op, 2 * total.max(1), DType::F32)?; // total f64
        let mut out = self.zeros_f32(op, 2 * ts.len().max(1))?; // ts.len() f64, 0 for empty tensors
        let k = self.k();
        let mut off = 0usize;
        for (i, (x, &g)) in xs.iter().zip(&blocks).enumerate() {
            if x.len > 0 {
                let n64 = x.len as i64;
                let g32 = g as i32;
                let f = pick(
                    &[&k.sum_squares_partial_f, &k.sum_squares_partial_b],
                    &[x.dtype],
                );
                let mut part = partial.slice_mut(8 * off..8 * (off + g));
                let mut l = self.stream.launch_builder(f);
                l.arg(&x.buf).arg(&n64).arg(&mut part);
                self.launch(op, l, cfg_blocks(g))?;
                let part = partial.slice(8 * off..8 * (off + g));
                let mut dst = out.slice_mut(8 * i..8 * (i + 1));
                let mut l = self.stream.launch_builder(&k.sum_final_f64);
                l.arg(&part).arg(&g32).arg(&mut dst);
                self.launch(op, l, cfg_blocks(1))?;
            }
            off += g;
        }
        self.download_pod::<f64>(op, &out, ts.len())
    }
}

pub(super) fn cfg_blocks(blocks: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (256, 1, 1),
        shared_mem_bytes: 0,
    }
}
