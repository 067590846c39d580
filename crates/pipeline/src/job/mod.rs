//! Setting up and running a training job from a [`TrainConfig`], and evaluating a drafter.

mod build;
mod checkpoint;
pub mod memory;
mod plan;
mod rates;
mod replica_loop;
mod resume;
mod run;
mod setup;
mod threads;

pub use checkpoint::latest_checkpoint;
pub use plan::{JobPlan, TargetSource};
pub use rates::{PlacementReport, PlannedSplit, RateRun, measure_rates, plan_placement};

use std::path::{Path, PathBuf};
use std::sync::Arc;

use dflash_config::{PlacementMode, TrainConfig};
use dflash_data::SkipCounts;
use dflash_models::checkpoint::load_drafter;
use dflash_models::{Drafter, Qwen3Target};
use dflash_training::{TauReport, evaluate_tau};

use crate::distributed::Processes;
use crate::error::{PipelineError, Result, cause_chain};
use run::run_plan;
use setup::{EvalData, backend_for, eval_features, new_run_dir, stop_tokens};

#[derive(Debug, Clone, serde::Serialize)]
pub struct TrainOutcome {
    pub run_dir: PathBuf,
    /// Optimizer steps of the run completed so far (less than the schedule's total when
    /// `train.stop_at_step` ended this invocation early).
    pub steps: u64,
    pub final_loss: f64,
    pub final_accuracy: f64,
    pub first_loss: f64,
    pub tau_before: Option<f64>,
    pub tau_after: Option<f64>,
    /// Samples skipped in the run's steps `0..steps`, over all its invocations (a sample
    /// is counted at each visit, once per epoch); `None` when the checkpoint this
    /// invocation resumed from did not record its counts.
    pub skipped_samples: Option<u64>,
    /// The run's counts by reason, as `skipped_samples`.
    pub data: Option<SkipCounts>,
    /// The step this invocation started at (0 for a fresh run).
    pub invocation_start_step: u64,
    /// Samples skipped in this invocation's steps (`invocation_start_step..steps`).
    pub invocation_skipped_samples: u64,
    /// Rows of the training data that are empty (or Arrow null rows): never scheduled, so
    /// in neither count above.
    pub empty_rows: usize,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct EvalOutcome {
    pub report: TauReport,
    pub skipped_samples: u64,
    /// The evaluation set's counts: kept, skipped by reason, kept holding the drafter's
    /// mask token id (a warning: those samples are measured).
    pub data: SkipCounts,
}

/// `dflash eval`: tau of the drafter in `drafter_dir` on `data` with the configured target.
pub fn evaluate(cfg: &TrainConfig, drafter_dir: &Path, data: &Path) -> Result<EvalOutcome> {
    let b = backend_for(cfg, 0)?;
    let (dcfg, params) = load_drafter(b.as_ref(), drafter_dir)?;
    let target = Qwen3Target::load(b.clone(), cfg.target_dir()?, &dcfg.target_layer_ids)?;
    // Read before featurising, so that a malformed tokenizer config fails the command first.
    let stops = stop_tokens(Some(cfg.target_dir()?), target.config())?;
    let set = EvalData {
        path: data,
        max: cfg.eval.max_samples.unwrap_or(usize::MAX),
        max_positions: target.config().max_position_embeddings,
        mask_token_id: dcfg.mask_token_id,
    };
    let drafter = drafter_over(b, dcfg, params, &target)?;
    let (seqs, counts) = eval_features(cfg, &target, &set)?;
    if seqs.is_empty() {
        return Err(PipelineError::Job(format!(
            "{}: no usable sequence to evaluate ({} samples skipped; data: {counts}): each \
             needs ids in the vocabulary and two or more supervised tokens; tau is undefined",
            data.display(),
            counts.skipped()
        )));
    }
    Ok(EvalOutcome {
        report: evaluate_tau(&drafter, &seqs, &stops)?,
        skipped_samples: counts.skipped(),
        data: counts,
    })
}

/// The drafter `dcfg` (`params`, on `target`'s backend `b`) over the target's own embedding
/// and LM head: shared, as training shares them, not read and uploaded a second time (two
/// `(V, H)` tensors, ~2.5 GB at the 8B shape).
fn drafter_over(
    b: Arc<dyn dflash_core::Backend>,
    dcfg: dflash_config::DrafterConfig,
    params: dflash_models::DrafterParams,
    target: &Qwen3Target,
) -> Result<Drafter> {
    dcfg.validate_against(target.config())?;
    Ok(Drafter::new(b, dcfg, params, target.frozen().clone())?)
}

/// Runs a whole training job. With `resume`, continues the run in that directory exactly
/// where its latest checkpoint left off.
pub fn train(cfg: &TrainConfig, resume: Option<&Path>) -> Result<TrainOutcome> {
    train_in(cfg, resume, None)
}

/// [`train`] as one rank of a multi-process job (`procs`, see [`crate::distributed`]): rank
/// 0 chooses the run directory and tells the others.
pub fn train_in(
    cfg: &TrainConfig,
    resume: Option<&Path>,
    procs: Option<&Processes>,
) -> Result<TrainOutcome> {
    if let Some(dir) = resume
        && !dir.join("config.toml").exists()
        && latest_checkpoint(dir).is_none()
    {
        // Checked before the config is planned, so a wrong directory is not reported as
        // whatever the config then lacks.
        return Err(PipelineError::Job(format!(
            "{}: not a run directory (no config.toml, no checkpoints/latest); --resume takes \
             a directory that `train` created",
            dir.display()
        )));
    }
    if let Some(p) = procs {
        let devices = dflash_core::registry::device_count(&cfg.backend.name)?;
        crate::distributed::check_auto_placement(p.world_size(), &cfg.pipeline, devices)?;
    }
    // A resumed run keeps the device lists its first invocation chose.
    let cfg = match resume {
        None => &rates::resolve_auto(cfg)?,
        Some(dir) => &resumed_placement(cfg, dir)?,
    };
    let run_dir = resume
        .map(Path::to_path_buf)
        .unwrap_or_else(|| new_run_dir(cfg));
    let run_dir = match procs {
        Some(p) => p.run_dirs(&run_dir)?.1,
        None => run_dir,
    };
    in_run_dir(&run_dir, || {
        run_plan(&JobPlan::new(cfg)?, &run_dir, resume.is_some(), procs)
    })
}

/// `cfg` for resuming the run in `dir`. The run's first invocation resolved `placement =
/// "auto"` into device lists and wrote them into `dir/config.toml`; a config that still says
/// "auto" (`--resume` with `--config`, read in place of the saved one) takes the run's
/// placement from there. Else the plan would fall back to one target and one drafter, and
/// the config this invocation writes back would lose the planned split for every later
/// resume. A run whose saved config holds no lists is planned again, as a fresh run is.
fn resumed_placement(cfg: &TrainConfig, dir: &Path) -> Result<TrainConfig> {
    if cfg.pipeline.placement != PlacementMode::Auto {
        return Ok(cfg.clone());
    }
    let path = dir.join("config.toml");
    let saved = match path.exists() {
        true => Some(TrainConfig::load(Some(&path), &[])?.pipeline),
        false => None,
    };
    let Some(saved) = saved.filter(|s| s.placement != PlacementMode::Auto) else {
        return rates::resolve_auto(cfg);
    };
    eprintln!(
        "pipeline.placement = \"auto\": resuming with the run's planned placement from {}: \
         target devices {:?}, drafter devices {:?}",
        path.display(),
        saved.target_devices.as_deref().unwrap_or_default(),
        saved.drafter_devices.as_deref().unwrap_or_default()
    );
    let mut out = cfg.clone();
    let p = &mut out.pipeline;
    p.placement = saved.placement;
    p.target_devices = saved.target_devices;
    p.drafter_devices = saved.drafter_devices;
    p.target_workers = saved.target_workers;
    p.drafter_workers = saved.drafter_workers;
    Ok(out)
}

/// Runs a planned job in a new run directory `run_dir` (the bench runs the job this way,
/// with a random target).
pub fn train_plan(plan: &JobPlan, run_dir: &Path) -> Result<TrainOutcome> {
    in_run_dir(run_dir, || run_plan(plan, run_dir, false, None))
}

/// Creates `run_dir`, runs `job`, and writes its error's whole cause chain to
/// `RUN_DIR/error.txt` when it fails.
fn in_run_dir(run_dir: &Path, job: impl FnOnce() -> Result<TrainOutcome>) -> Result<TrainOutcome> {
    std::fs::create_dir_all(run_dir).map_err(PipelineError::io(run_dir))?;
    let result = job().map_err(PipelineError::with_fit_advice);
    if let Err(e) = &result {
        let _ = std::fs::write(run_dir.join("error.txt"), cause_chain(e) + "\n");
    }
    result
}

#[cfg(test)]
mod tests {
    use dflash_config::{DType, DrafterConfig, DrafterShape};
    use dflash_models::DrafterParams;

