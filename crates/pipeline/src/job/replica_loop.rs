//! One drafter replica's loop over a run's steps: its micro-batches (fixed or least-loaded
//! routing), the step's all-reduce and update, and for replica 0 the reporting and the
//! checkpoints.

use std::time::Instant;

use dflash_core::Communicator;
use dflash_training::{DrafterReplica, PreparedBatch, StepSummary};

use super::checkpoint::{CheckpointWriter, Written};
use super::plan::JobPlan;
use super::run::trained_on_nothing;
use super::threads::RunResult;
use crate::distributed::all_ranks_counts;
use crate::error::{PipelineError, Result};
use crate::phases::Phase;
use crate::report::Reporter;
use crate::schedule::StepWork;
use crate::workers::{Reorder, Shared, SharedRouter};

/// Replica 0's extra duties: reporting and checkpoints (`None` on a process other than
/// rank 0 of a multi-process run, which reports its own steps and saves nothing).
pub(super) struct Lead<'a> {
    pub(super) reporter: &'a mut Reporter,
    pub(super) result: &'a mut RunResult,
    pub(super) checkpoints: Option<CheckpointWriter>,
}

/// One drafter replica's loop over the steps.
pub(super) struct DrafterLoop<'a> {
    pub(super) plan: &'a JobPlan,
    pub(super) shared: &'a Shared,
    /// This replica's index among the process's replicas (its queue and clock).
    pub(super) rank: usize,
    pub(super) who: &'a str,
    /// The group its gradients are summed in: `comm.rank()` of `comm.world_size()` says
    /// which micro-batches of a step are its own.
    pub(super) comm: &'a dyn Communicator,
    /// The group of processes of a multi-process run (its data counts are per rank).
    pub(super) processes: Option<&'a dyn Communicator>,
    /// Least-loaded routing's shared hand-out; `None`: fixed routing.
    pub(super) router: Option<&'a SharedRouter>,
}

