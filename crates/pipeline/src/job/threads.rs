//! The run's threads: the loader, the target workers feeding the drafter replicas through
//! bounded queues, and the replicas, all spawned in one scope and joined at its end; and
//! what they leave behind.

use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::thread::{Scope, ScopedJoinHandle};
use std::time::{Duration, Instant};

use dflash_config::Routing;
use dflash_core::Communicator;
use dflash_data::SkipCounts;
use dflash_models::Qwen3Target;
use dflash_queue::BoundedQueue;
use dflash_queue::Queue;
use dflash_training::DrafterReplica;

use super::checkpoint::{CheckpointWriter, Figures};
use super::plan::JobPlan;
use super::replica_loop::{DrafterLoop, Lead};
use crate::comm::HostComm;
use crate::distributed::{Processes, all_ranks_counts};
use crate::error::{PipelineError, Result};
use crate::phases::PhaseClock;
use crate::report::Reporter;
use crate::workers::{OnAbort, Shared, SharedRouter, StepSkips, WorkItem, target_worker};

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
    pub(super) fn run_skips(&self) -> Option<SkipCounts> {
        self.with_carried(&self.skips)
    }
}

/// Where a run's workers write and report: this process's run directory, whether
/// checkpoints are written in the background, when the job started, and the group of
/// processes it is one rank of.
#[derive(Clone, Copy)]
pub(super) struct RunPlace<'a> {
    pub(super) run_dir: &'a Path,
    pub(super) background_checkpoints: bool,
    pub(super) job_start: Instant,
    pub(super) procs: Option<&'a Processes>,
}

/// Spawns the loader, the target workers and the drafter replicas, runs steps from the
/// replicas' step to `end_step`, and returns replica 0 with the run's figures (`carried`
/// updated).
pub(super) fn run_workers(
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
    let (comms, on_abort) = communicators(plan, procs);
    if comms.len() != replicas.len() {
        // One all-reduce member a replica: a replica without one would never be spawned.
        return Err(PipelineError::Job(format!(
            "{} drafter replica(s) but {} all-reduce member(s)",
            replicas.len(),
            comms.len()
        )));
    }
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
    let workers = Workers {
        plan,
        shared: &shared,
        router: &router,
        run_dir,
        background_checkpoints,
        process,
        steps: (start_step, end_step),
    };
    let finished: Vec<Option<DrafterReplica>> = std::thread::scope(|scope| {
        workers.spawn_feeders(scope, &targets);
        let rank0 = (&mut reporter, &mut result);
        let handles = workers.spawn_replicas(scope, replicas, comms, rank0);
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or(None))
            .collect()
    });
    reporter.finish();
    collect_result(&shared, procs, end_step, finished, result)
}

/// What the workers leave once all have ended: the run's first error, else replica 0 with
/// `result` holding this invocation's skip counts before `end_step` (summed over the ranks
/// of `procs`).
fn collect_result(
    shared: &Shared,
    procs: Option<&Processes>,
    end_step: u64,
    finished: Vec<Option<DrafterReplica>>,
    mut result: RunResult,
) -> Result<(DrafterReplica, RunResult)> {
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

/// The replicas' all-reduce groups, one a replica, and what releases them on the first
/// failure. In-process replicas sum through host threads; a process's one replica through
/// the group of processes.
fn communicators(
    plan: &JobPlan,
    procs: Option<&Processes>,
) -> (Vec<Box<dyn Communicator>>, OnAbort) {
    match procs {
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
    }
}

/// What a run's worker threads share: the plan, the workers' shared state, least-loaded
/// routing's hand-out, where checkpoints go, this process's rank and world size in a
/// multi-process run, and the steps to run (`start..end`).
#[derive(Clone, Copy)]
struct Workers<'a> {
    plan: &'a JobPlan,
    shared: &'a Shared,
    router: &'a SharedRouter,
    run_dir: &'a Path,
    background_checkpoints: bool,
    process: Option<(usize, usize)>,
    steps: (u64, u64),
}