    use super::*;

    const TARGET: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../assets/tiny-target");

    /// `dflash eval` holds one copy of the target's embedding and LM head: the drafter's
    /// are the target's own tensors.
    #[test]
    fn the_evaluated_drafter_shares_the_targets_embedding_and_lm_head() {
        dflash_backend_reference::link();
        let b = dflash_core::registry::create_backend("reference", &Default::default()).unwrap();
        let dir = Path::new(TARGET);
        let t = dflash_config::Qwen3Config::from_file(dir.join("config.json")).unwrap();
        let shape = DrafterShape {
            num_layers: 1,
            num_target_features: 2,
            dtype: DType::Float32,
            ..DrafterShape::standard(t.vocab_size as u32 - 1)
        };
        let cfg = DrafterConfig::for_target(&t, &shape).unwrap();
        let target = Qwen3Target::load(b.clone(), dir, &cfg.target_layer_ids).unwrap();
        assert_eq!(Arc::strong_count(target.frozen()), 1);
        let params = DrafterParams::init_random(b.as_ref(), &cfg, 0.02, 1).unwrap();
        let _drafter = drafter_over(b, cfg, params, &target).unwrap();
        assert_eq!(
            Arc::strong_count(target.frozen()),
            2,
            "the drafter holds a copy of its own"
        );
    }
}