impl DrafterLoop<'_> {
    /// Runs steps `start_step..end_step` on `replica`: each step's micro-batches, its
    /// all-reduce and update, and with `lead` the report and any checkpoint due.
    pub(super) fn steps(
        &self,
        replica: &mut DrafterReplica,
        mut lead: Option<Lead<'_>>,
        start_step: u64,
        end_step: u64,
    ) -> Result<()> {
        let plan = self.plan;
        let clock = &self.shared.drafter_clocks[self.rank];
        let share = (self.comm.rank(), self.comm.world_size());
        let mut reorder = Reorder::new();
        let mut mark = Instant::now();
        for step in start_step..end_step {
            let work = &plan.schedule.steps[step as usize];
            dflash_models::fault::fail_point(&format!("drafter-step:{}", self.rank))
                .map_err(PipelineError::Job)?;
            self.accumulate_micro_batches(replica, (step, work), share, &mut reorder, &mut mark)?;
            let summary = replica.finish_step(self.comm, plan.lr.lr(step))?;
            clock.add_secs(Phase::AllReduce, replica.last_times.all_reduce_s);
            clock.add_secs(Phase::Optimizer, replica.last_times.optimizer_s);
            mark = Instant::now();
            let Some(lead) = lead.as_mut() else { continue };
            self.report(lead, &summary, (step, work), &mut mark)?;
            let n = step + 1;
            let save_every = plan.cfg.train.save_every;
            let due = (save_every > 0 && n.is_multiple_of(save_every))
                || n == plan.total_steps()
                || n == end_step;
            if due {
                self.checkpoint(lead, replica, (n, work), start_step, &mut mark)?;
            }
        }
        if let Some(lead) = lead.as_mut() {
            self.last_checkpoint(lead, &mut mark)?;
        }
        Ok(())
    }

    /// Accumulates the gradients of this replica's micro-batches of `step` (`work`): those
    /// the least-loaded router hands it or, with fixed routing, its own share in order (the
    /// `m` with `m % world == share`, `(share, world)` being its place in `comm`).
    fn accumulate_micro_batches(
        &self,
        replica: &mut DrafterReplica,
        (step, work): (u64, &StepWork),
        (share, world): (usize, usize),
        reorder: &mut Reorder,
        mark: &mut Instant,
    ) -> Result<()> {
        let (plan, shared) = (self.plan, self.shared);
        let clock = &shared.drafter_clocks[self.rank];
        let mut mine = (0..work.micro.len()).filter(|m| m % world == share);
        loop {
            let batch = match self.router {
                Some(r) => r.next(
                    shared,
                    &shared.features[0],
                    (step, work.micro.len()),
                    self.who,
                )?,
                None => mine
                    .next()
                    .map(|m| {
                        let q = &shared.features[self.rank];
                        reorder.next(shared, q, step, m as u32, self.who)
                    })
                    .transpose()?,
            };
            let Some(batch) = batch else { break };
            clock.lap(Phase::QueueWait, mark);
            let prepared = PreparedBatch::packed(batch, &plan.spec);
            clock.lap(Phase::Prepare, mark);
            if let Some(p) = prepared {
                replica.accumulate(&p.as_input())?;
                dflash_models::fault::point("accumulated");
            }
            clock.lap(Phase::ForwardBackward, mark);
        }
        Ok(())
    }

    /// Replica 0's report of `step` (`work`): the step's record, and the run's first and
    /// last loss and its supervised weight.
    fn report(
        &self,
        lead: &mut Lead<'_>,
        summary: &StepSummary,
        (step, work): (u64, &StepWork),
        mark: &mut Instant,
    ) -> Result<()> {
        let (plan, shared) = (self.plan, self.shared);
        lead.reporter.step(
            summary,
            work.epoch,
            plan.step_tokens[step as usize],
            shared.gauges(),
        )?;
        let figures = &mut lead.result.figures;
        if figures.first_loss.is_nan() {
            figures.first_loss = summary.stats.loss();
        }
        // The run's last figures are those of the weights it ends with: a step that changed
        // none (no supervised token, or non-finite) has no loss of its own to report.
        if summary.applied {
            figures.last = (summary.stats.loss(), summary.stats.accuracy());
        }
        lead.result.supervised += summary.stats.weight_sum;
        shared.drafter_clocks[self.rank].lap(Phase::Report, mark);
        Ok(())
    }

    /// The checkpoint due after the run's first `n` steps (`work`: the last of them): the
    /// skip counts of those steps, summed over the ranks of a multi-process run, and where
    /// this replica writes checkpoints (rank 0) the checkpoint started. An error instead of
    /// the checkpoint that ends an invocation (started at `start_step`) that trained on
    /// nothing.
    fn checkpoint(
        &self,
        lead: &mut Lead<'_>,
        replica: &mut DrafterReplica,
        (n, work): (u64, &StepWork),
        start_step: u64,
        mark: &mut Instant,
    ) -> Result<()> {
        let shared = self.shared;
        // Only the steps this checkpoint holds: the target workers may be ahead.
        let mine = shared
            .skips
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .before(n);
        // Every rank of a multi-process run takes part; rank 0 saves.
        let mine = match self.processes {
            Some(comm) => all_ranks_counts(comm, &mine)?,
            None => mine,
        };
        // Refused before the checkpoint is published: `--resume` from a final checkpoint
        // only saves the drafter, and would save this untrained one with success. The weight
        // sum is the all-reduced one, so every rank refuses alike.
        if n == self.plan.end_step() && start_step < n && lead.result.supervised == 0.0 {
            return Err(trained_on_nothing(self.plan, start_step, &mine));
        }
        let Some(checkpoints) = lead.checkpoints.as_mut() else {
            // A rank that saves nothing still spent the exchange above on the checkpoint.
            shared.drafter_clocks[self.rank].lap(Phase::Checkpoint, mark);
            return Ok(());
        };
        let extra = serde_json::json!({
            "epoch": work.epoch,
            "seed": self.plan.cfg.train.seed,
            "figures": lead.result.figures.to_json(),
            "skips": lead.result.with_carried(&mine),
        });
        for w in checkpoints.start(replica, extra)? {
            log_checkpoint(lead.reporter, &w);
        }
        shared.drafter_clocks[self.rank].lap(Phase::Checkpoint, mark);
        Ok(())
    }

    /// Waits for the run's last checkpoint, so that it is on disk before the run reports its
    /// end.
    fn last_checkpoint(&self, lead: &mut Lead<'_>, mark: &mut Instant) -> Result<()> {
        if let Some(w) = lead
            .checkpoints
            .as_mut()
            .map(|c| c.wait())
            .transpose()?
            .flatten()
        {
            log_checkpoint(lead.reporter, &w);
        }
        self.shared.drafter_clocks[self.rank].lap(Phase::Checkpoint, mark);
        Ok(())
    }
}

fn log_checkpoint(reporter: &mut Reporter, w: &Written) {
    let gb = w.bytes as f64 / 1e9;
    reporter.log(&format!(
        "checkpoint step-{}: {gb:.2} GB in {:.1} s ({:.2} GB/s); the drafter waited {:.2} s",
        w.step,
        w.write_secs,
        gb / w.write_secs.max(1e-9),
        w.stall_secs
    ));
}
