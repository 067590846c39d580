//! The training job config, layered with figment (later layers win):
//!
//! 1. built-in defaults ([`TrainConfig::default`]),
//! 2. a TOML file (or TOML text),
//! 3. environment variables `DFLASH_<SECTION>__<KEY>` (`__` separates nesting levels, e.g.
//!    `DFLASH_TRAIN__LR=3e-4`, `DFLASH_DATA__BUCKET_BOUNDS=[512,1024]`). Only variables whose
//!    name contains `__` are read, so unrelated `DFLASH_*` variables (e.g. `DFLASH_LOG`) are left
//!    alone; a misspelt nested one is an unknown-key error,
//! 4. command-line overrides `key.path=value` (e.g. `train.lr=3e-4`), merged last.
//!
//! Values in environment variables and overrides are parsed as TOML literals: `true`, `12`,
//! `3e-4`, `[1, 2]`, `"quoted"`; anything that is not a TOML literal is taken as a string (so
//! `run.name=exp1` works, while a name that looks like a number must be quoted: `run.name='"7"'`).
//!
//! Unknown keys anywhere are errors that name the key and where it came from.
//!
//! **Paths**: relative paths (`target.path`, `drafter.init_from`, `data.train`, `data.eval`,
//! `run.dir`) are resolved against the *current working directory* of the process at load
//! time, not against the config file's directory, and stored absolute; so the config written
//! into a run directory ([`TrainConfig::to_toml_string`]) is valid from anywhere.
//! [`TrainConfig::load_toml_str`] resolves against an explicit base directory instead.

use std::path::{Path, PathBuf};

use figment::providers::{Format, Serialized, Toml};
use figment::value::{Dict, Map, Value};
use figment::{Figment, Metadata, Profile, Provider};
use serde::{Deserialize, Serialize};

use crate::drafter::{
    DrafterConfig, DrafterShape, default_gamma, default_num_target_features, known_mask_token_id,
};
use crate::error::{ConfigError, Result};
use crate::qwen3::Qwen3Config;

/// Prefix of the environment variables read by [`TrainConfig::load`].
pub const ENV_PREFIX: &str = "DFLASH_";

/// The whole training job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    /// The frozen target model.
    pub target: TargetSection,
    /// The drafter to train.
    pub drafter: DrafterSection,
    /// Datasets, lengths and batching.
    pub data: DataSection,
    /// Optimizer and schedule.
    pub train: TrainSection,
    /// Compute backend and attention kernel.
    pub backend: BackendSection,
    /// Target/drafter workers and the queues between them.
    pub pipeline: PipelineSection,
    /// Where runs are written.
    pub run: RunSection,
    /// Held-out evaluation (acceptance length).
    pub eval: EvalSection,
}

/// `[target]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct TargetSection {
    /// HF model directory of the target (`config.json` + safetensors). Required to train.
    pub path: Option<PathBuf>,
}

/// `[drafter]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DrafterSection {
    /// Drafter decoder layers. Default 5 (standard recipe).
    pub num_layers: usize,
    /// Block size (anchor + predicted tokens). Default 16.
    pub block_size: usize,
    /// Mask token id. Default: the known one for the target's vocabulary (Qwen3 151669,
    /// Qwen3.5/3.6 248070, the embedded tiny target 256); required for other targets.
    pub mask_token_id: Option<u32>,
    /// Target layers to read. Default: `default_target_layer_ids(L, num_target_features)`.
    pub target_layer_ids: Option<Vec<usize>>,
    /// Number of target layers read (`k`). Default: the count of `target_layer_ids` when set,
    /// else 5 when the target has at least 8 layers (fewer for shallower targets).
    pub num_target_features: Option<usize>,
    /// MLP width. Default: the target's.
    pub intermediate_size: Option<usize>,
    /// Attention heads. Default: the target's.
    pub num_attention_heads: Option<usize>,
    /// KV heads. Default: the target's.
    pub num_key_value_heads: Option<usize>,
    /// Head dimension. Default: the target's.
    pub head_dim: Option<usize>,
    /// Start from this drafter directory (its `config.json` then defines the drafter's shape, and
    /// the shape fields above are ignored). Default: none (fresh initialization).
    pub init_from: Option<PathBuf>,
}

impl Default for DrafterSection {
    fn default() -> Self {
        Self {
            num_layers: 5,
            block_size: 16,
            mask_token_id: None,
            target_layer_ids: None,
            num_target_features: None,
            intermediate_size: None,
            num_attention_heads: None,
            num_key_value_heads: None,
            head_dim: None,
            init_from: None,
        }
    }
}

