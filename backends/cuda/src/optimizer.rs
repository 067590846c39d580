//! AdamW, one fused f32-storage kernel with f64 per-element math (`kernels/optimizer.cu`),
//! the torch.optim.AdamW formula:
//! `p -= lr*wd*p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; p -= lr (m/bc1) / (sqrt(v/bc2) + eps)`.

use cudarc::driver::PushKernelArg;
use dflash_core::{AdamWParams, Error, OptimizerOps, Result, Tensor};

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
        let n = param.numel();
        if grad.numel() != n || m.numel() != n || v.numel() != n {
            return Err(self.shape_err(
                op,
                format!(
                    "param {:?}, grad {:?}, m {:?}, v {:?} must have equal element counts",
                    param.shape(),
                    grad.shape(),
                    m.shape(),
                    v.shape()
                ),
            ));
        }
        if hp.step == 0 {
            return Err(Error::op(op, self.tag.clone(), "step is 1-based; got 0"));
        }
        let g = self.f32s(op, grad)?;
        let p = self.f32s_mut(op, param)?;
        let ms = self.f32s_mut(op, m)?;
        let vs = self.f32s_mut(op, v)?;
        if n == 0 {
            return Ok(());
        }
        let (lr, b1, b2, eps) = (
            hp.lr as f64,
            hp.beta1 as f64,
            hp.beta2 as f64,
            hp.eps as f64,
        );
        let decay = 1.0 - lr * hp.weight_decay as f64;
        let t = hp.step.min(i32::MAX as u64) as i32;
        let bc1 = 1.0 - b1.powi(t);
        let bc2 = 1.0 - b2.powi(t);
        let n64 = n as i64;
        let mut l = self.stream.launch_builder(&self.dev.kernels.adamw_f32);
        l.arg(&mut p.buf)
            .arg(&mut ms.buf)
            .arg(&mut vs.buf)
            .arg(&g.buf)
            .arg(&n64)
            .arg(&lr)
            .arg(&b1)
            .arg(&b2)
            .arg(&eps)
            .arg(&decay)
            .arg(&bc1)
            .arg(&bc2);
        self.launch(op, l, grid1d(n))
    }
}