impl<'a> Workers<'a> {
    /// Spawns the loader and one thread per target worker in `scope`, which joins them when
    /// it ends; a target worker's error fails the run.
    fn spawn_feeders<'scope>(self, scope: &'scope Scope<'scope, '_>, targets: &[Arc<Qwen3Target>])
    where
        'a: 'scope,
    {
        let (plan, shared, process) = (self.plan, self.shared, self.process);
        scope.spawn(move || {
            guarded(shared, "the loader", || {
                load_work(plan, shared, self.steps, process)
            })
        });
        for (i, target) in targets.iter().enumerate() {
            let data = plan.train_data.clone();
            let target = target.clone();
            let who = format!("target worker {i}");
            scope.spawn(move || {
                guarded(shared, &who, || {
                    let run = target_worker(i, shared, target.as_ref(), data.as_ref(), plan.rules);
                    if let Err(e) = run {
                        shared.fail(PipelineError::Worker {
                            worker: who.clone(),
                            source: Box::new(e),
                        });
                    }
                })
            });
        }
    }

    /// Spawns one thread per replica in `scope`, each with its communicator, replica 0 with
    /// the reporter and the run's result (`rank0`); their handles in replica order.
    fn spawn_replicas<'scope>(
        self,
        scope: &'scope Scope<'scope, '_>,
        replicas: Vec<DrafterReplica>,
        comms: Vec<Box<dyn Communicator>>,
        rank0: (&'scope mut Reporter, &'scope mut RunResult),
    ) -> Vec<ScopedJoinHandle<'scope, Option<DrafterReplica>>>
    where
        'a: 'scope,
    {
        let mut rank0 = Some(rank0);
        replicas
            .into_iter()
            .zip(comms)
            .enumerate()
            .map(|(rank, (replica, comm))| {
                let lead = if rank == 0 { rank0.take() } else { None };
                let who = replica_name(rank, self.process);
                scope.spawn(move || {
                    guarded(self.shared, &who, || {
                        self.replica(rank, replica, comm, lead)
                    })
                    .flatten()
                })
            })
            .collect()
    }

    /// Replica `rank`'s thread: its loop over the steps (with replica 0's duties when `lead`
    /// is given). Returns the replica, or `None` after failing the run with its error.
    fn replica(
        self,
        rank: usize,
        mut replica: DrafterReplica,
        comm: Box<dyn Communicator>,
        lead: Option<(&mut Reporter, &mut RunResult)>,
    ) -> Option<DrafterReplica> {
        let (plan, shared, process) = (self.plan, self.shared, self.process);
        let who = replica_name(rank, process);
        // Checkpoints are rank 0's alone.
        let saves = process.is_none_or(|(r, _)| r == 0);
        let lead = lead.map(|(reporter, result)| Lead {
            reporter,
            result,
            checkpoints: saves
                .then(|| CheckpointWriter::new(self.run_dir, self.background_checkpoints)),
        });
        let run = DrafterLoop {
            plan,
            shared,
            rank,
            who: &who,
            comm: comm.as_ref(),
            processes: process.map(|_| comm.as_ref()),
            // Across processes each rank has its own share, fixed.
            router: (plan.cfg.pipeline.routing == Routing::LeastLoaded && process.is_none())
                .then_some(self.router),
        };
        let (start_step, end_step) = self.steps;
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
    }
}

/// Drafter replica `rank`'s name in messages (with its process rank where there are several).
fn replica_name(rank: usize, process: Option<(usize, usize)>) -> String {
    match process {
        Some((r, _)) => format!("rank {r} drafter replica {rank}"),
        None => format!("drafter replica {rank}"),
    }
}

/// Runs worker `who`'s body. A panic in it (a bug, or `DFLASH_FAULT=panic:...`) fails the run
/// as an error would, naming the worker and the panic's message, so that no other worker is
/// left waiting for it on a queue or in the all-reduce; `None` then. Nothing of the panicked
/// worker's own state is used afterwards, and what it shares is behind poison-tolerant locks.
fn guarded<T>(shared: &Shared, who: &str, body: impl FnOnce() -> T) -> Option<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)) {
        Ok(v) => Some(v),
        Err(payload) => {
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".into());
            shared.fail(PipelineError::Worker {
                worker: who.to_string(),
                source: Box::new(PipelineError::Job(format!("panicked: {message}"))),
            });
            None
        }
    }
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