/// What to do with a sample longer than `data.max_len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum TooLong {
    /// Keep the first `max_len` tokens (counted and reported).
    #[default]
    Truncate,
    /// Drop the sample (counted and reported).
    Skip,
}

/// `[data]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DataSection {
    /// Training dataset (HF `save_to_disk` directory with `input_ids` and `loss_mask`).
    /// Required to train.
    pub train: Option<PathBuf>,
    /// Held-out dataset for acceptance-length evaluation. Default: none.
    pub eval: Option<PathBuf>,
    /// Maximum sequence length in tokens. Default 3072 (recipe).
    pub max_len: usize,
    /// `"truncate"` or `"skip"` samples longer than `max_len`. Default `"truncate"`.
    pub too_long: TooLong,
    /// Samples with fewer supervised (loss_mask = 1) tokens are skipped and counted. Default 2
    /// (the fewest that can give an anchor).
    pub min_supervised: usize,
    /// Upper bounds (tokens, increasing) of the length buckets that batches are drawn from.
    /// Default `[512, 1024, 2048, 4096]`; lengths above the last bound share the last bucket.
    pub bucket_bounds: Vec<usize>,
    /// Tokens per micro-batch (sum of sequence lengths); at least `max_len`. Default 4096.
    pub token_budget: usize,
    /// Anchors sampled per sequence (per document in packed rows), re-sampled every epoch.
    /// Default 512 (recipe).
    pub num_anchors: usize,
    /// Loss decay over block slots, `exp(-(k-1)/gamma)`. Default: 7 for block 16, 5 for 10,
    /// 4 for 8 (see `default_gamma`).
    pub gamma: Option<f64>,
}

impl Default for DataSection {
    fn default() -> Self {
        Self {
            train: None,
            eval: None,
            max_len: 3072,
            too_long: TooLong::Truncate,
            min_supervised: 2,
            bucket_bounds: vec![512, 1024, 2048, 4096],
            token_budget: 4096,
            num_anchors: 512,
            gamma: None,
        }
    }
}

/// `[train]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainSection {
    /// Passes over the training data. Default 6 (recipe).
    pub epochs: usize,
    /// Stop after this many optimizer steps, even mid-epoch. Default: none.
    pub max_steps: Option<u64>,
    /// End this invocation after optimizer step `stop_at_step` (counted from the start of the
    /// run, not of this invocation) with a checkpoint, *without* changing the schedule: the
    /// learning-rate schedule and data order still span the whole run, so `train --resume`
    /// continues exactly as if the run had not stopped. For time-boxed jobs. Not kept in the
    /// run directory's `config.toml` (it belongs to one invocation). Default: none.
    pub stop_at_step: Option<u64>,
    /// Micro-batches per optimizer step (gradient accumulation). Default 1.
    pub micro_batches_per_step: usize,
    /// Peak learning rate. Default 6e-4 (recipe).
    pub lr: f64,
    /// Fraction of all steps spent in linear warm-up. Default 0.04 (recipe).
    pub warmup_ratio: f64,
    /// Cosine decay ends at `lr * min_lr_ratio`. Default 0 (recipe).
    pub min_lr_ratio: f64,
    /// AdamW decoupled weight decay. Default 0 (recipe).
    pub weight_decay: f64,
    /// AdamW beta1. Default 0.9.
    pub beta1: f64,
    /// AdamW beta2. Default 0.999.
    pub beta2: f64,
    /// AdamW epsilon. Default 1e-8.
    pub eps: f64,
    /// Global gradient-norm clip; 0 disables clipping. Default 1.0 (recipe).
    pub grad_clip: f64,
    /// Seed of everything random (initialization, shuffling, anchor sampling). Default 0.
    pub seed: u64,
    /// Recompute drafter activations in backward instead of keeping them. Default false.
    pub recompute: bool,
    /// Steps with a NaN/Inf loss or gradient are skipped; the run stops after this many.
    /// Default 10.
    pub max_nonfinite_steps: u64,
    /// Save a checkpoint every this many optimizer steps (0: only at the end). Default 1000.
    pub save_every: u64,
    /// Log a line every this many optimizer steps. Default 10.
    pub log_every: u64,
}

impl Default for TrainSection {
    fn default() -> Self {
        Self {
            epochs: 6,
            max_steps: None,
            stop_at_step: None,
            micro_batches_per_step: 1,
            lr: 6e-4,
            warmup_ratio: 0.04,
            min_lr_ratio: 0.0,
            weight_decay: 0.0,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            grad_clip: 1.0,
            seed: 0,
            recompute: false,
            max_nonfinite_steps: 10,
            save_every: 1000,
            log_every: 10,
        }
    }
}

