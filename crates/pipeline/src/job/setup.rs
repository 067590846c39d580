//! A job's setup: its backend, drafter config, eval features and a fresh run directory.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use dflash_config::{
    DType, DrafterConfig, DrafterShape, Qwen3Config, TooLong, TrainConfig,
    default_num_target_features,
};
use dflash_core::Backend;
use dflash_core::pipeline::{Features, HiddenSeq, Target};
use dflash_core::registry::{BackendOptions, create_backend};
use dflash_data::{SkipCounts, TooLongPolicy, open_dataset};

use crate::error::{PipelineError, Result};
use crate::workers::{SampleRules, featurise, warn_mask_token};

/// The configured backend on `device`, every plugin of `plugins.paths` registered first (so
/// that `backend.attention` may name a plugin's kernel, in training and in eval alike;
/// registering a library again is a no-op).
pub(super) fn backend_for(cfg: &TrainConfig, device: usize) -> Result<Arc<dyn Backend>> {
    if !cfg.plugins.paths.is_empty() {
        dflash_attention_loader::register_paths(&cfg.plugins.paths)
            .map_err(|e| PipelineError::Job(format!("plugins.paths: {e}")))?;
    }
    let opts = BackendOptions {
        attention: cfg.backend.attention.clone(),
        threads: cfg.backend.threads,
        device,
    };
    Ok(create_backend(&cfg.backend.name, &opts)?)
}

pub(super) fn too_long(cfg: &TrainConfig) -> TooLongPolicy {
    match cfg.data.too_long {
        TooLong::Truncate => TooLongPolicy::Truncate,
        TooLong::Skip => TooLongPolicy::Skip,
    }
}

/// The drafter config of this run: from `init_from`, else the standard recipe for the target.
pub(super) fn drafter_config(cfg: &TrainConfig, target: &Qwen3Config) -> Result<DrafterConfig> {
    let d = match &cfg.drafter.init_from {
        // The config's own resolution: it refuses shape keys that disagree with the loaded
        // drafter (rather than ignoring them) and checks the loaded block against
        // data.max_len, which the section's own block_size need not be.
        Some(_) => cfg.drafter_config(target)?,
        None => DrafterConfig::for_target(
            target,
            &DrafterShape {
                num_layers: cfg.drafter.num_layers,
                block_size: cfg.drafter.block_size,
                mask_token_id: cfg.mask_token_id(target)?,
                // As documented for `drafter.num_target_features`: the count of
                // `target_layer_ids` when only those are given.
                num_target_features: match (
                    &cfg.drafter.target_layer_ids,
                    cfg.drafter.num_target_features,
                ) {
                    (_, Some(k)) => k,
                    (Some(ids), None) => ids.len(),
                    (None, None) => default_num_target_features(target.num_hidden_layers),
                },
                target_layer_ids: cfg.drafter.target_layer_ids.clone(),
                intermediate_size: cfg.drafter.intermediate_size,
                num_attention_heads: cfg.drafter.num_attention_heads,
                num_key_value_heads: cfg.drafter.num_key_value_heads,
                head_dim: cfg.drafter.head_dim,
                layer_types: None,
                sliding_window: None,
                // The reference backend trains in f32 and saves what it trains.
                dtype: DType::Float32,
            },
        )?,
    };
    d.validate_against(target)?;
    Ok(d)
}

/// What to featurise an evaluation set with: its path, at most `max` samples, the target's
/// `max_position_embeddings` (longer samples are skipped) and the drafter's mask token id
/// (kept samples holding it are counted, a warning as in training).
pub(super) struct EvalData<'a> {
    pub path: &'a Path,
    pub max: usize,
    pub max_positions: usize,
    pub mask_token_id: u32,
}

/// Featurises an evaluation set once (reused before and after training); returns the
/// sequences and the set's counts.
pub(super) fn eval_features(
    cfg: &TrainConfig,
    target: &dyn Target,
    set: &EvalData<'_>,
) -> Result<(Vec<HiddenSeq>, SkipCounts)> {
    let data = open_dataset(set.path)?;
    let rules = SampleRules {
        vocab_size: target.vocab_size(),
        max_len: cfg.data.max_len,
        min_supervised: 2,
        too_long: too_long(cfg),
        max_positions: set.max_positions,
        mask_token_id: Some(set.mask_token_id),
    };
    let mut counts = SkipCounts::default();
    let mut seqs = Vec::new();
    for i in 0..data.len().min(set.max) {
        let before = counts.mask_token_in_data;
        if let Some(mut s) = featurise(target, data.as_ref(), i, &rules, &mut counts)? {
            if before == 0
                && let Some(m) = counts.first_mask_token
            {
                warn_mask_token(&m, "eval");
            }
            // Kept in host memory between the two evaluations, not on the training device.
            s.features = Features::Host(s.features.to_host()?);
            seqs.push(s);
        }
    }
    Ok((seqs, counts))
}

/// The target's end-of-answer ids: evaluation stops a sequence there, as the serving loop
/// does. They are the ids `dflash regenerate` ends a turn at ([`dflash_models::eos::eos_ids`]),
/// so that a base target whose `config.json` names only `<|endoftext|>` still stops at its
/// chat turns' `<|im_end|>` (from `tokenizer_config.json`) rather than drafting on through
/// the next user turn. A target without a directory (`dir` None: random weights) has only
/// its config's ids; no id at all means no stop (each sequence is measured to its end).
pub(super) fn stop_tokens(dir: Option<&Path>, target: &Qwen3Config) -> Result<Vec<u32>> {
    Ok(match dir {
        Some(dir) => dflash_models::eos::eos_ids(dir, target)?,
        None => dflash_models::eos::config_ids(target),
    })
}

/// A directory for a new run under `run.dir`, named `run.name` (default `run-<unix secs>`).
pub(super) fn new_run_dir(cfg: &TrainConfig) -> PathBuf {
    let name = cfg.run.name.clone().unwrap_or_else(|| {
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        format!("run-{secs}")
    });
    // Never train into a directory holding another run: pick the first free `name-N`. One
    // where no run started (only the error.txt of a job refused before it began, or the
    // temp file of a write killed at startup) is reused.
    let base = cfg.run.dir.join(&name);
    let occupied = |p: &Path| {
        p.read_dir().is_ok_and(|d| {
            d.flatten().any(|e| {
                let n = e.file_name().to_string_lossy().into_owned();
                n != "error.txt" && !dflash_models::safetensors_io::is_temp_file(&n)
            })
        })
    };
    if !occupied(&base) {
        return base;
    }
    (1..)
        .map(|i| cfg.run.dir.join(format!("{name}-{i}")))
        .find(|p| !occupied(p))
        .expect("some suffix is free")
}
