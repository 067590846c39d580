//! The threaded run loop of a training job: target workers feeding the drafter replicas
//! through bounded queues, with periodic reports, evals and checkpoints.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dflash_config::{Qwen3Config, TrainConfig};
use dflash_core::Communicator;
use dflash_data::{Dataset, SkipCounts, open_dataset};
use dflash_models::checkpoint::load_drafter;
use dflash_models::drafter::FrozenTarget;
use dflash_models::safetensors_io::write_atomic;
use dflash_models::{Drafter, DrafterParams, Qwen3Target};
use dflash_queue::BoundedQueue;
use dflash_queue::Queue;
use dflash_training::optimizer::AdamWHyper;
use dflash_training::{
    AdamW, BlockSpec, DrafterReplica, LrSchedule, PreparedSeq, evaluate_tau, state,
};

use super::TrainOutcome;
use super::checkpoint::{latest_checkpoint, publish_checkpoint};
use super::setup::{backend_for, drafter_config, eval_features, stop_tokens, too_long};
use crate::comm::HostComm;
use crate::error::{PipelineError, Result};
use crate::report::Reporter;
use crate::schedule::Schedule;
use crate::workers::{Reorder, SampleRules, Shared, WorkItem, add_busy, target_worker};

pub(super) fn train_in(cfg: &TrainConfig, run_dir: &Path, resuming: bool) -> Result<TrainOutcome> {
    // `train.stop_at_step` belongs to this invocation, not to the run: the config kept in the
    // run directory (which `train --resume` reuses) leaves it out.
    let mut kept = cfg.clone();
    kept.train.stop_at_step = None;
    let resolved = kept.to_toml_string()?;
    write_atomic(&run_dir.join("config.toml"), resolved.as_bytes())?;
    let _ = std::fs::remove_file(run_dir.join("error.txt"));

    let tcfg = Qwen3Config::from_file(cfg.target_dir()?.join("config.json"))?;
    let dcfg = drafter_config(cfg, &tcfg)?;
    let n_targets = cfg.pipeline.target_workers.max(1);
    let n_drafters = cfg.pipeline.drafter_workers.max(1);

    // Backends: targets on devices 0..T, drafters on T..T+D, wrapping around when there are
    // fewer devices than workers (a device then hosts target and drafter work on their own
    // streams). CPU backends have one device.
    let n_dev = dflash_core::registry::device_count(&cfg.backend.name)?.max(1);
    let target_backends = (0..n_targets)
        .map(|i| backend_for(cfg, i % n_dev))
        .collect::<Result<Vec<_>>>()?;
    let drafter_backends = (0..n_drafters)
        .map(|i| backend_for(cfg, (n_targets + i) % n_dev))
        .collect::<Result<Vec<_>>>()?;

    let b0 = &drafter_backends[0];
    eprintln!(
        "backend {} on {} | attention kernel {} | {} target worker(s), {} drafter replica(s)",
        b0.name(),
        b0.device(),
        b0.attention_kernel(),
        n_targets,
        n_drafters
    );
    let targets = target_backends
        .iter()
        .map(|b| {
            Ok(Arc::new(Qwen3Target::load(
                b.clone(),
                cfg.target_dir()?,
                &dcfg.target_layer_ids,
            )?))
        })
        .collect::<Result<Vec<_>>>()?;

    // Data and the deterministic schedule.
    let train_data: Arc<dyn Dataset> = Arc::from(open_dataset(cfg.train_data()?)?);
    let lengths: Vec<usize> = (0..train_data.len())
        .map(|i| train_data.seq_len(i).min(cfg.data.max_len))
        .collect();
    let (schedule, plans) = Schedule::new(
        &lengths,
        &cfg.data.bucket_bounds,
        cfg.data.token_budget,
        cfg.train.seed,
        cfg.train.epochs as u64,
        cfg.train.micro_batches_per_step,
        cfg.train.max_steps,
    );
    eprintln!(
        "train data {}: {} samples",
        cfg.train_data()?.display(),
        train_data.len()
    );
    if let Some(p) = plans.first() {
        eprintln!("{}", p.bucket_summary());
    }
    if schedule.is_empty() {
        return Err(PipelineError::Job(
            "the schedule has no steps: is the dataset empty?".into(),
        ));
    }
    let total_steps = schedule.len() as u64;
    // `train.stop_at_step` ends this invocation early without touching the schedule.
    let end_step = cfg
        .train
        .stop_at_step
        .map_or(total_steps, |s| s.min(total_steps));
    let spec = BlockSpec {
        block_size: dcfg.block_size,
        num_anchors: cfg.data.num_anchors,
        gamma: cfg
            .data
            .gamma
            .map_or_else(|| dflash_data::default_gamma(dcfg.block_size), |g| g as f32),
        mask_token_id: dcfg.mask_token_id,
        seed: cfg.train.seed,
    };

    // Replicas: identical initial weights on every rank.
    let hyper = AdamWHyper {
        beta1: cfg.train.beta1 as f32,
        beta2: cfg.train.beta2 as f32,
        eps: cfg.train.eps as f32,
        weight_decay: cfg.train.weight_decay as f32,
    };
    let mut replicas = Vec::new();
    for b in &drafter_backends {
        let params = match &cfg.drafter.init_from {
            Some(dir) => load_drafter(b.as_ref(), dir)?.1,
            None => DrafterParams::init_random(b.as_ref(), &dcfg, 0.02, cfg.train.seed)?,
        };
        let (_, frozen) = FrozenTarget::load(b.as_ref(), cfg.target_dir()?)?;
        let drafter = Drafter::new(b.clone(), dcfg.clone(), params, Arc::new(frozen))?;
        let opt = AdamW::new(b.as_ref(), &dcfg, hyper)?;
        replicas.push(DrafterReplica::new(
            drafter,
            opt,
            cfg.train.recompute,
            cfg.train.grad_clip,
            cfg.train.max_nonfinite_steps,
        )?);
    }
    if resuming {
        let ckpt = latest_checkpoint(run_dir).ok_or_else(|| {
            PipelineError::Job(format!(
                "{}: no checkpoint to resume from",
                run_dir.display()
            ))
        })?;
        for r in &mut replicas {
            state::load_into(&ckpt, r)?;
        }
        eprintln!("resuming {} at step {}", ckpt.display(), replicas[0].step);
    }
    let start_step = replicas[0].step;
    eprintln!(
        "drafter: {} layers, {:.2} M parameters, block {}, target layers {:?}; {} steps",
        dcfg.num_hidden_layers,
        replicas[0].drafter.params.num_params() as f64 / 1e6,
        dcfg.block_size,
        dcfg.target_layer_ids,
        total_steps
    );

    // Evaluation data, featurised once.
    let eval_seqs = match &cfg.data.eval {
        Some(p) => Some(
            eval_features(
                cfg,
                targets[0].as_ref(),
                p,
                cfg.eval.max_samples.unwrap_or(usize::MAX),
            )?
            .0,
        ),
        None => None,
    };
    let tau_before = match (&eval_seqs, resuming) {
        (Some(seqs), false) => {
            let t = evaluate_tau(&replicas[0].drafter, seqs, &stop_tokens(&tcfg))?.tau;
            eprintln!("tau before training: {t:.3}");
            Some(t)
        }
        _ => None,
    };

    let lr = LrSchedule::new(
        cfg.train.lr,
        total_steps,
        cfg.train.warmup_ratio,
        cfg.train.min_lr_ratio,
    );
    let comms = HostComm::group(n_drafters);
    let abort_comm = comms[0].clone();
    let shared = Shared {
        abort: AtomicBool::new(false),
        first_error: Mutex::new(None),
        work: BoundedQueue::new("work", (2 * n_targets).max(2)),
        features: (0..n_drafters)
            .map(|r| {
                BoundedQueue::new(format!("features[{r}]"), cfg.pipeline.queue_capacity.max(1))
            })
            .collect(),
        skips: Mutex::new(SkipCounts::default()),
        stall_timeout: Duration::from_secs(cfg.pipeline.timeout_secs.max(1)),
        on_abort: Box::new(move || abort_comm.abort()),
        target_busy: (0..n_targets).map(|_| AtomicU64::new(0)).collect(),
        drafter_busy: (0..n_drafters).map(|_| AtomicU64::new(0)).collect(),
        started: Instant::now(),
    };
    let rules = SampleRules {
        vocab_size: tcfg.vocab_size,
        max_len: cfg.data.max_len,
        min_supervised: cfg.data.min_supervised,
        too_long: too_long(cfg),
    };
    let step_tokens: Vec<u64> = schedule
        .steps
        .iter()
        .map(|s| s.micro.iter().flatten().map(|&i| lengths[i] as u64).sum())
        .collect();

    let mut reporter = Reporter::new(run_dir, start_step, total_steps, cfg.train.log_every)?;
    let mut first_loss = f64::NAN;
    let mut last = (f64::NAN, f64::NAN);
    let finished: Vec<Option<DrafterReplica>> = std::thread::scope(|scope| {
        let shared = &shared;
        let schedule = &schedule;
        // Loader: work items in schedule order from the resume point.
        scope.spawn(move || {
            let steps = schedule.steps.iter().enumerate();
            for (step, work) in steps.take(end_step as usize).skip(start_step as usize) {
                for (m, samples) in work.micro.iter().enumerate() {
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
        });
        for (i, target) in targets.iter().enumerate() {
            let data = train_data.clone();
            let target = target.clone();
            scope.spawn(move || {
                if let Err(e) = target_worker(i, shared, target.as_ref(), data.as_ref(), rules) {
                    shared.fail(PipelineError::Worker {
                        worker: format!("target worker {i}"),
                        source: Box::new(e),
                    });
                }
            });
        }
        let mut handles = Vec::new();
        let mut rank0 = Some((&mut reporter, &mut first_loss, &mut last));
        for (rank, (mut replica, comm)) in replicas.into_iter().zip(comms).enumerate() {
            let spec = &spec;
            let lr = &lr;
            let step_tokens = &step_tokens;
            let mut rank0 = if rank == 0 { rank0.take() } else { None };
            handles.push(scope.spawn(move || {
                let who = format!("drafter replica {rank}");
                let world = comm.world_size();
                let mut reorder = Reorder::new();
                let mut run = || -> Result<()> {
                    // `step` indexes the schedule, the LR schedule and the token counts alike.
                    #[allow(clippy::needless_range_loop)]
                    for step in start_step as usize..end_step as usize {
                        let work = &schedule.steps[step];
                        for m in (0..work.micro.len()).filter(|m| m % world == rank) {
                            let batch = reorder.next(shared, &shared.features[rank], step as u64, m as u32, &who)?;
                            let t0 = Instant::now();
                            for seq in batch.seqs {
                                replica.accumulate(&PreparedSeq::new(seq, batch.epoch, spec))?;
                            }
                            add_busy(&shared.drafter_busy[rank], t0);
                        }
                        let summary = replica.finish_step(&comm, lr.lr(step as u64))?;
                        if let Some((rep, first_loss, last)) = rank0.as_mut() {
                            rep.step(&summary, work.epoch, step_tokens[step], shared.gauges())?;
                            if first_loss.is_nan() {
                                **first_loss = summary.stats.loss();
                            }
                            **last = (summary.stats.loss(), summary.stats.accuracy());
                            let n = step as u64 + 1;
                            if (cfg.train.save_every > 0 && n.is_multiple_of(cfg.train.save_every))
                                || n == total_steps
                                || n == end_step
                            {
                                let extra = serde_json::json!({ "epoch": work.epoch, "seed": cfg.train.seed });
                                publish_checkpoint(run_dir, &replica, extra)?;
                            }
                        }
                    }
                    Ok(())
                };
                match run() {
                    Ok(()) => Some(replica),
                    Err(e) => {
                        shared.fail(PipelineError::Worker { worker: who, source: Box::new(e) });
                        None
                    }
                }
            }));
        }
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
    if end_step < total_steps && start_step < end_step {
        eprintln!(
            "stopped after step {end_step} of {total_steps} (train.stop_at_step); \
             continue with `train --resume {}`",
            run_dir.display()
        );
    }
    let skips = shared
        .skips
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    if skips.skipped() > 0 || skips != SkipCounts::default() {
        eprintln!("data: {skips}");
    }
    let replica = finished
        .into_iter()
        .next()
        .flatten()
        .ok_or_else(|| PipelineError::Job("drafter replica 0 ended without a result".into()))?;
    let b = replica.drafter.backend().clone();
    // The served drafter, in the dtype the job asks for (checkpoints keep f32).
    let served = dflash_config::DrafterConfig {
        dtype: cfg.drafter.save_dtype,
        ..replica.drafter.config().clone()
    };
    dflash_models::checkpoint::save_drafter(b.as_ref(), run_dir, &served, &replica.drafter.params)?;
    let tau_after = match &eval_seqs {
        Some(seqs) => {
            let t = evaluate_tau(&replica.drafter, seqs, &stop_tokens(&tcfg))?.tau;
            eprintln!("tau after training: {t:.3}");
            Some(t)
        }
        None => None,
    };
    let outcome = TrainOutcome {
        run_dir: run_dir.to_path_buf(),
        steps: end_step,
        final_loss: last.0,
        final_accuracy: last.1,
        first_loss,
        tau_before,
        tau_after,
        skipped_samples: skips.skipped(),
    };
    let json = serde_json::to_string_pretty(&outcome).expect("outcome serialises");
    write_atomic(&run_dir.join("summary.json"), json.as_bytes())?;
    Ok(outcome)
}
