//! The DFlash drafter's `config.json`: read (both HF RoPE forms), built from a target by the
//! standard recipe, checked against the target, and written in exactly the layout that SGLang,
//! vLLM and the DFlash reference code load (`reference/config_qwen3-8b-dflash.json`).

use std::fmt;
use std::path::Path;

use serde_json::{Map, Value, json};

use crate::error::{ConfigError, Result};
use crate::json::{Obj, number, parse_object, read_text};
use crate::qwen3::{Qwen3Config, TokenIds};
use crate::rope::read_rope_theta;

/// Attention kind of one drafter layer (`layer_types` in the config).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LayerType {
    /// `"full_attention"`: context rows before the anchor, the whole block (bidirectional).
    FullAttention,
    /// `"sliding_attention"`: context rows within `sliding_window` before the anchor, causal
    /// inside the block.
    SlidingAttention,
}

impl LayerType {
    pub fn as_str(self) -> &'static str {
        match self {
            LayerType::FullAttention => "full_attention",
            LayerType::SlidingAttention => "sliding_attention",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "full_attention" => Some(LayerType::FullAttention),
            "sliding_attention" => Some(LayerType::SlidingAttention),
            _ => None,
        }
    }
}

impl fmt::Display for LayerType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Storage dtype written as `dtype` in the drafter's config (what `model.safetensors` holds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum DType {
    #[default]
    BFloat16,
    Float16,
    Float32,
}

impl DType {
    pub fn as_str(self) -> &'static str {
        match self {
            DType::BFloat16 => "bfloat16",
            DType::Float16 => "float16",
            DType::Float32 => "float32",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "bfloat16" => Some(DType::BFloat16),
            "float16" => Some(DType::Float16),
            "float32" => Some(DType::Float32),
            _ => None,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Target layer ids whose outputs feed the drafter (the DFlash default):
/// one layer: `[L/2]`; otherwise `k` ids spread as `round(1 + i*(L-4)/(k-1))`, i = 0..k-1.
/// Rounding is half-to-even, as Python's `round` in the DFlash reference code.
/// 36 layers, k=5 -> `[1, 9, 17, 25, 33]`; 64 -> `[1, 16, 31, 46, 61]`. `k == 0` gives `[]`.
/// Meaningful for `L >= 4` when `k > 1` (see [`default_num_target_features`]).
pub fn default_target_layer_ids(num_target_layers: usize, k: usize) -> Vec<usize> {
    match k {
        0 => Vec::new(),
        1 => vec![num_target_layers / 2],
        _ => {
            let span = num_target_layers as f64 - 4.0;
            (0..k)
                .map(|i| {
                    let x = (1.0 + i as f64 * span / (k - 1) as f64).round_ties_even();
                    x.max(0.0) as usize
                })
                .collect()
        }
    }
}

/// The default number of target features `k`: 5 (the standard recipe) when the target has at
/// least 8 layers, so that the 5 default ids are distinct; `L - 3` for 5..=7 layers; 1 below.
pub fn default_num_target_features(num_target_layers: usize) -> usize {
    match num_target_layers {
        8.. => 5,
        5..=7 => num_target_layers - 3,
        _ => 1,
    }
}

/// The conventional mask token of known target families, by vocabulary size: an unused row of
/// the target's embedding table. Qwen3 (151936) -> 151669; Qwen3.5/3.6 (248320) -> 248070;
/// the embedded tiny byte-level target (264) -> 256. `None` for other vocabularies.
pub fn known_mask_token_id(target_vocab_size: usize) -> Option<u32> {
    match target_vocab_size {
        151_936 => Some(151_669),
        248_320 => Some(248_070),
        264 => Some(256),
        _ => None,
    }
}

/// Loss decay `gamma` of the DFlash recipe for a block size: 7 for 16, 5 for 10, 4 for 8;
/// otherwise `7 * block_size / 16` (at least 1).
pub fn default_gamma(block_size: usize) -> f64 {
    match block_size {
        16 => 7.0,
        10 => 5.0,
        8 => 4.0,
        b => (7.0 * b as f64 / 16.0).max(1.0),
    }
}

/// A DFlash drafter's configuration (`config.json` of a drafter directory).
#[derive(Debug, Clone, PartialEq)]
pub struct DrafterConfig {
    /// Must equal the target's hidden size (the drafter uses the target's embedding and LM head).
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    /// The target's vocabulary size.
    pub vocab_size: usize,
    pub max_position_embeddings: usize,
    /// Tokens per block (anchor + `block_size - 1` masks).
    pub block_size: usize,
    /// `dflash_config.mask_token_id`.
    pub mask_token_id: u32,
    /// `dflash_config.target_layer_ids`: target layers whose outputs are concatenated, in order.
    pub target_layer_ids: Vec<usize>,
    /// The target's `num_hidden_layers`.
    pub num_target_layers: usize,
    /// One entry per drafter layer.
    pub layer_types: Vec<LayerType>,
    /// Window (in context positions) of sliding layers; required when any layer slides.
    pub sliding_window: Option<usize>,
    pub use_sliding_window: bool,
    /// HF's `max_window_layers` (kept for the layout; `layer_types` is what decides).
    pub max_window_layers: usize,
    pub bos_token_id: Option<u32>,
    pub eos_token_id: Option<TokenIds>,
    /// Written only when set (as in the 27B reference config).
    pub pad_token_id: Option<u32>,
    pub dtype: DType,
    pub tie_word_embeddings: bool,
    pub initializer_range: f64,
}

/// The free choices of a drafter built for a target by [`DrafterConfig::for_target`].
/// Unset optional fields default to the target's value.
#[derive(Debug, Clone, PartialEq)]
pub struct DrafterShape {
    /// Drafter decoder layers (5 in the standard recipe).
    pub num_layers: usize,
    /// 16 in the standard recipe.
    pub block_size: usize,
    pub mask_token_id: u32,
    /// `k`, the number of target layers read. Ignored when `target_layer_ids` is set, except
    /// that it must then equal their count.
    pub num_target_features: usize,
    /// Overrides [`default_target_layer_ids`].
    pub target_layer_ids: Option<Vec<usize>>,
    pub intermediate_size: Option<usize>,
    pub num_attention_heads: Option<usize>,
    pub num_key_value_heads: Option<usize>,
    pub head_dim: Option<usize>,
    /// Defaults to all `FullAttention`.
    pub layer_types: Option<Vec<LayerType>>,
    pub sliding_window: Option<usize>,
    pub dtype: DType,
}

impl DrafterShape {
    /// The standard recipe: 5 layers, block 16, k = 5, target-sized heads and MLP, bf16.
    pub fn standard(mask_token_id: u32) -> Self {
        Self {
            num_layers: 5,
            block_size: 16,
            mask_token_id,
            num_target_features: 5,
            target_layer_ids: None,
            intermediate_size: None,
            num_attention_heads: None,
            num_key_value_heads: None,
            head_dim: None,
            layer_types: None,
            sliding_window: None,
            dtype: DType::BFloat16,
        }
    }
}

const ORIGIN_BUILT: &str = "drafter config";

impl DrafterConfig {
    /// Reads a drafter `config.json`.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = read_text(path)?;
        Self::from_json_str(&text, &path.display().to_string())
    }

    /// Reads `dir/config.json` of a drafter directory.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self> {
        Self::from_file(dir.as_ref().join("config.json"))
    }

