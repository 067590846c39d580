//! SwiGLU (`kernels/activation.cu`). Inputs f32 or bf16; outputs (`h`, and the backward's
//! `d_gate`, `d_up`) are activations (`CudaOptions::activations`). The kernels take one input
//! type per call; a call with mixed input dtypes widens its bf16 inputs exactly first.

use cudarc::driver::PushKernelArg;
use dflash_core::{ActivationOps, Result, Tensor};

use crate::kernels::pick;
use crate::{CudaBackend, grid_vec8};

impl ActivationOps for CudaBackend {
    fn swiglu(&self, gate: &Tensor, up: &Tensor) -> Result<Tensor> {
        let op = "swiglu";
        self.same_shape(op, "gate and up", gate, up)?;
        let (g, u) = (self.any(op, gate)?, self.any(op, up)?);
        let n = g.len;
        let od = self.opts.activations;
        let mut h = self.alloc(op, n, od)?;
        if n > 0 {
            let (id, [gb, ub]) = self.uniform(op, [g, u])?;
            let k = self.k();
            let f = pick(
                &[
                    &k.swiglu_fwd_ff,
                    &k.swiglu_fwd_fb,
                    &k.swiglu_fwd_bf,
                    &k.swiglu_fwd_bb,
                ],
                &[od, id],
            );
            let n64 = n as i64;
            let mut l = self.stream.launch_builder(f);
            l.arg(&mut h).arg(gb.get()).arg(ub.get()).arg(&n64);
            self.launch(op, l, grid_vec8(n))?;
        }
        Ok(self.tensor(h, od, gate.shape().clone()))
    }

    fn swiglu_backward(&self, dh: &Tensor, gate: &Tensor, up: &Tensor) -> Result<(Tensor, Tensor)> {
        let op = "swiglu_backward";
        self.same_shape(op, "gate and up", gate, up)?;
        self.same_shape(op, "dh and gate", dh, gate)?;
        let (d, g, u) = (self.any(op, dh)?, self.any(op, gate)?, self.any(op, up)?);
        let n = g.len;
        let od = self.opts.activations;
        let mut dg = self.alloc(op, n, od)?;
        let mut du = self.alloc(op, n, od)?;
        if n > 0 {
            let (id, [db, gb, ub]) = self.uniform(op, [d, g, u])?;
            let k = self.k();
            let f = pick(
                &[
                    &k.swiglu_bwd_ff,
                    &k.swiglu_bwd_fb,
                    &k.swiglu_bwd_bf,
                    &k.swiglu_bwd_bb,
                ],
                &[od, id],
            );
            let n64 = n as i64;
            let mut l = self.stream.launch_builder(f);
            l.arg(&mut dg)
                .arg(&mut du)
                .arg(db.get())
                .arg(gb.get())
                .arg(ub.get())
                .arg(&n64);
            self.launch(op, l, grid_vec8(n))?;
        }
        Ok((
            self.tensor(dg, od, gate.shape().clone()),
            self.tensor(du, od, up.shape().clone()),
        ))
    }
}
