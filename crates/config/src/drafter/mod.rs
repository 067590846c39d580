//! The DFlash drafter's `config.json`: read (both HF RoPE forms), built from a target by the
//! standard recipe, checked against the target, and written in exactly the layout that SGLang,
//! vLLM and the DFlash reference code load (`reference/config_qwen3-8b-dflash.json`).

mod kinds;
mod parse;
mod recipe;
mod to_json;
mod validate;

use crate::error::{ConfigError, Result};
use crate::qwen3::{Qwen3Config, TokenIds};

pub use kinds::{DType, LayerType};
pub use recipe::{
    default_gamma, default_num_target_features, default_target_layer_ids, known_mask_token_id,
};

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

/// [`default_target_layer_ids`] for `k` features from `layers` target layers, refused naming
/// `num_target_features` (what the user set) where the spread would repeat a layer.
///
/// Each feature is a different target layer (the drafter config refuses repeats), so `k`
/// above `layers` can never be valid: it is refused before anything of size `k` is made or
/// scanned, so a typo cannot exhaust memory or time. Every `k` that gives a valid config
/// passes that bound.
fn spread_target_layer_ids(layers: usize, k: usize) -> Result<Vec<usize>> {
    // The spread is monotonic, so it repeats a layer iff two neighbours are equal.
    let distinct = |k: usize| {
        k <= layers && {
            let mut prev = None;
            recipe::spread(layers, k).all(|l| prev.replace(l) != Some(l))
        }
    };
    if distinct(k) {
        return Ok(default_target_layer_ids(layers, k));
    }
    let most = (1..k.min(layers + 1))
        .rev()
        .find(|&k| distinct(k))
        .unwrap_or(0);
    let why = if k > layers {
        "each feature reads a different target layer".to_string()
    } else {
        format!(
            "the recipe's spread gives layers {:?}, which repeats a layer",
            default_target_layer_ids(layers, k)
        )
    };
    Err(ConfigError::Invalid {
        origin: ORIGIN_BUILT.into(),
        field: "num_target_features".into(),
        message: format!(
            "{k} features from {layers} target layers: {why}; at most {most} fit (or list \
             the layers in target_layer_ids)"
        ),
    })
}

impl DrafterConfig {
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
            None => spread_target_layer_ids(target.num_hidden_layers, shape.num_target_features)?,
        };
        let mut cfg = DrafterConfig {
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
            layer_types: Vec::new(),
            sliding_window: shape.sliding_window,
            use_sliding_window: false,
            max_window_layers: shape.num_layers,
            bos_token_id: target.bos_token_id,
            eos_token_id: target.eos_token_id.clone(),
            pad_token_id: None,
            dtype: shape.dtype,
            tie_word_embeddings: false,
            initializer_range: 0.02,
        };
        cfg.layer_types = match &shape.layer_types {
            Some(types) => types.clone(),
            None => {
                // One entry per layer: a layer count no machine could train (a typo) is
                // refused before it is allocated.
                cfg.check_size_at(ORIGIN_BUILT)?;
                vec![LayerType::FullAttention; shape.num_layers]
            }
        };
        cfg.use_sliding_window = cfg.layer_types.contains(&LayerType::SlidingAttention);
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
}
