//! The enumerated values of a drafter config: each layer's attention kind and the storage
//! dtype, with the exact strings the config file uses.

use std::fmt;

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
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
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
