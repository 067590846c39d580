//! Fused linear cross-entropy and greedy argmax: not yet implemented on wgpu.

use dflash_core::{LossDims, LossOps, LossStats, Result, Tensor};

use crate::WgpuBackend;

impl LossOps for WgpuBackend {
    fn linear_cross_entropy(
        &self,
        x: &Tensor,
        w_head: &Tensor,
        labels: &[u32],
        weights: &[f32],
        _grad_scale: f32,
    ) -> Result<(LossStats, Tensor)> {
        let op = "linear_cross_entropy";
        LossDims::of_cross_entropy(op, self.tag(), x, w_head, labels, weights)?;
        Err(self.err(op, "not yet implemented on wgpu"))
    }

    fn linear_argmax(&self, x: &Tensor, w_head: &Tensor) -> Result<Vec<u32>> {
        let op = "linear_argmax";
        LossDims::of_argmax(op, self.tag(), x, w_head)?;
        Err(self.err(op, "not yet implemented on wgpu"))
    }
}
