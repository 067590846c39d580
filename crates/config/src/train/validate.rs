//! Range checks of the training config, kept apart from loading: every rule names the
//! `section.key` it rejects, so the loader can say which layer set it.

use super::{
    BackendSection, DataSection, DrafterSection, PipelineSection, PlacementMode, RunSection,
    TrainConfig, TrainSection,
};
use crate::error::{ConfigError, Result};

/// `backend.threads` above this many per core is a typo, not a tuning choice.
const MAX_THREADS_PER_CORE: usize = 4;

impl TrainConfig {
    /// Range checks of every field; errors name the field (`section.key`).
    pub fn validate(&self) -> Result<()> {
        // The order of the checks decides which error a config with several faults reports.
        self.check_counts()?;
        check_drafter(&self.drafter, &self.data)?;
        check_threads(&self.backend)?;
        check_pipeline(&self.pipeline)?;
        check_data(&self.data)?;
        check_train(&self.train)?;
        check_backend_names(&self.backend)?;
        check_run(&self.run)
    }

    /// Counts (of every section) that must be at least 1, always or when set.
    fn check_counts(&self) -> Result<()> {
        let d = &self.drafter;
        let data = &self.data;
        let t = &self.train;
        let p = &self.pipeline;
        for (field, v) in [
            ("drafter.num_layers", d.num_layers),
            ("data.max_len", data.max_len),
            ("data.num_anchors", data.num_anchors),
            ("train.micro_batches_per_step", t.micro_batches_per_step),
            ("pipeline.target_workers", p.target_workers),
            ("pipeline.drafter_workers", p.drafter_workers),
            ("pipeline.queue_capacity", p.queue_capacity),
        ] {
            if v == 0 {
                return bad(field, "must be at least 1".into());
            }
        }
        for (field, v) in [
            ("drafter.num_target_features", d.num_target_features),
            ("drafter.intermediate_size", d.intermediate_size),
            ("drafter.num_attention_heads", d.num_attention_heads),
            ("drafter.num_key_value_heads", d.num_key_value_heads),
            ("drafter.head_dim", d.head_dim),
            ("eval.max_samples", self.eval.max_samples),
            ("train.max_steps", t.max_steps.map(|s| s as usize)),
            ("train.stop_at_step", t.stop_at_step.map(|s| s as usize)),
        ] {
            if v == Some(0) {
                return bad(field, "must be at least 1 when set".into());
            }
        }
        Ok(())
    }
}

/// The `field` error of the training config.
fn bad(field: &str, message: String) -> Result<()> {
    Err(ConfigError::Invalid {
        origin: "training config".into(),
        field: field.into(),
        message,
    })
}

/// The drafter's block size and target layer ids, alone and against `data.max_len`.
fn check_drafter(d: &DrafterSection, data: &DataSection) -> Result<()> {
    if d.block_size < 2 {
        return bad(
            "drafter.block_size",
            format!(
                "must be at least 2 (anchor + one predicted token), got {}",
                d.block_size
            ),
        );
    }
    if let (Some(ids), Some(k)) = (&d.target_layer_ids, d.num_target_features) {
        if ids.len() != k {
            return bad(
                "drafter.num_target_features",
                format!(
                    "is {k} but drafter.target_layer_ids has {} ids {ids:?}",
                    ids.len()
                ),
            );
        }
    }
    if d.target_layer_ids.as_ref().is_some_and(Vec::is_empty) {
        return bad(
            "drafter.target_layer_ids",
            "must name at least one layer when set".into(),
        );
    }
    check_block_fits(d.block_size, data.max_len)?;
    if let Some(ids) = &d.target_layer_ids {
        if let Some(dup) = ids.iter().enumerate().find(|(i, l)| ids[..*i].contains(l)) {
            return bad(
                "drafter.target_layer_ids",
                format!("layer {} appears twice in {ids:?}", dup.1),
            );
        }
    }
    Ok(())
}

/// A drafter block of `block_size` tokens against `data.max_len`: with `drafter.init_from`
/// the block is the loaded drafter's, so this runs on the resolved value.
pub(super) fn check_block_fits(block_size: usize, max_len: usize) -> Result<()> {
    if block_size > max_len {
        // No sample is longer than max_len, so no anchor could take a whole block: the
        // loader would featurise forever without producing a step.
        return bad(
            "drafter.block_size",
            format!("{block_size} exceeds data.max_len {max_len}: no sample can hold a block"),
        );
    }
    Ok(())
}

/// `backend.threads` against the cores of this machine.
fn check_threads(backend: &BackendSection) -> Result<()> {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    if backend.threads > MAX_THREADS_PER_CORE * cores {
        return bad(
            "backend.threads",
            format!(
                "{} is more than {MAX_THREADS_PER_CORE}x the {cores} cores this machine has \
                 (0 uses all of them)",
                backend.threads
            ),
        );
    }
    Ok(())
}

