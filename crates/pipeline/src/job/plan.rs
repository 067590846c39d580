//! A job's plan: everything `train` derives from its config, built in one place before any
//! thread starts, so the run (`run.rs`, `threads.rs`) only builds and runs workers and the
//! bench can build the same plan for the job it measures.

use std::path::PathBuf;
use std::sync::Arc;

use dflash_config::{DrafterConfig, Qwen3Config, TrainConfig};
use dflash_data::{BatchPlan, Dataset, open_dataset};
use dflash_training::optimizer::AdamWHyper;
use dflash_training::{BlockSpec, LrSchedule};

use super::memory::{MicroShape, largest_micro};
use super::setup::{drafter_config, too_long};
use crate::error::{PipelineError, Result};
use crate::placement::Placement;
use crate::schedule::Schedule;
use crate::workers::SampleRules;

/// Where the frozen target's weights come from.
#[derive(Debug, Clone)]
pub enum TargetSource {
    /// An HF checkpoint directory (`target.path`).
    Dir(PathBuf),
    /// Random weights of this shape, drawn on each worker's device (benchmarks, tests).
    Random { config: Qwen3Config, seed: u64 },
}

impl TargetSource {
    pub fn config(&self) -> Result<Qwen3Config> {
        match self {
            TargetSource::Dir(dir) => Ok(Qwen3Config::from_file(dir.join("config.json"))?),
            TargetSource::Random { config, .. } => Ok(config.clone()),
        }
    }
}

/// The resolved job.
pub struct JobPlan {
    pub cfg: TrainConfig,
    pub target: TargetSource,
    pub target_config: Qwen3Config,
    pub drafter: DrafterConfig,
    pub spec: BlockSpec,
    pub hyper: AdamWHyper,
    pub rules: SampleRules,
    pub target_workers: usize,
    pub drafter_workers: usize,
    pub train_data: Arc<dyn Dataset>,
    pub schedule: Schedule,
    /// One line per length bucket of the first epoch.
    pub bucket_summary: Option<String>,
    /// Samples of length 0 (empty, or an Arrow null row): never scheduled, so never in the
    /// run's skip counts; reported next to them.
    pub empty_samples: usize,
    /// Tokens of each step (after truncation to `data.max_len`), samples that the target
    /// workers will skip included: what the schedule packs, reported as the step's `tokens`.
    pub step_tokens: Vec<u64>,
    /// Each sample's length after truncation to `data.max_len` (what the schedule packs).
    pub lengths: Vec<usize>,
    /// Tokens of the evaluation set as it is featurised (the first `eval.max_samples`
    /// samples of `data.eval`, each at most `data.max_len`): its features stay in host memory
    /// for the whole run. 0 without an evaluation set.
    pub eval_tokens: usize,
    /// Samples of the evaluation set as it is featurised (at most `eval.max_samples`).
    pub eval_samples: usize,
    pub lr: LrSchedule,
}

impl JobPlan {
    /// The plan of `cfg` with the target of `target.path`.
    pub fn new(cfg: &TrainConfig) -> Result<Self> {
        Self::with_target(cfg, TargetSource::Dir(cfg.target_dir()?.to_path_buf()))
    }

    /// The plan of `cfg` with the frozen target's weights from `target`.
    pub fn with_target(cfg: &TrainConfig, target: TargetSource) -> Result<Self> {
        let target_config = target.config()?;
        let drafter = drafter_config(cfg, &target_config)?;
        let train_data: Arc<dyn Dataset> = Arc::from(open_dataset(cfg.train_data()?)?);
        let lengths: Vec<usize> = (0..train_data.len())
            .map(|i| train_data.seq_len(i).min(cfg.data.max_len))
            .collect();
        let (schedule, plans) = schedule(cfg, &lengths, train_data.len())?;
        let (eval_samples, eval_tokens) = eval_size(cfg)?;
        let step_tokens = schedule
            .steps
            .iter()
            .map(|s| s.micro.iter().flatten().map(|&i| lengths[i] as u64).sum())
            .collect();
        let spec = block_spec(cfg, &drafter);
        let hyper = AdamWHyper {
            beta1: cfg.train.beta1 as f32,
            beta2: cfg.train.beta2 as f32,
            eps: cfg.train.eps as f32,
            weight_decay: cfg.train.weight_decay as f32,
        };
        let rules = sample_rules(cfg, &target_config, &drafter);
        let total_steps = schedule.len() as u64;
        let lr = LrSchedule::new(
            cfg.train.lr,
            total_steps,
            cfg.train.warmup_ratio,
            cfg.train.min_lr_ratio,
        );
        Ok(JobPlan {
            cfg: cfg.clone(),
            target,
            target_config,
            drafter,
            spec,
            hyper,
            rules,
            target_workers: cfg
                .pipeline
                .target_devices
                .as_ref()
                .map_or(cfg.pipeline.target_workers, Vec::len)
                .max(1),
            drafter_workers: cfg
                .pipeline
                .drafter_devices
                .as_ref()
                .map_or(cfg.pipeline.drafter_workers, Vec::len)
                .max(1),
            train_data,
            bucket_summary: plans.first().map(|p| p.bucket_summary().to_string()),
            empty_samples: lengths.iter().filter(|&&l| l == 0).count(),
            schedule,
            step_tokens,
            lengths,
            eval_tokens,
            eval_samples,
            lr,
        })
    }

