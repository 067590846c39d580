//! The threaded run loop of a training job: target workers feeding the drafter replicas
//! through bounded queues, with periodic reports, evals and checkpoints. Everything it needs
//! to know comes resolved in a [`JobPlan`]; this file only builds the workers and runs them.

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dflash_config::Routing;
use dflash_core::Communicator;
use dflash_core::pipeline::HiddenSeq;
use dflash_data::SkipCounts;
use dflash_models::safetensors_io::write_atomic;
use dflash_models::{Drafter, Qwen3Target};
use dflash_queue::BoundedQueue;
use dflash_queue::Queue;
use dflash_training::{DrafterReplica, evaluate_tau};

use super::TrainOutcome;
use super::build::{
    attach_device_collective, attach_process_collective, build_replicas, check_process_plan,
    load_targets, place_workers,
};
use super::checkpoint::{CheckpointWriter, Figures};
use super::memory::MemoryPlan;
use super::plan::JobPlan;
use super::replica_loop::{DrafterLoop, Lead};
use super::resume::{finished_run, report_data, resume};
use super::setup::{EvalData, eval_features, stop_tokens};
use crate::comm::HostComm;
use crate::distributed::{Processes, all_ranks_counts};
use crate::error::{PipelineError, Result};
use crate::phases::PhaseClock;
use crate::report::Reporter;
use crate::workers::{OnAbort, Shared, SharedRouter, StepSkips, WorkItem, target_worker};

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
    let b0 = &drafter_backends[0];
    eprintln!(
        "backend {} on {} | attention kernel {} | {} target worker(s), {} drafter replica(s)",
        b0.name(),
        b0.device(),
        b0.attention_kernel(),
        plan.target_workers,
        plan.drafter_workers
    );
    // Planned from the shapes and refused here, before the first tensor is allocated.
    let mut memory = MemoryPlan::new(plan, &target_backends, &drafter_backends);
    eprintln!("{}", memory.table());
    memory.write(run_dir)?;
    memory.check(plan, &target_backends, &drafter_backends)?;
    let targets = load_targets(plan, &target_backends)?;
    eprintln!(
        "train data {}: {} samples",
        plan.cfg.train_data()?.display(),
        plan.train_data.len()
    );
    if let Some(s) = &plan.bucket_summary {
        eprintln!("{s}");
    }
    let mut replicas = build_replicas(plan, &drafter_backends, &targets[0])?;
    attach_device_collective(plan, &drafter_backends, &mut replicas)?;
    if let Some(p) = procs {
        attach_process_collective(plan, p, &drafter_backends[0], &mut replicas[0])?;
    }
    let (carried, carried_skips) = match resuming {
        true => resume(home, &mut replicas, lead)?,
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
        false => Eval::none(plan),
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
    let at = RunPlace {
        run_dir,
        background_checkpoints: memory.background_checkpoints,
        job_start,
        procs,
    };
    let (replica, run) = run_workers(plan, &at, targets, replicas, (carried, carried_skips))?;
    let all: Vec<_> = target_backends
        .iter()
        .chain(&drafter_backends)
        .cloned()
        .collect();
    if memory.record_measured(&all) {
        eprintln!("{}", memory.measured_summary());
        memory.write(run_dir)?;
    }
    if plan.end_step() < plan.total_steps() && start_step < plan.end_step() {
        eprintln!(
            "stopped after step {} of {} (train.stop_at_step); continue with `train --resume {}`",
            plan.end_step(),
            plan.total_steps(),
            run_dir.display()
        );
    }
    // Empty rows never reach a worker, so the counts alone would say every sample was kept.
    let empty = match plan.empty_samples {
        0 => String::new(),
        n => format!("; {n} empty or null rows not scheduled"),
    };
    let run_skips = run.run_skips();
    report_data(
        start_step,
        plan.end_step(),
        &run.skips,
        run_skips.as_ref(),
        &empty,
    );
    if start_step < plan.end_step() && run.supervised == 0.0 {
        // Saving an untrained drafter and exiting 0 would look like success.
        return Err(PipelineError::Job(format!(
            "trained on nothing: steps {start_step}..{} saw no supervised block (data: {}{empty}); \
             a sample trains only if it is kept and has a supervised token after an anchor \
             (check the loss masks, data.max_len, data.min_supervised and the token ids)",
            plan.end_step(),
            run.skips
        )));
    }
    let b = replica.drafter.backend().clone();
    // The served drafter, in the dtype the job asks for (checkpoints keep f32).
    let served = dflash_config::DrafterConfig {
        dtype: plan.cfg.drafter.save_dtype,
        ..replica.drafter.config().clone()
    };
    if lead {
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
        invocation_start_step: start_step,
        invocation_skipped_samples: run.skips.skipped(),
        empty_rows: plan.empty_samples,
    };
    let json = serde_json::to_string_pretty(&outcome).expect("outcome serialises");
    write_atomic(&run_dir.join("summary.json"), json.as_bytes())?;
    Ok(outcome)
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
    fn none(plan: &JobPlan) -> Self {
        Eval {
            seqs: None,
            stops: stop_tokens(&plan.target_config),
        }
    }

    fn featurise(plan: &JobPlan, target: &Qwen3Target) -> Result<Self> {
        let cfg = &plan.cfg;
        let seqs = match &cfg.data.eval {
            Some(p) => {
                let set = EvalData {
                    path: p,
                    max: cfg.eval.max_samples.unwrap_or(usize::MAX),
                    max_positions: plan.target_config.max_position_embeddings,
                    mask_token_id: plan.drafter.mask_token_id,
                };
                let (seqs, counts) = eval_features(cfg, target, &set)?;
                eprintln!("eval data {}: {counts}", p.display());
                Some(seqs)
            }
            None => None,
        };
        Ok(Eval {
            seqs,
            stops: stop_tokens(&plan.target_config),
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

/// What the run loop leaves behind besides replica 0.
pub(super) struct RunResult {
    /// The run's figures: those carried from its checkpoint, updated by each step.
    pub(super) figures: Figures,
    /// Supervised weight summed over this invocation's steps: 0 means it trained on nothing.
    pub(super) supervised: f64,
    /// This invocation's skip counts (its steps only).
    pub(super) skips: SkipCounts,
    /// The run's counts of the steps before this invocation (`None`: not recorded).
    pub(super) carried_skips: Option<SkipCounts>,
}

impl RunResult {
    /// The run's counts: those carried plus `mine` (this invocation's so far).
    pub(super) fn with_carried(&self, mine: &SkipCounts) -> Option<SkipCounts> {
        let mut all = self.carried_skips.clone()?;
        all.merge(mine);
        Some(all)
    }

    /// The run's counts at the end of this invocation.
    fn run_skips(&self) -> Option<SkipCounts> {
        self.with_carried(&self.skips)
    }
}

/// Where a run's workers write and report: this process's run directory, whether
/// checkpoints are written in the background, when the job started, and the group of
/// processes it is one rank of.
#[derive(Clone, Copy)]
struct RunPlace<'a> {
    run_dir: &'a Path,
    background_checkpoints: bool,
    job_start: Instant,
    procs: Option<&'a Processes>,
}

/// Spawns the loader, the target workers and the drafter replicas, runs steps from the
/// replicas' step to `end_step`, and returns replica 0 with the run's figures (`carried`
/// updated).
fn run_workers(
    plan: &JobPlan,
    at: &RunPlace,
    targets: Vec<Arc<Qwen3Target>>,
    replicas: Vec<DrafterReplica>,
    (carried, carried_skips): (Figures, Option<SkipCounts>),
) -> Result<(DrafterReplica, RunResult)> {
    let RunPlace {
        run_dir,
        background_checkpoints,
        job_start,
        procs,
    } = *at;
    let start_step = replicas[0].step;
    // In-process replicas sum through host threads; a process's one replica through the
    // group of processes.
    let (comms, on_abort): (Vec<Box<dyn Communicator>>, OnAbort) = match procs {
        Some(p) => (vec![Box::new(p.comm())], p.abort_handle()),
        None => {
            let host = HostComm::group(plan.drafter_workers);
            let c = host[0].clone();
            let comms = host
                .into_iter()
                .map(|c| Box::new(c) as Box<dyn Communicator>)
                .collect();
            (comms, Box::new(move |_| c.abort()))
        }
    };
    let shared = shared_state(plan, on_abort);
    let process = procs.map(|p| (p.rank(), p.world_size()));
    let router = SharedRouter::default();
    let mut reporter = Reporter::new(
        run_dir,
        job_start,
        start_step,
        plan.total_steps(),
        plan.cfg.train.log_every,
    )?;
    let mut result = RunResult {
        figures: carried,
        supervised: 0.0,
        skips: SkipCounts::default(),
        carried_skips,
    };
    let end_step = plan.end_step();
    let finished: Vec<Option<DrafterReplica>> = std::thread::scope(|scope| {
        let shared = &shared;
        scope.spawn(move || load_work(plan, shared, (start_step, end_step), process));
        for (i, target) in targets.iter().enumerate() {
            let data = plan.train_data.clone();
            let target = target.clone();
            scope.spawn(move || {
                if let Err(e) = target_worker(i, shared, target.as_ref(), data.as_ref(), plan.rules)
                {
                    shared.fail(PipelineError::Worker {
                        worker: format!("target worker {i}"),
                        source: Box::new(e),
                    });
                }
            });
        }
        let mut rank0 = Some((&mut reporter, &mut result));
        let router = &router;
        let handles: Vec<_> = replicas
            .into_iter()
            .zip(comms)
            .enumerate()
            .map(|(rank, (mut replica, comm))| {
                let lead = if rank == 0 { rank0.take() } else { None };
                scope.spawn(move || {
                    let who = match process {
                        Some((r, _)) => format!("rank {r} drafter replica {rank}"),
                        None => format!("drafter replica {rank}"),
                    };
                    // Checkpoints are rank 0's alone.
                    let saves = process.is_none_or(|(r, _)| r == 0);
                    let lead = lead.map(|(reporter, result)| Lead {
                        reporter,
                        result,
                        checkpoints: saves
                            .then(|| CheckpointWriter::new(run_dir, background_checkpoints)),
                    });
                    let run = DrafterLoop {
                        plan,
                        shared,
                        rank,
                        who: &who,
                        comm: comm.as_ref(),
                        processes: process.map(|_| comm.as_ref()),
                        // Across processes each rank has its own share, fixed.
                        router: (plan.cfg.pipeline.routing == Routing::LeastLoaded
                            && process.is_none())
                        .then_some(router),
                    };
                    match run.steps(&mut replica, lead, start_step, end_step) {
                        Ok(()) => Some(replica),
                        Err(e) => {
                            shared.fail(PipelineError::Worker {
                                worker: who,
                                source: Box::new(e),
                            });
                            None
                        }
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or(None))
            .collect()
    });
    reporter.finish();
    if let Some(e) = shared
        .first_error
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take()
    {
        return Err(e);
    }
    let mine = shared
        .skips
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .before(end_step);
    result.skips = match procs {
        Some(p) => all_ranks_counts(&p.comm(), &mine)?,
        None => mine,
    };
    let replica = finished
        .into_iter()
        .next()
        .flatten()
        .ok_or_else(|| PipelineError::Job("drafter replica 0 ended without a result".into()))?;
    Ok((replica, result))
}

/// The state all workers of a run share: queues, the first error, skip counts, phase clocks.
/// `on_abort` releases the replicas' all-reduce group on the first failure.
fn shared_state(plan: &JobPlan, on_abort: OnAbort) -> Shared {
    let p = &plan.cfg.pipeline;
    Shared {
        abort: AtomicBool::new(false),
        first_error: Mutex::new(None),
        work: BoundedQueue::new("work", (2 * plan.target_workers).max(2)),
        features: match p.routing {
            Routing::Fixed => (0..plan.drafter_workers)
                .map(|r| BoundedQueue::new(format!("features[{r}]"), p.queue_capacity.max(1)))
                .collect(),
            // As many batches in flight as with a queue per replica.
            Routing::LeastLoaded => vec![BoundedQueue::new(
                "features",
                p.queue_capacity.max(1) * plan.drafter_workers,
            )],
        },
        skips: Mutex::new(StepSkips::default()),
        stall_timeout: Duration::from_secs(p.timeout_secs.max(1)),
        on_abort,
        target_clocks: (0..plan.target_workers)
            .map(|_| PhaseClock::target())
            .collect(),
        drafter_clocks: (0..plan.drafter_workers)
            .map(|_| PhaseClock::drafter())
            .collect(),
        started: Instant::now(),
    }
}

/// The loader: work items in schedule order from the resume point; as rank `r` of `n`
/// processes (`process`), only the micro-batches `m` with `m % n == r`.
fn load_work(
    plan: &JobPlan,
    shared: &Shared,
    (start_step, end_step): (u64, u64),
    process: Option<(usize, usize)>,
) {
    let (rank, world) = process.unwrap_or((0, 1));
    let steps = plan.schedule.steps.iter().enumerate();
    for (step, work) in steps.take(end_step as usize).skip(start_step as usize) {
        let mine = work
            .micro
            .iter()
            .enumerate()
            .filter(|(m, _)| m % world == rank);
        for (m, samples) in mine {
            let item = WorkItem {
                epoch: work.epoch,
                step: step as u64,
                micro: m as u32,
                samples: samples.clone(),
            };
            if let Err(e) = shared.push_patiently(&shared.work, item, "loader") {
                shared.fail(e);
                return;
            }
        }
    }
    shared.work.close();
}
