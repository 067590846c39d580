//! A training job's run: the workers placed and their memory planned, the targets and the
//! drafter replicas built (resumed from the run's checkpoint), tau measured before and after
//! training, the threads run ([`super::threads`]: target workers feeding the replicas through
//! bounded queues, with periodic reports and checkpoints) and the end reported and saved.
//! Everything it needs to know comes resolved in a [`JobPlan`]; this file only builds the
//! workers and runs them.

use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use dflash_core::Backend;
use dflash_core::pipeline::HiddenSeq;
use dflash_data::SkipCounts;
use dflash_models::safetensors_io::write_atomic;
use dflash_models::{Drafter, Qwen3Target};
use dflash_training::{DrafterReplica, evaluate_tau};

use super::TrainOutcome;
use super::build::{
    attach_device_collective, attach_process_collective, build_replicas, check_process_plan,
    load_targets, place_workers,
};
use super::checkpoint::Figures;
use super::memory::MemoryPlan;
use super::plan::{JobPlan, TargetSource};
use super::resume::{finished_run, report_data, resume};
use super::setup::{EvalData, eval_features, stop_tokens};
use super::threads::{RunPlace, RunResult, run_workers};
use crate::distributed::Processes;
use crate::error::{PipelineError, Result};

/// Runs `plan` in `run_dir` (a fresh run, or the continuation of its latest checkpoint); as
/// one rank of `procs` when given, `run_dir` then being this rank's own directory.
pub(super) fn run_plan(
    plan: &JobPlan,
    run_dir: &Path,
    resuming: bool,
    procs: Option<&Processes>,
) -> Result<TrainOutcome> {
    let job_start = Instant::now();
    let lead = procs.is_none_or(Processes::is_lead);
    // Rank 0's directory: the run's checkpoints, which every rank resumes from.
    let home = match lead {
        true => run_dir,
        false => run_dir.parent().unwrap_or(run_dir),
    };
    if let Some(p) = procs {
        check_process_plan(plan, p)?;
    }
    if resuming && let Some(done) = finished_run(plan, home)? {
        return Ok(done);
    }
    write_resolved_config(plan, run_dir)?;
    let (target_backends, drafter_backends) = place_workers(plan, procs)?;
    log_placement(plan, &drafter_backends[0]);
    let mut memory = plan_memory(plan, run_dir, &target_backends, &drafter_backends)?;
    if lead {
        // Only rank 0 featurises the evaluation set.
        super::memory::check_eval_features(plan, super::memory::host_capacity())?;
    }
    let (targets, mut replicas) = load_workers(plan, procs, &target_backends, &drafter_backends)?;
    let measured = resume_and_measure(plan, home, resuming, lead, &targets, &mut replicas);
    let (eval, carried) = match procs {
        Some(p) => p.after_lead_work(measured)?,
        None => measured?,
    };
    let invocation = Invocation {
        plan,
        run_dir,
        lead,
        start_step: replicas[0].step,
    };
    let at = RunPlace {
        run_dir,
        background_checkpoints: memory.background_checkpoints,
        job_start,
        procs,
    };
    let (replica, run) = run_workers(plan, &at, targets, replicas, carried)?;
    record_measured_memory(&mut memory, run_dir, &target_backends, &drafter_backends)?;
    let run_skips = invocation.report_end(&run)?;
    invocation.save(&eval, &replica, &run, run_skips)
}

/// Logs the first replica's backend, device and attention kernel with the workers' counts.
fn log_placement(plan: &JobPlan, b0: &Arc<dyn Backend>) {
    eprintln!(
        "backend {} on {} | attention kernel {} | {} target worker(s), {} drafter replica(s)",
        b0.name(),
        b0.device(),
        b0.attention_kernel(),
        plan.target_workers,
        plan.drafter_workers
    );
}

/// The job's memory plan on the placed backends: printed, written to the run directory, and
/// an error when it does not fit.
fn plan_memory(
    plan: &JobPlan,
    run_dir: &Path,
    target_backends: &[Arc<dyn Backend>],
    drafter_backends: &[Arc<dyn Backend>],
) -> Result<MemoryPlan> {
    // Planned from the shapes and refused here, before the first tensor is allocated, on the
    // devices' memory with what earlier work in this process cached returned.
    super::memory::release_caches(target_backends);
    super::memory::release_caches(drafter_backends);
    let memory = MemoryPlan::new(plan, target_backends, drafter_backends);
    eprintln!("{}", memory.table());
    memory.write(run_dir)?;
    memory.check(plan, target_backends, drafter_backends)?;
    Ok(memory)
}