/// `[backend]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BackendSection {
    /// Registered backend name. Default `"reference"`.
    pub name: String,
    /// Registered attention kernel name. Default `"reference"`.
    pub attention: String,
    /// CPU threads for host-side work (0: all cores). Default 0.
    pub threads: usize,
}

impl Default for BackendSection {
    fn default() -> Self {
        Self {
            name: "reference".into(),
            attention: "reference".into(),
            threads: 0,
        }
    }
}

/// `[pipeline]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PipelineSection {
    /// Target workers (one per target device). Default 1.
    pub target_workers: usize,
    /// Drafter workers (one per drafter device). Default 1.
    pub drafter_workers: usize,
    /// Capacity (micro-batches) of each queue between targets and drafters. Default 4.
    pub queue_capacity: usize,
    /// A worker blocked this long on a queue is treated as stuck and the run stops. Default 600.
    pub timeout_secs: u64,
}

impl Default for PipelineSection {
    fn default() -> Self {
        Self {
            target_workers: 1,
            drafter_workers: 1,
            queue_capacity: 4,
            timeout_secs: 600,
        }
    }
}

/// `[run]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunSection {
    /// Root directory of runs; each run is a subdirectory. Default `"runs"`.
    pub dir: PathBuf,
    /// Run name (subdirectory). Default: generated from the start time.
    pub name: Option<String>,
}

impl Default for RunSection {
    fn default() -> Self {
        Self {
            dir: PathBuf::from("runs"),
            name: None,
        }
    }
}

/// `[eval]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct EvalSection {
    /// Evaluate on at most this many held-out samples. Default: all.
    pub max_samples: Option<usize>,
}

/// How keys are shown in error messages.
#[derive(Clone, Copy)]
enum KeyStyle {
    /// `train.lr`
    Dotted,
    /// `DFLASH_TRAIN__LR`
    Env,
}

/// One configuration layer with a readable name (and file, if any) in error messages.
struct Layer {
    name: String,
    source: Option<figment::Source>,
    data: LayerData,
    keys: KeyStyle,
}

enum LayerData {
    Dict(Dict),
    Toml(figment::providers::Data<Toml>),
}

impl Layer {
    fn dict(name: &str, data: Dict, keys: KeyStyle) -> Self {
        Self {
            name: name.to_string(),
            source: None,
            data: LayerData::Dict(data),
            keys,
        }
    }
}

impl Provider for Layer {
    fn metadata(&self) -> Metadata {
        let mut md = Metadata::named(self.name.clone());
        md.source = self.source.clone();
        match self.keys {
            KeyStyle::Env => md.interpolater(|_: &Profile, keys: &[&str]| {
                format!("{ENV_PREFIX}{}", keys.join("__").to_ascii_uppercase())
            }),
            KeyStyle::Dotted => md.interpolater(|_: &Profile, keys: &[&str]| keys.join(".")),
        }
    }

    fn data(&self) -> std::result::Result<Map<Profile, Dict>, figment::Error> {
        match &self.data {
            LayerData::Dict(d) => Ok(Profile::Default.collect(d.clone())),
            LayerData::Toml(t) => t.data(),
        }
    }
}

/// Splits command-line arguments `key.path=value` into `(key, value)` pairs.
pub fn parse_overrides<S: AsRef<str>>(args: &[S]) -> Result<Vec<(String, String)>> {
    args.iter()
        .map(|a| {
            let a = a.as_ref();
            match a.split_once('=') {
                Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.to_string())),
                _ => Err(ConfigError::Invalid {
                    origin: "command line".into(),
                    field: a.to_string(),
                    message: "an override must look like `section.key=value`".into(),
                }),
            }
        })
        .collect()
}

/// Parses an environment or command-line value as a TOML literal (`true`, `12`, `3e-4`,
/// `[1, 2]`, `"quoted"`); anything that is not one is taken as a plain string.
fn parse_value(raw: &str) -> Value {
    let literal = toml::from_str::<toml::Table>(&format!("v = {raw}"))
        .ok()
        .filter(|t| t.len() == 1)
        .and_then(|mut t| t.remove("v"))
        .and_then(|v| Value::serialize(v).ok());
    literal.unwrap_or_else(|| Value::from(raw.to_string()))
}

