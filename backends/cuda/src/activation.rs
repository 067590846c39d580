//! SwiGLU (`kernels/activation.cu`).

use cudarc::driver::PushKernelArg;
use dflash_core::{ActivationOps, Result, Tensor};

use crate::storage::DType;
use crate::{CudaBackend, grid1d};

impl ActivationOps for CudaBackend {
    fn swiglu(&self, gate: &Tensor, up: &Tensor) -> Result<Tensor> {
        let op = "swiglu";
        self.same_shape(op, "gate and up", gate, up)?;
        let (g, u) = (self.f32s(op, gate)?, self.f32s(op, up)?);
        let n = g.len;
        let mut h = self.alloc_f32(op, n)?;
        if n > 0 {
            let n64 = n as i64;
            let mut l = self.stream.launch_builder(&self.k().swiglu_fwd);
            l.arg(&mut h).arg(&g.buf).arg(&u.buf).arg(&n64);
            self.launch(op, l, grid1d(n))?;
        }
        Ok(self.tensor(h, DType::F32, gate.shape().clone()))
    }

    fn swiglu_backward(&self, dh: &Tensor, gate: &Tensor, up: &Tensor) -> Result<(Tensor, Tensor)> {
        let op = "swiglu_backward";
        self.same_shape(op, "gate and up", gate, up)?;
        self.same_shape(op, "dh and gate", dh, gate)?;
        let (d, g, u) = (self.f32s(op, dh)?, self.f32s(op, gate)?, self.f32s(op, up)?);
        let n = g.len;
        let mut dg = self.alloc_f32(op, n)?;
        let mut du = self.alloc_f32(op, n)?;
        if n > 0 {
            let n64 = n as i64;
            let mut l = self.stream.launch_builder(&self.k().swiglu_bwd);
            l.arg(&mut dg)
                .arg(&mut du)
                .arg(&d.buf)
                .arg(&g.buf)
                .arg(&u.buf)
                .arg(&n64);
            self.launch(op, l, grid1d(n))?;
        }
        Ok((
            self.tensor(dg, DType::F32, gate.shape().clone()),
            self.tensor(du, DType::F32, up.shape().clone()),
        ))
    }
}
