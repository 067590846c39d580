use crate::{Result, Tensor};

/// AdamW hyper-parameters for one step (lr already scheduled).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWParams {
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
    /// 1-based step count, for bias correction.
    pub step: u64,
    /// Every gradient element is multiplied by this (in f32) before the update: loss
    /// normalisation and gradient clipping folded into the optimizer's one pass over memory
    /// instead of extra passes over every gradient. 1.0 for none.
    pub grad_scale: f32,
}

/// AdamW with fp32 master weights and fp32 moments. On an f32 backend the parameter is its
/// own master copy; a bf16 backend keeps `master` in f32 and writes the rounded value back.
pub trait OptimizerOps {
    /// Decoupled weight decay, bias-corrected moments, on `grad * hp.grad_scale`; updates
    /// `param`, `m`, `v` in place (`grad` is only read).
    fn adamw_step(
        &self,
        param: &mut Tensor,
        grad: &Tensor,
        m: &mut Tensor,
        v: &mut Tensor,
        hp: &AdamWParams,
    ) -> Result<()>;
}

/// The f64 scalars of one AdamW update, derived once from [`AdamWParams`] so every backend
/// applies the same formula: `p = p * decay - lr * (m / bc1) / (sqrt(v / bc2) + eps)`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWScalars {
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    /// `1 - lr * weight_decay` (decoupled weight decay).
    pub decay: f64,
    /// Bias corrections `1 - beta^t`.
    pub bc1: f64,
    pub bc2: f64,
}

impl AdamWParams {
    /// Checks a call's operands have equal element counts; returns the count. The message is
    /// what every backend reports.
    pub fn check_operands(
        &self,
        param: &Tensor,
        grad: &Tensor,
        m: &Tensor,
        v: &Tensor,
    ) -> std::result::Result<usize, String> {
        let n = param.numel();
        if grad.numel() != n || m.numel() != n || v.numel() != n {
            return Err(format!(
                "param {:?}, grad {:?}, m {:?}, v {:?} must have equal element counts",
                param.shape(),
                grad.shape(),
                m.shape(),
                v.shape()
            ));
        }
        Ok(n)
    }

    /// Checks the hyper-parameters themselves (the step is 1-based, for bias correction).
    ///
    /// On the f32 values a backend receives, not on a config's f64 ones: a beta below 1 in
    /// f64 (0.99999999) can round to 1.0 in f32, and then `bc = 1 - beta^t` is 0 and every
    /// parameter turns NaN on the first step; an eps that is 0 in f32 gives `0 / 0` wherever
    /// a moment is 0. Each bad field is an error naming it and its value.
    pub fn validate(&self) -> std::result::Result<(), String> {
        if self.step == 0 {
            return Err("step is 1-based; got 0".into());
        }
        if !self.grad_scale.is_finite() {
            return Err(format!(
                "grad_scale must be finite, got {}",
                self.grad_scale
            ));
        }
        for (name, beta) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            // Also rejects NaN: both comparisons are false for it.
            if !(0.0..1.0).contains(&beta) {
                return Err(format!("{name} must be in [0, 1) as f32, got {beta}"));
            }
        }
        if !(self.eps.is_finite() && self.eps > 0.0) {
            return Err(format!(
                "eps must be finite and > 0 as f32, got {}",
                self.eps
            ));
        }
        for (name, x) in [("lr", self.lr), ("weight_decay", self.weight_decay)] {
            if !(x.is_finite() && x >= 0.0) {
                return Err(format!("{name} must be finite and >= 0, got {x}"));
            }
        }
        Ok(())
    }

    pub fn scalars(&self) -> AdamWScalars {
        let (lr, beta1, beta2) = (self.lr as f64, self.beta1 as f64, self.beta2 as f64);
        let t = self.step.min(i32::MAX as u64) as i32;
        AdamWScalars {
            lr,
            beta1,
            beta2,
            eps: self.eps as f64,
            decay: 1.0 - lr * self.weight_decay as f64,
            bc1: 1.0 - beta1.powi(t),
            bc2: 1.0 - beta2.powi(t),
        }
    }
}
