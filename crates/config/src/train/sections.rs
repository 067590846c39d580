//! The `[section]` structs of the training config, each with its built-in defaults (the
//! standard DFlash recipe where it has one).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

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
    /// Start from this drafter directory. Its `config.json` then defines the drafter's shape:
    /// a shape field above that is set must agree with it (else the config is refused), and
    /// the loaded config fills them all in. Default: none (fresh initialization).
    pub init_from: Option<PathBuf>,
    /// Storage dtype of the trained drafter saved in the run directory (`"float32"`,
    /// `"bfloat16"` as the published DFlash drafters, or `"float16"`); its `config.json` says
    /// the same. Resumable checkpoints always keep the f32 master weights. Default `"float32"`.
    pub save_dtype: crate::DType,
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
            save_dtype: crate::DType::Float32,
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
    /// Upper bounds (tokens, increasing) of the length buckets that batches are drawn from: a
    /// sequence goes to the first bucket whose bound is at least its length, and lengths
    /// above the last bound go to one more (overflow) bucket of their own. Default
    /// `[512, 1024, 2048, 4096]`.
    pub bucket_bounds: Vec<usize>,
    /// Tokens per micro-batch, padding included: a micro-batch takes sequences of one bucket
    /// while its longest sequence times its number of sequences stays within this (a
    /// sequence longer than the budget alone). At least `max_len`. Default 4096.
    pub token_budget: usize,
    /// Anchors sampled per sequence (per document in packed rows), re-sampled every epoch.
    /// Default 512 (recipe).
    pub num_anchors: usize,
    /// Loss decay over block slots, `exp(-(k-1)/gamma)`. Default: 7 for block 16, 5 for 10,
    /// 4 for 8, piecewise-linear between and proportional above 16 (see `default_gamma`,
    /// which training uses through `TrainConfig::gamma`).
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
    /// AdamW decoupled weight decay of the weight matrices; norm weights are not decayed, as
    /// in HF Trainer. Default 0 (recipe).
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
    /// Steps with a NaN/Inf loss or gradient are skipped; the run stops after this many in a
    /// row (an applied step starts the count again). Default 10.
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
    /// How workers are put on devices when no device lists are given: `"round-robin"`
    /// (default: targets on devices `0..T`, drafters on `T..T+D`, wrapping around) or
    /// `"auto"` (measure both models' rates on this machine first, as `dflash plan` does,
    /// and take its best split that fits).
    pub placement: PlacementMode,
    /// The device of each target worker, e.g. `[0, 1, 2]` (a device may repeat: several
    /// workers on one GPU). Sets the worker count; `target_workers` must then be 1 or agree.
    pub target_devices: Option<Vec<usize>>,
    /// The device of each drafter replica, e.g. `[3, 3]`; as `target_devices`.
    pub drafter_devices: Option<Vec<usize>>,
    /// Which drafter replica trains on which micro-batch: `"fixed"` (default: micro-batch m
    /// of a step on replica m % D; runs repeat bit for bit) or `"least-loaded"` (whichever
    /// replica is free takes the step's next micro-batch; losses equal to float rounding).
    pub routing: Routing,
    /// How drafter replicas sum their gradients: `"host"` (default: through host memory, any
    /// backend) or `"device"` (the backend's device collective, NCCL on CUDA: one replica per
    /// GPU, nothing through host memory; an error where the backend or NCCL lacks it).
    pub collective: Collective,
}

/// `pipeline.collective`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Collective {
    #[default]
    Host,
    Device,
}

/// `pipeline.routing`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Routing {
    #[default]
    Fixed,
    LeastLoaded,
}

/// `pipeline.placement`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum PlacementMode {
    #[default]
    RoundRobin,
    Auto,
}

impl Default for PipelineSection {
    fn default() -> Self {
        Self {
            target_workers: 1,
            drafter_workers: 1,
            queue_capacity: 4,
            timeout_secs: 600,
            placement: PlacementMode::RoundRobin,
            target_devices: None,
            drafter_devices: None,
            routing: Routing::Fixed,
            collective: Collective::Host,
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

/// `[plugins]`: foreign attention kernels behind the C ABI (docs/plugins.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct PluginsSection {
    /// Plugin libraries loaded before any backend is built; each kernel registers under its
    /// plugin's own name, which `backend.attention` may then give. Default none.
    pub paths: Vec<PathBuf>,
}

/// `[eval]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct EvalSection {
    /// Evaluate on at most this many held-out samples. Default: all.
    pub max_samples: Option<usize>,
}
