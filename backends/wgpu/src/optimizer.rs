//! AdamW (`shaders/optimizer.wgsl`): one pass over param, grad and both moments, with the
//! loss normalisation and clipping folded in as `grad_scale`. The step's scalars are derived
//! once in f64 ([`dflash_core::AdamWParams::scalars`]) and applied in f32.

use dflash_core::{AdamWParams, OptimizerOps, Result, Tensor};

use crate::WgpuBackend;
use crate::pipelines::{Family, Kernel};
use crate::storage::{storage, storage_mut};

const ADAMW: Kernel<'static> = Kernel::new(Family::Optimizer, "adamw");

impl OptimizerOps for WgpuBackend {
    fn adamw_step(
        &self,
        param: &mut Tensor,
        grad: &Tensor,
        m: &mut Tensor,
        v: &mut Tensor,
        hp: &AdamWParams,
    ) -> Result<()> {
        let op = "adamw_step";
        let n = hp
            .check_operands(param, grad, m, v)
            .map_err(|e| self.shape_err(op, e))?;
        hp.validate().map_err(|e| self.err(op, e))?;
        let g = storage(op, &self.ctx, grad)?;
        let p = storage_mut(op, &self.ctx, param)?;
        let m = storage_mut(op, &self.ctx, m)?;
        let v = storage_mut(op, &self.ctx, v)?;
        let s = hp.scalars();
        let f = |x: f64| (x as f32).to_bits();
        let extra = [
            f(s.lr),
            f(s.beta1),
            f(s.beta2),
            f(s.eps),
            f(s.decay),
            f(s.bc1),
            f(s.bc2),
            hp.grad_scale.to_bits(),
        ];
        self.elementwise(op, &ADAMW, n, &extra, &[g], &[p, m, v])
    }
}
