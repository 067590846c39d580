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
}

/// AdamW with fp32 master weights and fp32 moments. On an f32 backend the parameter is its
/// own master copy; a bf16 backend keeps `master` in f32 and writes the rounded value back.
pub trait OptimizerOps {
    /// Decoupled weight decay, bias-corrected moments; updates `param`, `m`, `v` in place.
    fn adamw_step(
        &self,
        param: &mut Tensor,
        grad: &Tensor,
        m: &mut Tensor,
        v: &mut Tensor,
        hp: &AdamWParams,
    ) -> Result<()>;
}