    /// Parses drafter config JSON; `origin` (usually the file path) is named in errors.
    pub fn from_json_str(text: &str, origin: &str) -> Result<Self> {
        let map = parse_object(text, origin)?;
        let o = Obj::new(origin, &map);

        if let Some(archs) = o.opt_array("architectures")? {
            if !archs.iter().any(|a| a.as_str() == Some("DFlashDraftModel")) {
                return Err(o.unsupported(
                    "architectures",
                    &Value::Array(archs.clone()),
                    "not a DFlash drafter config (expected \"DFlashDraftModel\"); is this a target model directory?",
                ));
            }
        }
        o.expect_str_if_present(
            "model_type",
            "qwen3",
            "DFlash drafter layers are Qwen3 layers (model_type \"qwen3\")",
        )?;
        o.expect_str_if_present(
            "hidden_act",
            "silu",
            "only SiLU (SwiGLU MLP) is implemented",
        )?;
        o.expect_bool_if_present(
            "attention_bias",
            false,
            "biased attention projections are not implemented",
        )?;

        let dflash = o
            .opt_obj("dflash_config")?
            .ok_or_else(|| o.missing("dflash_config"))?;
        let num_hidden_layers = o.req_usize("num_hidden_layers")?;
        let num_attention_heads = o.req_usize("num_attention_heads")?;
        let hidden_size = o.req_usize("hidden_size")?;
        if num_attention_heads == 0 {
            return Err(o.invalid("num_attention_heads", "must be at least 1"));
        }
        let head_dim = match o.opt_usize("head_dim")? {
            Some(d) => d,
            None => hidden_size / num_attention_heads,
        };
        let block_size = match o.opt_usize("block_size")? {
            Some(b) => b,
            None => dflash
                .opt_usize("block_size")?
                .ok_or_else(|| o.missing("block_size"))?,
        };
        let use_sliding_window = o.opt_bool("use_sliding_window")?.unwrap_or(false);
        let sliding_window = o.opt_usize("sliding_window")?;
        let max_window_layers = o
            .opt_usize("max_window_layers")?
            .unwrap_or(num_hidden_layers);
        let layer_types = match o.opt_array("layer_types")? {
            Some(types) => types
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    let key = format!("layer_types[{i}]");
                    let s = t.as_str().ok_or_else(|| o.wrong(&key, "a string", t))?;
                    LayerType::parse(s).ok_or_else(|| {
                        o.unsupported(
                            &key,
                            t,
                            "expected \"full_attention\" or \"sliding_attention\"",
                        )
                    })
                })
                .collect::<Result<Vec<_>>>()?,
            // HF's rule when `layer_types` is absent.
            None => (0..num_hidden_layers)
                .map(|i| {
                    if use_sliding_window && sliding_window.is_some() && i >= max_window_layers {
                        LayerType::SlidingAttention
                    } else {
                        LayerType::FullAttention
                    }
                })
                .collect(),
        };
        let dtype = match o
            .opt_str("dtype")?
            .map(|s| ("dtype", s))
            .or(o.opt_str("torch_dtype")?.map(|s| ("torch_dtype", s)))
        {
            None => DType::BFloat16,
            Some((key, s)) => DType::parse(s).ok_or_else(|| {
                o.unsupported(
                    key,
                    &Value::from(s),
                    "expected \"bfloat16\", \"float16\" or \"float32\"",
                )
            })?,
        };

        let cfg = DrafterConfig {
            hidden_size,
            intermediate_size: o.req_usize("intermediate_size")?,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads: o
                .opt_usize("num_key_value_heads")?
                .unwrap_or(num_attention_heads),
            head_dim,
            rms_norm_eps: o.req_f64("rms_norm_eps")?,
            rope_theta: read_rope_theta(&o)?,
            vocab_size: o.req_usize("vocab_size")?,
            max_position_embeddings: o.req_usize("max_position_embeddings")?,
            block_size,
            mask_token_id: dflash.req_u32("mask_token_id")?,
            target_layer_ids: dflash
                .opt_usize_list("target_layer_ids")?
                .ok_or_else(|| dflash.missing("target_layer_ids"))?,
            num_target_layers: o.req_usize("num_target_layers")?,
            layer_types,
            sliding_window,
            use_sliding_window,
            max_window_layers,
            bos_token_id: o.opt_u32("bos_token_id")?,
            eos_token_id: TokenIds::read(&o, "eos_token_id")?,
            pad_token_id: o.opt_u32("pad_token_id")?,
            dtype,
            tie_word_embeddings: o.opt_bool("tie_word_embeddings")?.unwrap_or(false),
            initializer_range: o.opt_f64("initializer_range")?.unwrap_or(0.02),
        };
        cfg.check(origin)?;
        Ok(cfg)
    }

    /// The standard recipe for `target`: hidden size, vocabulary, RoPE, norm eps, context length
    /// and special tokens from the target; heads, head_dim and MLP width default to the target's.
    pub fn for_target(target: &Qwen3Config, shape: &DrafterShape) -> Result<Self> {
        let target_layer_ids = match &shape.target_layer_ids {
            Some(ids) => {
                if ids.len() != shape.num_target_features {
                    return Err(ConfigError::Invalid {
                        origin: ORIGIN_BUILT.into(),
                        field: "target_layer_ids".into(),
                        message: format!(
                            "{} ids {ids:?} given but num_target_features is {}",
                            ids.len(),
                            shape.num_target_features
                        ),
                    });
                }
                ids.clone()
            }
            None => default_target_layer_ids(target.num_hidden_layers, shape.num_target_features),
        };
        let layer_types = shape
            .layer_types
            .clone()
            .unwrap_or_else(|| vec![LayerType::FullAttention; shape.num_layers]);
        let any_sliding = layer_types.contains(&LayerType::SlidingAttention);
        let cfg = DrafterConfig {
            hidden_size: target.hidden_size,
            intermediate_size: shape.intermediate_size.unwrap_or(target.intermediate_size),
            num_hidden_layers: shape.num_layers,
            num_attention_heads: shape
                .num_attention_heads
                .unwrap_or(target.num_attention_heads),
            num_key_value_heads: shape
                .num_key_value_heads
                .unwrap_or(target.num_key_value_heads),
            head_dim: shape.head_dim.unwrap_or(target.head_dim),
            rms_norm_eps: target.rms_norm_eps,
            rope_theta: target.rope_theta,
            vocab_size: target.vocab_size,
            max_position_embeddings: target.max_position_embeddings,
            block_size: shape.block_size,
            mask_token_id: shape.mask_token_id,
            target_layer_ids,
            num_target_layers: target.num_hidden_layers,
            layer_types,
            sliding_window: shape.sliding_window,
            use_sliding_window: any_sliding,
            max_window_layers: shape.num_layers,
            bos_token_id: target.bos_token_id,
            eos_token_id: target.eos_token_id.clone(),
            pad_token_id: None,
            dtype: shape.dtype,
            tie_word_embeddings: false,
            initializer_range: 0.02,
        };
        cfg.validate_against(target)?;
        Ok(cfg)
    }

    /// Number of target features `k` (the `fc` input is `k * hidden_size`).
    pub fn num_target_features(&self) -> usize {
        self.target_layer_ids.len()
    }

    /// The deepest target layer needed (the target forward can stop after it).
    pub fn deepest_target_layer(&self) -> Option<usize> {
        self.target_layer_ids.iter().copied().max()
    }

    /// Internal consistency (no target needed).
    pub fn validate(&self) -> Result<()> {
        self.check(ORIGIN_BUILT)
    }

    fn check(&self, origin: &str) -> Result<()> {
        let inv = |field: &str, message: String| ConfigError::Invalid {
            origin: origin.to_string(),
            field: field.to_string(),
            message,
        };
        for (field, v) in [
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("vocab_size", self.vocab_size),
            ("max_position_embeddings", self.max_position_embeddings),
            ("num_target_layers", self.num_target_layers),
        ] {
            if v == 0 {
                return Err(inv(field, "must be at least 1".into()));
            }
        }
        if self.block_size < 2 {
            return Err(inv(
                "block_size",
                format!(
                    "must be at least 2 (anchor + one predicted token), got {}",
                    self.block_size
                ),
            ));
        }
        if self.num_attention_heads % self.num_key_value_heads != 0 {
            return Err(inv(
                "num_attention_heads",
                format!(
                    "{} heads is not a multiple of num_key_value_heads {}",
                    self.num_attention_heads, self.num_key_value_heads
                ),
            ));
        }
        if self.head_dim % 2 != 0 {
            return Err(inv(
                "head_dim",
                format!("RoPE needs an even head_dim, got {}", self.head_dim),
            ));
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0) {
            return Err(inv(
                "rms_norm_eps",
                format!("must be a positive number, got {}", self.rms_norm_eps),
            ));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return Err(inv(
                "rope_theta",
                format!("must be a positive number, got {}", self.rope_theta),
            ));
        }
        if self.target_layer_ids.is_empty() {
            return Err(inv(
                "dflash_config.target_layer_ids",
                "must name at least one target layer".into(),
            ));
        }
        if let Some(&bad) = self
            .target_layer_ids
            .iter()
            .find(|&&l| l >= self.num_target_layers)
        {
            return Err(inv(
                "dflash_config.target_layer_ids",
                format!(
                    "layer {bad} is out of range for num_target_layers {} (ids {:?})",
                    self.num_target_layers, self.target_layer_ids
                ),
            ));
        }
        if self.mask_token_id as usize >= self.vocab_size {
            return Err(inv(
                "dflash_config.mask_token_id",
                format!(
                    "{} is not below vocab_size {}",
                    self.mask_token_id, self.vocab_size
                ),
            ));
        }
        if self.layer_types.len() != self.num_hidden_layers {
            return Err(inv(
                "layer_types",
                format!(
                    "{} entries for num_hidden_layers {}",
                    self.layer_types.len(),
                    self.num_hidden_layers
                ),
            ));
        }
        if self.layer_types.contains(&LayerType::SlidingAttention) {
            match self.sliding_window {
                None | Some(0) => {
                    return Err(inv(
                        "sliding_window",
                        format!(
                            "is {:?} but layer_types has sliding_attention layers; set a positive window",
                            self.sliding_window
                        ),
                    ));
                }
                Some(_) if !self.use_sliding_window => {
                    return Err(inv(
                        "use_sliding_window",
                        "is false but layer_types has sliding_attention layers".into(),
                    ));
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// Checks that this drafter fits `target`: same hidden size and vocabulary, target layer ids
    /// inside the target, the mask token inside its vocabulary, the same layer count. Each error
    /// names the field and both values.
    pub fn validate_against(&self, target: &Qwen3Config) -> Result<()> {
        let mismatch = |field: &str, d: String, t: String, message: &str| ConfigError::Mismatch {
            field: field.into(),
            drafter: d,
            target: t,
            message: message.into(),
        };
        if self.hidden_size != target.hidden_size {
            return Err(mismatch(
                "hidden_size",
                self.hidden_size.to_string(),
                target.hidden_size.to_string(),
                "the drafter uses the target's embedding and LM head, so they must be equal",
            ));
        }
        if self.num_target_layers != target.num_hidden_layers {
            return Err(mismatch(
                "num_target_layers",
                self.num_target_layers.to_string(),
                format!("num_hidden_layers {}", target.num_hidden_layers),
                "the drafter was made for a target with a different depth",
            ));
        }
        if let Some(&bad) = self
            .target_layer_ids
            .iter()
            .find(|&&l| l >= target.num_hidden_layers)
        {
            return Err(mismatch(
                "dflash_config.target_layer_ids",
                format!("{:?} (layer {bad})", self.target_layer_ids),
                format!("num_hidden_layers {}", target.num_hidden_layers),
                "a target layer id is out of range",
            ));
        }
        if self.mask_token_id as usize >= target.vocab_size {
            return Err(mismatch(
                "dflash_config.mask_token_id",
                self.mask_token_id.to_string(),
                format!("vocab_size {}", target.vocab_size),
                "the mask token must be a row of the target's embedding table",
            ));
        }
        if self.vocab_size != target.vocab_size {
            return Err(mismatch(
                "vocab_size",
                self.vocab_size.to_string(),
                target.vocab_size.to_string(),
                "the drafter predicts through the target's LM head",
            ));
        }
        self.validate()
    }

    /// The config as JSON, in exactly the layout of the reference drafter configs (keys sorted
    /// when serialized; `rope_theta` written top-level, `rope_scaling: null`; `pad_token_id`
    /// only when set).
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        let mut put = |k: &str, v: Value| {
            m.insert(k.to_string(), v);
        };
        put("architectures", json!(["DFlashDraftModel"]));
        put("attention_bias", json!(false));
        put("attention_dropout", json!(0.0));
        put("auto_map", json!({"AutoModel": "dflash.DFlashDraftModel"}));
        put("block_size", json!(self.block_size));
        put("bos_token_id", json!(self.bos_token_id));
        put(
            "dflash_config",
            json!({"mask_token_id": self.mask_token_id, "target_layer_ids": self.target_layer_ids}),
        );
        put("dtype", json!(self.dtype.as_str()));
        put(
            "eos_token_id",
            self.eos_token_id
                .as_ref()
                .map_or(Value::Null, TokenIds::to_json),
        );
        put("head_dim", json!(self.head_dim));
        put("hidden_act", json!("silu"));
        put("hidden_size", json!(self.hidden_size));
        put("initializer_range", json!(self.initializer_range));
        put("intermediate_size", json!(self.intermediate_size));
        put(
            "layer_types",
            Value::from(
                self.layer_types
                    .iter()
                    .map(|t| t.as_str())
                    .collect::<Vec<_>>(),
            ),
        );
        put(
            "max_position_embeddings",
            json!(self.max_position_embeddings),
        );
        put("max_window_layers", json!(self.max_window_layers));
        put("model_type", json!("qwen3"));
        put("num_attention_heads", json!(self.num_attention_heads));
        put("num_hidden_layers", json!(self.num_hidden_layers));
        put("num_key_value_heads", json!(self.num_key_value_heads));
        put("num_target_layers", json!(self.num_target_layers));
        if let Some(pad) = self.pad_token_id {
            put("pad_token_id", json!(pad));
        }
        put("rms_norm_eps", json!(self.rms_norm_eps));
        put("rope_scaling", Value::Null);
        put("rope_theta", number(self.rope_theta));
        put("sliding_window", json!(self.sliding_window));
        put("tie_word_embeddings", json!(self.tie_word_embeddings));
        put("use_cache", json!(true));
        put("use_sliding_window", json!(self.use_sliding_window));
        put("vocab_size", json!(self.vocab_size));
        Value::Object(m)
    }

    /// [`to_json`](Self::to_json) as pretty-printed text with a trailing newline.
    pub fn to_json_string(&self) -> String {
        let mut s = serde_json::to_string_pretty(&self.to_json()).expect("a JSON value serializes");
        s.push('\n');
        s
    }
}
