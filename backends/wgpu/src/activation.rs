//! SwiGLU forward and backward (`shaders/activation.wgsl`), elementwise in f32, chunked over
//! bindings.

use dflash_core::{ActivationOps, Result, Tensor, same_shape};

use crate::WgpuBackend;
use crate::pipelines::{Family, Kernel};
use crate::storage::storage;

const FWD: Kernel<'static> = Kernel::new(Family::Activation, "swiglu");
const BWD: Kernel<'static> = Kernel::new(Family::Activation, "swiglu_backward");

impl ActivationOps for WgpuBackend {
    fn swiglu(&self, gate: &Tensor, up: &Tensor) -> Result<Tensor> {
        let op = "swiglu";
        same_shape(op, self.tag(), "gate and up", gate, up)?;
        let (g, u) = (storage(op, &self.ctx, gate)?, storage(op, &self.ctx, up)?);
        let h = self.out(op, g.len)?;
        self.elementwise(op, &FWD, g.len, &[], &[g, u], &[&h])?;
        Ok(self.tensor(h, gate.shape().clone()))
    }

    fn swiglu_backward(&self, dh: &Tensor, gate: &Tensor, up: &Tensor) -> Result<(Tensor, Tensor)> {
        let op = "swiglu_backward";
        same_shape(op, self.tag(), "gate and up", gate, up)?;
        same_shape(op, self.tag(), "dh and gate", dh, gate)?;
        let d = storage(op, &self.ctx, dh)?;
        let (g, u) = (storage(op, &self.ctx, gate)?, storage(op, &self.ctx, up)?);
        let dg = self.out(op, g.len)?;
        let du = self.out(op, g.len)?;
        self.elementwise(op, &BWD, g.len, &[], &[d, g, u], &[&dg, &du])?;
        Ok((
            self.tensor(dg, gate.shape().clone()),
            self.tensor(du, up.shape().clone()),
        ))
    }
}
