//! AdamW, one fused f32-storage kernel with f64 per-element math (`kernels/optimizer.cu`),
//! the torch.optim.AdamW formula on `g = grad * grad_scale` (f32 product):
//! `p -= lr*wd*p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; p -= lr (m/bc1) / (sqrt(v/bc2) + eps)`.
//! 4 elements per thread (16-byte accesses of p, m, v, g) when aligned.

use cudarc::driver::PushKernelArg;
use dflash_core::{AdamWParams, AdamWScalars, Error, OptimizerOps, Result, Tensor};

use crate::{CudaBackend, grid1d};

impl OptimizerOps for CudaBackend {
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
        hp.validate()
            .map_err(|e| Error::op(op, self.tag.clone(), e))?;
        let g = self.f32s(op, grad)?;
        let p = self.f32s_mut(op, param)?;
        let ms = self.f32s_mut(op, m)?;
        let vs = self.f32s_mut(op, v)?;
        if n == 0 {
            return Ok(());
        }
        let AdamWScalars {
            lr,
            beta1: b1,
            beta2: b2,
            eps,
            decay,
            bc1,
            bc2,
        } = hp.scalars();
        let n64 = n as i64;
        let mut l = self.stream.launch_builder(&self.dev.kernels.adamw_f32);
        l.arg(&mut p.buf)
            .arg(&mut ms.buf)
            .arg(&mut vs.buf)
            .arg(&g.buf)
            .arg(&hp.grad_scale)
            .arg(&n64)
            .arg(&lr)
            .arg(&b1)
            .arg(&b2)
            .arg(&eps)
            .arg(&decay)
            .arg(&bc1)
            .arg(&bc2);
        // One thread per 4 elements (the kernel's float4 path; grid-stride, any n).
        self.launch(op, l, grid1d(n.div_ceil(4)))
    }
}
