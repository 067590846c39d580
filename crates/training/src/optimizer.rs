//! AdamW over the drafter's parameters with fp32 moments, plus global grad-norm clipping.

use dflash_config::DrafterConfig;
use dflash_core::{AdamWParams, Backend, Tensor};
use dflash_models::{DrafterGrads, DrafterParams};

use crate::error::Result;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWHyper {
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    /// Decoupled weight decay of the matrices; vectors (norm weights, biases) are not decayed.
    pub weight_decay: f32,
}

/// Moments for every drafter tensor, and the number of steps taken.
pub struct AdamW {
    pub m: DrafterParams,
    pub v: DrafterParams,
    pub step: u64,
    pub hyper: AdamWHyper,
}

impl AdamW {
    pub fn new(b: &dyn Backend, cfg: &DrafterConfig, hyper: AdamWHyper) -> Result<Self> {
        Ok(AdamW {
            m: DrafterParams::zeros(b, cfg)?,
            v: DrafterParams::zeros(b, cfg)?,
            step: 0,
            hyper,
        })
    }

    /// One update with learning rate `lr` on `grads * grad_scale` (the gradients themselves
    /// are not modified: normalisation and clipping ride along in the optimizer's pass).
    pub fn update(
        &mut self,
        b: &dyn Backend,
        params: &mut DrafterParams,
        grads: &DrafterGrads,
        lr: f32,
        grad_scale: f32,
    ) -> Result<()> {
        self.step += 1;
        let hp = AdamWParams {
            lr,
            beta1: self.hyper.beta1,
            beta2: self.hyper.beta2,
            eps: self.hyper.eps,
            weight_decay: self.hyper.weight_decay,
            step: self.step,
            grad_scale,
        };
        let ps = params.tensors_mut();
        let gs = grads.tensors();
        let ms = self.m.tensors_mut();
        let vs = self.v.tensors_mut();
        // As HF Trainer (the reference recipe) groups parameters: decaying a norm's gain
        // pulls it towards 0, i.e. towards scaling the normalised activations away.
        let no_decay = AdamWParams {
            weight_decay: 0.0,
            ..hp
        };
        for (((p, g), m), v) in ps.into_iter().zip(gs).zip(ms).zip(vs) {
            let hp = if decays(p) { &hp } else { &no_decay };
            b.adamw_step(p, g, m, v, hp)?;
        }
        Ok(())
    }
}

/// Whether weight decay applies to `param`: to matrices, not to 1-D tensors (norm weights,
/// biases), which HF Trainer leaves out of decay.
pub fn decays(param: &Tensor) -> bool {
    param.dims().len() >= 2
}

/// Global L2 norm of all gradients (f64 accumulation).
pub fn grad_norm(b: &dyn Backend, grads: &DrafterGrads) -> Result<f64> {
    let sums = b.sum_squares_many(&grads.tensors())?;
    Ok(sums.iter().sum::<f64>().sqrt())
}

/// The factor that brings gradients of global norm `norm` to at most `max_norm` (PyTorch's
/// `clip_grad_norm_`: `max_norm / (norm + 1e-6)` when that is below 1; 1 otherwise or when
/// `max_norm` is 0, i.e. clipping is off). Applied through [`AdamW::update`]'s `grad_scale`.
pub fn clip_factor(norm: f64, max_norm: f64) -> f64 {
    if max_norm > 0.0 && norm > max_norm {
        max_norm / (norm + 1e-6)
    } else {
        1.0
    }
}