/// Loads the frozen targets (logging the training data) and builds the drafter replicas,
/// joined in their device collective group and, as one rank of `procs`, the process group.
fn load_workers(
    plan: &JobPlan,
    procs: Option<&Processes>,
    target_backends: &[Arc<dyn Backend>],
    drafter_backends: &[Arc<dyn Backend>],
) -> Result<(Vec<Arc<Qwen3Target>>, Vec<DrafterReplica>)> {
    let targets = load_targets(plan, target_backends)?;
    eprintln!(
        "train data {}: {} samples",
        plan.cfg.train_data()?.display(),
        plan.train_data.len()
    );
    if let Some(s) = &plan.bucket_summary {
        eprintln!("{s}");
    }
    let mut replicas = build_replicas(plan, drafter_backends, &targets[0])?;
    attach_device_collective(plan, drafter_backends, &mut replicas)?;
    if let Some(p) = procs {
        attach_process_collective(plan, p, &drafter_backends[0], &mut replicas[0])?;
    }
    Ok((targets, replicas))
}

/// Loads the run's latest checkpoint into the replicas when `resuming`, logs the drafter,
/// featurises the evaluation set (on rank 0, the `lead`) and measures tau before training
/// when the run starts at step 0. Returns the evaluation set with the run's figures and
/// skip counts carried from the checkpoint (`home`, rank 0's directory).
fn resume_and_measure(
    plan: &JobPlan,
    home: &Path,
    resuming: bool,
    lead: bool,
    targets: &[Arc<Qwen3Target>],
    replicas: &mut [DrafterReplica],
) -> Result<(Eval, (Figures, Option<SkipCounts>))> {
    let (carried, carried_skips) = match resuming {
        true => resume(home, replicas, lead)?,
        false => (Figures::default(), Some(SkipCounts::default())),
    };
    let start_step = replicas[0].step;
    eprintln!(
        "drafter: {} layers, {:.2} M parameters, block {}, target layers {:?}; {} steps",
        plan.drafter.num_hidden_layers,
        replicas[0].drafter.params.num_params() as f64 / 1e6,
        plan.drafter.block_size,
        plan.drafter.target_layer_ids,
        plan.total_steps()
    );
    // Tau is measured once, by rank 0.
    let eval = match lead {
        true => Eval::featurise(plan, targets[0].as_ref())?,
        false => Eval::none(),
    };
    // A run resumed before its first checkpoint starts over, so it measures tau too.
    let tau_before = match start_step {
        0 => eval.tau(&replicas[0].drafter, "before")?,
        _ => carried.tau_before,
    };
    let carried = Figures {
        tau_before,
        ..carried
    };
    Ok((eval, (carried, carried_skips)))
}

/// Records each device's measured peak after the run; where any backend tracks memory, logs
/// the planned against the measured peaks and rewrites the plan with them.
fn record_measured_memory(
    memory: &mut MemoryPlan,
    run_dir: &Path,
    target_backends: &[Arc<dyn Backend>],
    drafter_backends: &[Arc<dyn Backend>],
) -> Result<()> {
    let all: Vec<_> = target_backends
        .iter()
        .chain(drafter_backends)
        .cloned()
        .collect();
    if memory.record_measured(&all) {
        eprintln!("{}", memory.measured_summary());
        memory.write(run_dir)?;
    }
    Ok(())
}

/// This invocation of a run: its plan, this process's run directory, whether this process
/// leads (rank 0, which saves the drafter and measures tau) and the step it started at.
#[derive(Clone, Copy)]
struct Invocation<'a> {
    plan: &'a JobPlan,
    run_dir: &'a Path,
    lead: bool,
    start_step: u64,
}