/// Nests `key.path = value` pairs into one dict; `origin` names the source in errors.
fn nest_pairs<'a>(
    pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
    origin: &str,
) -> Result<Dict> {
    let mut dict = Dict::new();
    for (k, v) in pairs {
        if k.split('.').any(str::is_empty) {
            return Err(ConfigError::Invalid {
                origin: origin.into(),
                field: k.to_string(),
                message: "not a valid key path (expected `section.key`)".into(),
            });
        }
        let nested = figment::util::nest(k, parse_value(v))
            .into_dict()
            .expect("a non-empty key path nests into a dict");
        dict = merge_dicts(dict, nested);
    }
    Ok(dict)
}

fn overrides_provider(overrides: &[(String, String)]) -> Result<Layer> {
    let pairs = overrides.iter().map(|(k, v)| (k.as_str(), v.as_str()));
    Ok(Layer::dict(
        "command-line override",
        nest_pairs(pairs, "command-line override")?,
        KeyStyle::Dotted,
    ))
}

/// `DFLASH_SECTION__KEY=value` variables (only names containing `__`), as a provider.
fn env_provider() -> Result<Layer> {
    let mut pairs = Vec::new();
    for (name, value) in std::env::vars_os() {
        let (Some(name), Some(value)) = (name.to_str(), value.to_str()) else {
            continue;
        };
        if let Some(rest) = name.strip_prefix(ENV_PREFIX) {
            if rest.contains("__") {
                pairs.push((
                    rest.to_ascii_lowercase().replace("__", "."),
                    value.to_string(),
                ));
            }
        }
    }
    pairs.sort();
    let data = nest_pairs(
        pairs.iter().map(|(k, v)| (k.as_str(), v.as_str())),
        ENV_SOURCE_NAME,
    )?;
    Ok(Layer::dict(ENV_SOURCE_NAME, data, KeyStyle::Env))
}

const ENV_SOURCE_NAME: &str = "`DFLASH_` environment variable(s)";

/// Later keys win, nested dicts merge.
fn merge_dicts(mut a: Dict, b: Dict) -> Dict {
    for (k, v) in b {
        let merged = match (a.remove(&k), v) {
            (Some(Value::Dict(_, x)), Value::Dict(tag, y)) => Value::Dict(tag, merge_dicts(x, y)),
            (_, v) => v,
        };
        a.insert(k, merged);
    }
    a
}

impl TrainConfig {
    /// Loads the job config: defaults <- `file` (TOML) <- `DFLASH_*` env <- `overrides`, then
    /// resolves relative paths against the current directory and validates.
    /// A `file` that does not exist is an error (figment alone would silently skip it).
    pub fn load(file: Option<&Path>, overrides: &[(String, String)]) -> Result<Self> {
        let mut fig = Figment::from(Self::defaults_provider());
        if let Some(path) = file {
            std::fs::metadata(path).map_err(|source| ConfigError::Io {
                path: path.to_path_buf(),
                source,
            })?;
            fig = fig.merge(Layer {
                name: "TOML file".into(),
                source: Some(figment::Source::File(path.to_path_buf())),
                data: LayerData::Toml(Toml::file_exact(path)),
                keys: KeyStyle::Dotted,
            });
        }
        Self::finish(fig, overrides, &cwd()?)
    }

    /// Like [`load`](Self::load) with TOML text in place of a file (e.g. an embedded default
    /// config); `name` is used in errors. Relative paths resolve against `base_dir`.
    pub fn load_toml_str(
        toml: &str,
        name: &str,
        base_dir: &Path,
        overrides: &[(String, String)],
    ) -> Result<Self> {
        let fig = Figment::from(Self::defaults_provider()).merge(Layer {
            name: format!("TOML text `{name}`"),
            source: None,
            data: LayerData::Toml(Toml::string(toml)),
            keys: KeyStyle::Dotted,
        });
        Self::finish(fig, overrides, base_dir)
    }

    fn defaults_provider() -> Layer {
        let data = Serialized::defaults(TrainConfig::default())
            .data()
            .ok()
            .and_then(|mut m| m.remove(&Profile::Default))
            .unwrap_or_default();
        Layer::dict("built-in defaults", data, KeyStyle::Dotted)
    }

    fn finish(fig: Figment, overrides: &[(String, String)], base_dir: &Path) -> Result<Self> {
        let fig = fig
            .merge(env_provider()?)
            .merge(overrides_provider(overrides)?);
        let mut cfg: TrainConfig = fig.extract()?;
        cfg.resolve_paths(base_dir);
        cfg.validate().map_err(|e| match e {
            ConfigError::Invalid { field, message, .. } => {
                let origin = fig
                    .find_metadata(&field)
                    .map(|md| match &md.source {
                        Some(src) => format!("{} {}", md.name, src),
                        None => md.name.to_string(),
                    })
                    .unwrap_or_else(|| "training config".into());
                ConfigError::Invalid {
                    origin,
                    field,
                    message,
                }
            }
            other => other,
        })?;
        Ok(cfg)
    }