    /// The schedule's largest micro-batch with `num_anchors` anchors per document.
    pub fn largest_micro(&self, num_anchors: usize) -> MicroShape {
        largest_micro(&self.schedule, &self.lengths, num_anchors)
    }

    /// The largest micro-batch the schedule would have with `data.token_budget = budget`.
    pub fn micro_with_budget(&self, budget: usize) -> MicroShape {
        let cfg = &self.cfg;
        let (schedule, _) = Schedule::new(
            &self.lengths,
            &cfg.data.bucket_bounds,
            budget,
            cfg.train.seed,
            cfg.train.epochs as u64,
            cfg.train.micro_batches_per_step,
            cfg.train.max_steps,
        );
        largest_micro(&schedule, &self.lengths, cfg.data.num_anchors)
    }

    /// The devices of the workers: `pipeline.target_devices` / `drafter_devices` where given,
    /// round robin otherwise; an index past the backend's devices is an error naming its field.
    pub fn placement(&self) -> Result<Placement> {
        let p = &self.cfg.pipeline;
        let n_dev = dflash_core::registry::device_count(&self.cfg.backend.name)?.max(1);
        let rr = Placement::round_robin(self.target_workers, self.drafter_workers, n_dev);
        let placed = Placement {
            targets: p.target_devices.clone().unwrap_or(rr.targets),
            drafters: p.drafter_devices.clone().unwrap_or(rr.drafters),
        };
        if let Some((field, d)) = placed.out_of_range(n_dev) {
            return Err(PipelineError::Job(format!(
                "{field}: device {d} does not exist: backend {} has {n_dev} device(s), 0..={}",
                self.cfg.backend.name,
                n_dev - 1
            )));
        }
        Ok(placed)
    }

    pub fn total_steps(&self) -> u64 {
        self.schedule.len() as u64
    }

    /// The step this invocation ends after: `train.stop_at_step` ends it early without
    /// touching the schedule.
    pub fn end_step(&self) -> u64 {
        let total = self.total_steps();
        self.cfg.train.stop_at_step.map_or(total, |s| s.min(total))
    }
}

/// The schedule of the training data (`lengths`, of its `samples` samples) with each epoch's
/// batch plan; an error when it has no steps.
fn schedule(
    cfg: &TrainConfig,
    lengths: &[usize],
    samples: usize,
) -> Result<(Schedule, Vec<BatchPlan>)> {
    let (schedule, plans) = Schedule::new(
        lengths,
        &cfg.data.bucket_bounds,
        cfg.data.token_budget,
        cfg.train.seed,
        cfg.train.epochs as u64,
        cfg.train.micro_batches_per_step,
        cfg.train.max_steps,
    );
    if schedule.is_empty() {
        return Err(PipelineError::Job(format!(
            "the schedule has no steps: {} holds {} samples (train.epochs {}, \
             train.max_steps {:?})",
            cfg.train_data()?.display(),
            samples,
            cfg.train.epochs,
            cfg.train.max_steps
        )));
    }
    Ok((schedule, plans))
}

/// Samples and tokens of the evaluation set as it is featurised: the first
/// `eval.max_samples` samples of `data.eval`, each at most `data.max_len`; none without an
/// evaluation set.
fn eval_size(cfg: &TrainConfig) -> Result<(usize, usize)> {
    Ok(match &cfg.data.eval {
        Some(p) => {
            let data = open_dataset(p)?;
            let n = data.len().min(cfg.eval.max_samples.unwrap_or(usize::MAX));
            let tokens = (0..n).map(|i| data.seq_len(i).min(cfg.data.max_len)).sum();
            (n, tokens)
        }
        None => (0, 0),
    })
}

/// How the drafter's training blocks are drawn: its block size and mask token, the
/// config's anchors, loss decay (`data.gamma`, else the block size's default) and seed.
fn block_spec(cfg: &TrainConfig, drafter: &DrafterConfig) -> BlockSpec {
    BlockSpec {
        block_size: drafter.block_size,
        num_anchors: cfg.data.num_anchors,
        // The config's gamma, so that what trains is what `TrainConfig::gamma` reports.
        gamma: cfg.gamma(drafter.block_size) as f32,
        mask_token_id: drafter.mask_token_id,
        seed: cfg.train.seed,
    }
}

/// What a training sample must satisfy to be kept, from the data config and the target's
/// vocabulary and positions.
fn sample_rules(cfg: &TrainConfig, target: &Qwen3Config, drafter: &DrafterConfig) -> SampleRules {
    SampleRules {
        vocab_size: target.vocab_size,
        max_len: cfg.data.max_len,
        min_supervised: cfg.data.min_supervised,
        too_long: too_long(cfg),
        max_positions: target.max_position_embeddings,
        mask_token_id: Some(drafter.mask_token_id),
    }
}
