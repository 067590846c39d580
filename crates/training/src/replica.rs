//! One data-parallel drafter replica: accumulates raw gradients of `sum(w * CE)` over its
//! micro-batches, then at the step boundary all-reduces gradients and loss statistics,
//! normalises once by the *global* weight sum, clips and applies AdamW. Every replica ends
//! the step with identical weights.

use std::sync::Arc;
use std::time::Instant;

use dflash_core::{Backend, Communicator, DeviceCollective, LossStats};
use dflash_models::{DraftInput, Drafter, DrafterGrads};

use crate::error::{NonFiniteSource, Result, TrainError};
use crate::optimizer::{AdamW, clip_factor, grad_norm};

/// What one optimizer step did, identical on every replica.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepSummary {
    pub step: u64,
    pub stats: LossStats,
    pub grad_norm: f64,
    pub lr: f64,
    /// False when the loss or a gradient was NaN/Inf: the update was skipped.
    pub applied: bool,
}

/// Where the last [`DrafterReplica::finish_step`] spent its time (kept apart from the
/// deterministic [`StepSummary`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepTimes {
    /// Seconds spent summing gradients and statistics across replicas (0 with one replica).
    pub all_reduce_s: f64,
    /// Seconds of grad norm, clipping and AdamW, up to the device having finished them.
    pub optimizer_s: f64,
}

pub struct DrafterReplica {
    pub drafter: Drafter,
    pub optimizer: AdamW,
    grads: DrafterGrads,
    local: LossStats,
    pub recompute: bool,
    pub grad_clip: f64,
    /// Consecutive non-finite steps so far.
    pub nonfinite_run: u64,
    pub max_nonfinite: u64,
    /// Whether a micro-batch of the step being accumulated had a non-finite loss over
    /// non-finite features (this replica's only; the step's cause is decided on the sum over
    /// all replicas, see [`Self::finish_step`]).
    features_nonfinite: bool,
    /// 0-based index of the step being accumulated.
    pub step: u64,
    /// Timings of the last finished step.
    pub last_times: StepTimes,
    /// Where the gradients are summed across replicas: a device collective group (NCCL),
    /// or the backend's host all-reduce through the step's communicator when `None`.
    device_collective: Option<Box<dyn DeviceCollective>>,
}

impl DrafterReplica {
    pub fn new(
        drafter: Drafter,
        optimizer: AdamW,
        recompute: bool,
        grad_clip: f64,
        max_nonfinite: u64,
    ) -> Result<Self> {
        let grads = DrafterGrads::zeros(drafter.backend().as_ref(), drafter.config())?;
        Ok(DrafterReplica {
            drafter,
            optimizer,
            grads,
            local: LossStats::default(),
            recompute,
            grad_clip,
            nonfinite_run: 0,
            max_nonfinite,
            features_nonfinite: false,
            step: 0,
            last_times: StepTimes::default(),
            device_collective: None,
        })
    }

    /// Sums this replica's gradients through `c` from now on (its rank in a group made for
    /// all replicas of the run), instead of through host memory.
    pub fn set_device_collective(&mut self, c: Box<dyn DeviceCollective>) {
        self.device_collective = Some(c);
    }

    /// The device collective group member, if one was set.
    pub fn device_collective(&self) -> Option<&dyn DeviceCollective> {
        self.device_collective.as_deref()
    }

    fn backend(&self) -> Arc<dyn Backend> {
        self.drafter.backend().clone()
    }

    /// Forward + backward of one sequence or packed micro-batch, accumulating raw
    /// (unnormalised) gradients. Returns when the device has finished, so that callers can
    /// time it. A micro-batch without blocks (no two consecutive supervised tokens anywhere)
    /// adds nothing.
    pub fn accumulate(&mut self, inp: &DraftInput<'_>) -> Result<()> {
        if inp.anchors.is_empty() {
            return Ok(());
        }
        let stats = self
            .drafter
            .forward_backward(inp, 1.0, &mut self.grads, self.recompute)?;
        self.local.merge(&stats);
        if !stats.weighted_loss.is_finite() {
            // Only on the failure path: one host copy of this micro-batch's features says
            // whether the NaN came from the target (or its data) or from the drafter.
            let feats = inp.features.to_host()?;
            self.features_nonfinite |= feats.iter().any(|x| !x.is_finite());
        }
        self.backend().synchronize()?;
        Ok(())
    }

