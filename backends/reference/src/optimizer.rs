//! AdamW with decoupled weight decay, as `torch.optim.AdamW` defines it:
//! ```text
//! p -= lr * wd * p
//! m  = b1 * m + (1 - b1) * g
//! v  = b2 * v + (1 - b2) * g^2
//! p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
//! ```
//! Each element is updated in f64 and rounded once per state (p, m, v) to f32.

use dflash_core::{AdamWParams, AdamWScalars, OptimizerOps, Result, Tensor};
use rayon::prelude::*;

use crate::ReferenceBackend;
use crate::storage::{shape_err, slice, slice_mut};

const CHUNK: usize = 1 << 14;

impl OptimizerOps for ReferenceBackend {
    fn adamw_step(
        &self,
        param: &mut Tensor,
        grad: &Tensor,
        m: &mut Tensor,
        v: &mut Tensor,
        hp: &AdamWParams,
    ) -> Result<()> {
        let op = "adamw_step";
        hp.check_operands(param, grad, m, v)
            .map_err(|e| shape_err(op, e))?;
        hp.validate()
            .map_err(|e| dflash_core::Error::op(op, crate::DEVICE, e))?;
        let g = slice(op, grad)?;
        let p = slice_mut(op, param)?;
        let m = slice_mut(op, m)?;
        let v = slice_mut(op, v)?;

        let AdamWScalars {
            lr,
            beta1: b1,
            beta2: b2,
            eps,
            decay,
            bc1,
            bc2,
        } = hp.scalars();
        let gs = hp.grad_scale;
        self.run(|| {
            p.par_chunks_mut(CHUNK)
                .zip(m.par_chunks_mut(CHUNK))
                .zip(v.par_chunks_mut(CHUNK))
                .zip(g.par_chunks(CHUNK))
                .for_each(|(((p, m), v), g)| {
                    for i in 0..p.len() {
                        let gi = (g[i] * gs) as f64;
                        let mi = b1 * m[i] as f64 + (1.0 - b1) * gi;
                        let vi = b2 * v[i] as f64 + (1.0 - b2) * gi * gi;
                        let pi = p[i] as f64 * decay;
                        let pi = pi - lr * (mi / bc1) / ((vi / bc2).sqrt() + eps);
                        m[i] = mi as f32;
                        v[i] = vi as f32;
                        p[i] = pi as f32;
                    }
                })
        });
        Ok(())
    }
}