impl Invocation<'_> {
    /// Logs how the invocation ended (an early stop, the data counts) and returns the run's
    /// skip counts. (An invocation that trained on nothing failed before its last
    /// checkpoint: [`trained_on_nothing`].)
    fn report_end(&self, run: &RunResult) -> Result<Option<SkipCounts>> {
        let (plan, start_step) = (self.plan, self.start_step);
        if plan.end_step() < plan.total_steps() && start_step < plan.end_step() {
            eprintln!(
                "stopped after step {} of {} (train.stop_at_step); continue with \
                 `train --resume {}`",
                plan.end_step(),
                plan.total_steps(),
                self.run_dir.display()
            );
        }
        let run_skips = run.run_skips();
        report_data(
            start_step,
            plan.end_step(),
            &run.skips,
            run_skips.as_ref(),
            &empty_rows_note(plan),
        );
        Ok(run_skips)
    }

    /// Saves the trained drafter (rank 0 only), measures tau after training and writes the
    /// outcome to `summary.json`.
    fn save(
        &self,
        eval: &Eval,
        replica: &DrafterReplica,
        run: &RunResult,
        run_skips: Option<SkipCounts>,
    ) -> Result<TrainOutcome> {
        let (plan, run_dir) = (self.plan, self.run_dir);
        let b = replica.drafter.backend().clone();
        // The served drafter, in the dtype the job asks for (checkpoints keep f32).
        let served = dflash_config::DrafterConfig {
            dtype: plan.cfg.drafter.save_dtype,
            ..replica.drafter.config().clone()
        };
        if self.lead {
            let params = &replica.drafter.params;
            dflash_models::checkpoint::save_drafter(b.as_ref(), run_dir, &served, params)?;
        }
        let outcome = TrainOutcome {
            run_dir: run_dir.to_path_buf(),
            steps: plan.end_step(),
            final_loss: run.figures.last.0,
            final_accuracy: run.figures.last.1,
            first_loss: run.figures.first_loss,
            tau_before: run.figures.tau_before,
            tau_after: eval.tau(&replica.drafter, "after")?,
            skipped_samples: run_skips.as_ref().map(SkipCounts::skipped),
            data: run_skips,
            invocation_start_step: self.start_step,
            invocation_skipped_samples: run.skips.skipped(),
            empty_rows: plan.empty_samples,
        };
        let json = serde_json::to_string_pretty(&outcome).expect("outcome serialises");
        write_atomic(&run_dir.join("summary.json"), json.as_bytes())?;
        Ok(outcome)
    }
}

/// The data line's note of the empty rows: they never reach a worker, so the counts alone
/// would say every sample was kept.
fn empty_rows_note(plan: &JobPlan) -> String {
    match plan.empty_samples {
        0 => String::new(),
        n => format!("; {n} empty or null rows not scheduled"),
    }
}

/// The error of an invocation whose steps `start_step..end_step` saw no supervised block
/// (`skips`: their data counts): saving an untrained drafter and exiting 0 would look like
/// success.
pub(super) fn trained_on_nothing(
    plan: &JobPlan,
    start_step: u64,
    skips: &SkipCounts,
) -> PipelineError {
    PipelineError::Job(format!(
        "trained on nothing: steps {start_step}..{} saw no supervised block (data: {skips}{}); \
         a sample trains only if it is kept and has a supervised token after an anchor (check \
         the loss masks, data.max_len, data.min_supervised and the token ids)",
        plan.end_step(),
        empty_rows_note(plan)
    ))
}

/// Writes the run's fully resolved config. `train.stop_at_step` belongs to this invocation,
/// not to the run: the config kept in the run directory (which `train --resume` reuses)
/// leaves it out.
fn write_resolved_config(plan: &JobPlan, run_dir: &Path) -> Result<()> {
    let mut kept = plan.cfg.clone();
    kept.train.stop_at_step = None;
    write_atomic(
        &run_dir.join("config.toml"),
        kept.to_toml_string()?.as_bytes(),
    )?;
    let _ = std::fs::remove_file(run_dir.join("error.txt"));
    Ok(())
}

/// The held-out evaluation set (`data.eval`), featurised once and kept in host memory.
struct Eval {
    seqs: Option<Vec<HiddenSeq>>,
    stops: Vec<u32>,
}

impl Eval {
    /// No evaluation set: tau is not measured.
    fn none() -> Self {
        // Without sequences there is nothing to stop: the target's files are not read.
        Eval {
            seqs: None,
            stops: Vec::new(),
        }
    }

    fn featurise(plan: &JobPlan, target: &Qwen3Target) -> Result<Self> {
        let cfg = &plan.cfg;
        let Some(p) = &cfg.data.eval else {
            return Ok(Eval::none());
        };
        let dir = match &plan.target {
            TargetSource::Dir(dir) => Some(dir.as_path()),
            TargetSource::Random { .. } => None,
        };
        // Read before featurising, so that a malformed tokenizer config fails the job first.
        let stops = stop_tokens(dir, &plan.target_config)?;
        let set = EvalData {
            path: p,
            max: cfg.eval.max_samples.unwrap_or(usize::MAX),
            max_positions: plan.target_config.max_position_embeddings,
            mask_token_id: plan.drafter.mask_token_id,
        };
        let (seqs, counts) = eval_features(cfg, target, &set)?;
        eprintln!("eval data {}: {counts}", p.display());
        Ok(Eval {
            seqs: Some(seqs),
            stops,
        })
    }

    /// Tau of `d` (logged), or `None` without an evaluation set.
    fn tau(&self, d: &Drafter, when: &str) -> Result<Option<f64>> {
        let Some(seqs) = &self.seqs else {
            return Ok(None);
        };
        let t = evaluate_tau(d, seqs, &self.stops)?.tau;
        eprintln!("tau {when} training: {t:.3}");
        Ok(Some(t))
    }
}