    /// Ends the step: all-reduce (with more than one replica), normalise by the global
    /// weight sum, clip, update.
    pub fn finish_step(&mut self, comm: &dyn Communicator, lr: f64) -> Result<StepSummary> {
        let b = self.backend();
        let b = b.as_ref();
        let step = self.step;
        let t0 = Instant::now();
        let local = std::mem::take(&mut self.local);
        let local_features = std::mem::take(&mut self.features_nonfinite);
        let (stats, features_nonfinite) = self.global_stats(b, comm, local, local_features)?;
        let all_reduce_s = t0.elapsed().as_secs_f64();
        let t1 = Instant::now();
        let mut summary = StepSummary {
            step,
            stats,
            grad_norm: 0.0,
            lr,
            applied: false,
        };
        if stats.weight_sum > 0.0 {
            self.normalise_and_update(b, &mut summary, features_nonfinite)?;
        }
        // A skipped update still consumes its step (data and schedule move on); AdamW's own
        // count, used for bias correction, counts applied updates only.
        self.step += 1;
        self.grads.zero_(b)?;
        b.synchronize()?;
        self.last_times = StepTimes {
            all_reduce_s,
            optimizer_s: t1.elapsed().as_secs_f64(),
        };
        Ok(summary)
    }

    /// The step's loss statistics summed over all replicas (`local`: this replica's), and
    /// whether any replica saw a non-finite loss over non-finite features (`local_features`:
    /// this one did). With more than one replica this also sums the gradients in place,
    /// through the device collective when one is set, else through the backend's host
    /// all-reduce over `comm`.
    fn global_stats(
        &mut self,
        b: &dyn Backend,
        comm: &dyn Communicator,
        local: LossStats,
        local_features: bool,
    ) -> Result<(LossStats, bool)> {
        if comm.world_size() <= 1 {
            // One replica: the sums are already global, and nothing leaves the device.
            return Ok((local, local_features));
        }
        // Statistics travel with the gradients: one global normalisation for all ranks, and
        // one cause named for a skipped step on every rank, whichever saw the NaN.
        let mut s = [
            local.weighted_loss as f32,
            local.weight_sum as f32,
            local.correct as f32,
            local.counted as f32,
            f32::from(u8::from(local_features)),
        ];
        comm.all_reduce_sum(&mut s)
            .map_err(TrainError::Collective)?;
        let device = &self.device_collective;
        for g in self.grads.tensors_mut() {
            match device {
                Some(d) => d.all_reduce_sum(g)?,
                None => b.all_reduce_sum(g, comm)?,
            }
        }
        let stats = LossStats {
            weighted_loss: s[0] as f64,
            weight_sum: s[1] as f64,
            correct: s[2] as u64,
            counted: s[3] as u64,
        };
        Ok((stats, s[4] > 0.0))
    }

    /// Normalises the summed gradients by `summary.stats.weight_sum` (> 0), clips and applies
    /// AdamW, filling in `summary.grad_norm` (of the mean gradient) and `summary.applied`.
    /// A NaN/Inf loss or norm skips the update instead; see [`Self::skip_nonfinite`].
    /// `features_nonfinite`: a replica saw a non-finite loss over non-finite features.
    fn normalise_and_update(
        &mut self,
        b: &dyn Backend,
        summary: &mut StepSummary,
        features_nonfinite: bool,
    ) -> Result<()> {
        let stats = summary.stats;
        // Gradients hold sums over the step's supervised slots: the mean (1 / weight sum)
        // and the clipping factor scale them inside the optimizer's pass.
        let inv = 1.0 / stats.weight_sum;
        let norm = grad_norm(b, &self.grads)? * inv;
        summary.grad_norm = norm;
        if norm.is_finite() && stats.loss().is_finite() {
            let scale = (inv * clip_factor(norm, self.grad_clip)) as f32;
            self.optimizer.update(
                b,
                &mut self.drafter.params,
                &self.grads,
                summary.lr as f32,
                scale,
            )?;
            summary.applied = true;
            self.nonfinite_run = 0;
            Ok(())
        } else {
            let origin = match (stats.loss().is_finite(), features_nonfinite) {
                (false, true) => NonFiniteSource::TargetFeatures,
                (false, false) => NonFiniteSource::Drafter,
                (true, _) => NonFiniteSource::Gradient,
            };
            self.skip_nonfinite(summary.step, origin)
        }
    }

    /// Counts one more consecutive non-finite step (`step`, whose NaN/Inf most likely came
    /// from `origin`); the error, naming it, once `max_nonfinite` of them have run in a row.
    fn skip_nonfinite(&mut self, step: u64, origin: NonFiniteSource) -> Result<()> {
        self.nonfinite_run += 1;
        if self.nonfinite_run >= self.max_nonfinite {
            return Err(TrainError::NonFinite {
                count: self.nonfinite_run,
                limit: self.max_nonfinite,
                step,
                origin,
            });
        }
        Ok(())
    }
}