/// The pipeline's device lists (against worker counts and placement) and its queue timeout.
fn check_pipeline(p: &PipelineSection) -> Result<()> {
    for (field, list, workers, workers_field) in [
        (
            "pipeline.target_devices",
            &p.target_devices,
            p.target_workers,
            "pipeline.target_workers",
        ),
        (
            "pipeline.drafter_devices",
            &p.drafter_devices,
            p.drafter_workers,
            "pipeline.drafter_workers",
        ),
    ] {
        let Some(list) = list else { continue };
        if list.is_empty() {
            return bad(field, "must name at least one device when set".into());
        }
        if workers != 1 && workers != list.len() {
            return bad(
                workers_field,
                format!(
                    "is {workers} but {field} names {} devices {list:?}",
                    list.len()
                ),
            );
        }
        if p.placement == PlacementMode::Auto {
            return bad(
                field,
                "is set together with pipeline.placement = \"auto\": give the devices or \
                 let the plan choose them, not both"
                    .into(),
            );
        }
    }
    if p.timeout_secs == 0 {
        return bad(
            "pipeline.timeout_secs",
            "must be at least 1 (seconds a worker may wait on a queue)".into(),
        );
    }
    Ok(())
}

/// Batching of the data: token budget, length buckets and the loss decay `gamma`.
fn check_data(data: &DataSection) -> Result<()> {
    if data.token_budget < data.max_len {
        return bad(
            "data.token_budget",
            format!(
                "{} is below data.max_len {}: a longest sample would not fit a micro-batch",
                data.token_budget, data.max_len
            ),
        );
    }
    if data.bucket_bounds.is_empty() || data.bucket_bounds.windows(2).any(|w| w[0] >= w[1]) {
        return bad(
            "data.bucket_bounds",
            format!(
                "must be non-empty and strictly increasing, got {:?}",
                data.bucket_bounds
            ),
        );
    }
    if let Some(g) = data.gamma {
        if !(g.is_finite() && g > 0.0) {
            return bad("data.gamma", format!("must be a positive number, got {g}"));
        }
    }
    Ok(())
}

/// Training length, schedule and AdamW hyperparameters, and the logging interval.
fn check_train(t: &TrainSection) -> Result<()> {
    if t.epochs == 0 && t.max_steps.is_none() {
        return bad(
            "train.epochs",
            "is 0 and train.max_steps is not set: nothing to train".into(),
        );
    }
    if !(t.lr.is_finite() && t.lr > 0.0) {
        return bad(
            "train.lr",
            format!("must be a positive number, got {}", t.lr),
        );
    }
    for (field, v) in [
        ("train.warmup_ratio", t.warmup_ratio),
        ("train.min_lr_ratio", t.min_lr_ratio),
    ] {
        if !(0.0..=1.0).contains(&v) {
            return bad(field, format!("must be in [0, 1], got {v}"));
        }
    }
    for (field, v) in [("train.beta1", t.beta1), ("train.beta2", t.beta2)] {
        if !(0.0..1.0).contains(&v) {
            return bad(field, format!("must be in [0, 1), got {v}"));
        }
    }
    if !(t.eps.is_finite() && t.eps > 0.0) {
        return bad(
            "train.eps",
            format!("must be a positive number, got {}", t.eps),
        );
    }
    for (field, v) in [
        ("train.weight_decay", t.weight_decay),
        ("train.grad_clip", t.grad_clip),
    ] {
        if !(v.is_finite() && v >= 0.0) {
            return bad(field, format!("must be a non-negative number, got {v}"));
        }
    }
    if t.log_every == 0 {
        return bad("train.log_every", "must be at least 1".into());
    }
    Ok(())
}

/// The backend and attention kernel names must not be blank.
fn check_backend_names(backend: &BackendSection) -> Result<()> {
    for (field, v) in [
        ("backend.name", &backend.name),
        ("backend.attention", &backend.attention),
    ] {
        if v.trim().is_empty() {
            return bad(field, "must not be empty".into());
        }
    }
    Ok(())
}

/// `run.name` names one directory under `run.dir`: an empty name would write the run into
/// `run.dir` itself, and a separator or `.`/`..` would put it elsewhere (outside `run.dir`
/// even), where `train` could mix it with other runs' files.
fn check_run(run: &RunSection) -> Result<()> {
    let Some(name) = &run.name else { return Ok(()) };
    let why = if name.trim().is_empty() {
        "must not be empty (leave it unset for a generated name)"
    } else if name.contains(['/', '\\']) {
        "must not contain a path separator (`/` or `\\`): it names one directory under run.dir"
    } else if name == "." || name == ".." {
        "must not be `.` or `..`: it names one directory under run.dir"
    } else {
        return Ok(());
    };
    bad("run.name", format!("{name:?} {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Names that would not be one fresh directory under `run.dir` are refused naming
    /// `run.name` and the value; ordinary names (dots inside included) pass.
    #[test]
    fn run_names_that_leave_run_dir_are_refused() {
        let check = |name: &str| {
            check_run(&RunSection {
                name: Some(name.into()),
                ..RunSection::default()
            })
        };
        for name in ["", "  ", "a/b", "../escape", "/abs", "a\\b", ".", ".."] {
            let msg = check(name).unwrap_err().to_string();
            assert!(
                msg.contains("run.name") && msg.contains(&format!("{name:?}")),
                "{name:?}: {msg}"
            );
        }
        for name in ["exp1", "exp.1", "..hidden", "run-7"] {
            check(name).unwrap_or_else(|e| panic!("{name:?}: {e}"));
        }
        check_run(&RunSection::default()).unwrap();
    }
}