    /// Makes relative paths absolute by joining them to `base`.
    pub fn resolve_paths(&mut self, base: &Path) {
        let fix = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        self.target.path.as_mut().map(fix);
        self.drafter.init_from.as_mut().map(fix);
        self.data.train.as_mut().map(fix);
        self.data.eval.as_mut().map(fix);
        fix(&mut self.run.dir);
    }

    /// The resolved config as TOML, for writing into the run directory. Loading it back gives
    /// an equal config.
    pub fn to_toml_string(&self) -> Result<String> {
        Ok(toml::to_string_pretty(self)?)
    }

    /// Range checks of every field; errors name the field (`section.key`).
    pub fn validate(&self) -> Result<()> {
        fn bad(field: &str, message: String) -> Result<()> {
            Err(ConfigError::Invalid {
                origin: "training config".into(),
                field: field.into(),
                message,
            })
        }
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
            ("train.stop_at_step", t.stop_at_step.map(|s| s as usize)),
        ] {
            if v == Some(0) {
                return bad(field, "must be at least 1 when set".into());
            }
        }
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
        for (field, v) in [
            ("backend.name", &self.backend.name),
            ("backend.attention", &self.backend.attention),
        ] {
            if v.trim().is_empty() {
                return bad(field, "must not be empty".into());
            }
        }
        Ok(())
    }

    /// The target directory, or an error saying that `target.path` must be set.
    pub fn target_dir(&self) -> Result<&Path> {
        self.target
            .path
            .as_deref()
            .ok_or_else(|| ConfigError::Invalid {
                origin: "training config".into(),
                field: "target.path".into(),
                message: "not set: give the target's HF model directory".into(),
            })
    }

    /// The training dataset, or an error saying that `data.train` must be set.
    pub fn train_data(&self) -> Result<&Path> {
        self.data
            .train
            .as_deref()
            .ok_or_else(|| ConfigError::Invalid {
                origin: "training config".into(),
                field: "data.train".into(),
                message: "not set: give the training dataset directory".into(),
            })
    }

    /// The mask token id: `drafter.mask_token_id`, else the known one for the target.
    pub fn mask_token_id(&self, target: &Qwen3Config) -> Result<u32> {
        match self
            .drafter
            .mask_token_id
            .or_else(|| known_mask_token_id(target.vocab_size))
        {
            Some(id) => Ok(id),
            None => Err(ConfigError::Invalid {
                origin: "training config".into(),
                field: "drafter.mask_token_id".into(),
                message: format!(
                    "not set, and no default is known for a target with vocab_size {}; \
                     set it to an unused row of the target's embedding table",
                    target.vocab_size
                ),
            }),
        }
    }

    /// The drafter to train against `target`: loaded from `drafter.init_from` if set, else
    /// built by [`DrafterConfig::for_target`] from the `[drafter]` section; validated against
    /// the target either way.
    pub fn drafter_config(&self, target: &Qwen3Config) -> Result<DrafterConfig> {
        let d = &self.drafter;
        if let Some(dir) = &d.init_from {
            let cfg = DrafterConfig::from_dir(dir)?;
            cfg.validate_against(target)?;
            return Ok(cfg);
        }
        let k = match (&d.target_layer_ids, d.num_target_features) {
            (_, Some(k)) => k,
            (Some(ids), None) => ids.len(),
            (None, None) => default_num_target_features(target.num_hidden_layers),
        };
        let shape = DrafterShape {
            num_layers: d.num_layers,
            block_size: d.block_size,
            mask_token_id: self.mask_token_id(target)?,
            num_target_features: k,
            target_layer_ids: d.target_layer_ids.clone(),
            intermediate_size: d.intermediate_size,
            num_attention_heads: d.num_attention_heads,
            num_key_value_heads: d.num_key_value_heads,
            head_dim: d.head_dim,
            ..DrafterShape::standard(0)
        };
        DrafterConfig::for_target(target, &shape)
    }

    /// Loss decay for a drafter of `block_size`: `data.gamma`, else [`default_gamma`].
    pub fn gamma(&self, block_size: usize) -> f64 {
        self.data.gamma.unwrap_or_else(|| default_gamma(block_size))
    }
}

fn cwd() -> Result<PathBuf> {
    std::env::current_dir().map_err(|source| ConfigError::Io {
        path: PathBuf::from("."),
        source,
    })
}
