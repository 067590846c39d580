//! The target's HF `config.json` (Qwen3 dense).

use std::path::Path;

use serde_json::Value;

use crate::error::{ConfigError, Result};
use crate::json::{Obj, parse_object, read_text};
use crate::rope::read_rope_theta;

/// `eos_token_id` as HF writes it: one id or a list of ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenIds {
    One(u32),
    Many(Vec<u32>),
}

impl TokenIds {
    pub fn to_vec(&self) -> Vec<u32> {
        match self {
            TokenIds::One(id) => vec![*id],
            TokenIds::Many(ids) => ids.clone(),
        }
    }

    pub fn contains(&self, id: u32) -> bool {
        match self {
            TokenIds::One(x) => *x == id,
            TokenIds::Many(ids) => ids.contains(&id),
        }
    }

    pub(crate) fn to_json(&self) -> Value {
        match self {
            TokenIds::One(id) => Value::from(*id),
            TokenIds::Many(ids) => Value::from(ids.clone()),
        }
    }

    pub(crate) fn read(o: &Obj<'_>, key: &str) -> Result<Option<TokenIds>> {
        match o.get(key) {
            None => Ok(None),
            Some(Value::Array(_)) => {
                let ids = o.opt_usize_list(key)?.unwrap_or_default();
                ids.into_iter()
                    .map(|n| {
                        u32::try_from(n).map_err(|_| {
                            o.invalid(key, format!("token id {n} does not fit in 32 bits"))
                        })
                    })
                    .collect::<Result<Vec<_>>>()
                    .map(|v| Some(TokenIds::Many(v)))
            }
            Some(_) => o.opt_u32(key).map(|id| id.map(TokenIds::One)),
        }
    }
}

/// A Qwen3 dense target's `config.json` (the fields the target forward needs).
///
/// Both HF forms are read: top-level `rope_theta`/`rope_scaling` (transformers 4.x) and
/// `rope_parameters` (transformers 5.x). Settings this project does not implement (RoPE
/// scaling, sliding-window attention, attention biases, an activation other than SiLU, a model
/// type other than `qwen3`) are errors rather than silently different math.
#[derive(Debug, Clone, PartialEq)]
pub struct Qwen3Config {
    /// `"qwen3"` (the default when the field is absent).
    pub model_type: String,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    /// When absent, HF Qwen3Config's default ([`read_kv_heads`]).
    pub num_key_value_heads: usize,
    /// When absent, HF Qwen3Config's default, [`HF_HEAD_DIM`].
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub max_position_embeddings: usize,
    /// Defaults to false.
    pub tie_word_embeddings: bool,
    pub bos_token_id: Option<u32>,
    pub eos_token_id: Option<TokenIds>,
    /// `dtype` (transformers 5) or `torch_dtype` (4.x) as written, if any.
    pub dtype: Option<String>,
}

impl Qwen3Config {
    /// Reads a `config.json` file.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let text = read_text(path)?;
        Self::from_json_str(&text, &path.display().to_string())
    }

    /// Reads `dir/config.json` of an HF model directory.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self> {
        Self::from_file(dir.as_ref().join("config.json"))
    }

    /// Parses config JSON text; `origin` (usually the file path) is named in errors.
    pub fn from_json_str(text: &str, origin: &str) -> Result<Self> {
        let map = parse_object(text, origin)?;
        let o = Obj::new(origin, &map);

        let model_type = read_model_type(&o)?;
        reject_unimplemented(&o)?;

        let hidden_size = o.req_usize("hidden_size")?;
        let num_attention_heads = o.req_usize("num_attention_heads")?;
        if num_attention_heads == 0 {
            return Err(o.invalid("num_attention_heads", "must be at least 1"));
        }
        let num_key_value_heads = read_kv_heads(&o, num_attention_heads)?;
        let head_dim = o.opt_usize("head_dim")?.unwrap_or(HF_HEAD_DIM);
        let cfg = Qwen3Config {
            model_type,
            vocab_size: o.req_usize("vocab_size")?,
            hidden_size,
            intermediate_size: o.req_usize("intermediate_size")?,
            num_hidden_layers: o.req_usize("num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps: o.req_f64("rms_norm_eps")?,
            rope_theta: read_rope_theta(&o)?,
            max_position_embeddings: o.req_usize("max_position_embeddings")?,
            tie_word_embeddings: o.opt_bool("tie_word_embeddings")?.unwrap_or(false),
            bos_token_id: o.opt_u32("bos_token_id")?,
            eos_token_id: TokenIds::read(&o, "eos_token_id")?,
            dtype: match o.opt_str("dtype")? {
                Some(s) => Some(s.to_string()),
                None => o.opt_str("torch_dtype")?.map(str::to_string),
            },
        };
        cfg.check(origin)?;
        Ok(cfg)
    }

    /// Internal consistency of the values; errors name `origin` and the field.
    fn check(&self, origin: &str) -> Result<()> {
        let inv = |field: &str, message: String| ConfigError::Invalid {
            origin: origin.to_string(),
            field: field.to_string(),
            message,
        };
        crate::layer_checks::check_layer_shape(
            &[
                ("vocab_size", self.vocab_size),
                ("hidden_size", self.hidden_size),
                ("intermediate_size", self.intermediate_size),
                ("num_hidden_layers", self.num_hidden_layers),
                ("num_key_value_heads", self.num_key_value_heads),
                ("head_dim", self.head_dim),
                ("max_position_embeddings", self.max_position_embeddings),
            ],
            (
                self.num_attention_heads,
                self.num_key_value_heads,
                "num_key_value_heads",
            ),
            self.head_dim,
            self.rms_norm_eps,
        )
        .map_err(|(field, message)| inv(field, message))?;
        Ok(())
    }
}

/// `model_type`, `"qwen3"` when absent; any other model type is an error.
fn read_model_type(o: &Obj<'_>) -> Result<String> {
    let model_type = o.opt_str("model_type")?.unwrap_or("qwen3").to_string();
    if model_type != "qwen3" {
        return Err(o.unsupported(
            "model_type",
            &Value::from(model_type.as_str()),
            "only Qwen3 dense targets (\"qwen3\") are implemented",
        ));
    }
    Ok(model_type)
}

/// Errors on a Qwen3 layer setting the layers here (the target's and the drafter's) do not
/// implement: an activation other than SiLU, attention biases.
pub(crate) fn reject_unimplemented_layer_math(o: &Obj<'_>) -> Result<()> {
    o.expect_str_if_present(
        "hidden_act",
        "silu",
        "only SiLU (SwiGLU MLP) is implemented",
    )?;
    o.expect_bool_if_present(
        "attention_bias",
        false,
        "Qwen3 attention has no biases; biased projections are not implemented",
    )
}

/// Errors on the first setting whose math this project does not implement: an activation
/// other than SiLU, attention biases, sliding-window attention, a non-full-attention layer.
fn reject_unimplemented(o: &Obj<'_>) -> Result<()> {
    reject_unimplemented_layer_math(o)?;
    o.expect_bool_if_present(
        "use_sliding_window",
        false,
        "sliding-window attention in the target is not implemented",
    )?;
    if let Some(types) = o.opt_array("layer_types")? {
        for (i, t) in types.iter().enumerate() {
            if t.as_str() != Some("full_attention") {
                return Err(o.unsupported(
                    &format!("layer_types[{i}]"),
                    t,
                    "only full-attention target layers are implemented",
                ));
            }
        }
    }
    Ok(())
}

/// `head_dim` where a config.json leaves it out: HF Qwen3Config's default (transformers 5.24,
/// `configuration_qwen3.py`), not `hidden_size / num_attention_heads`, which differs for
/// Qwen3-0.6B's shape (1024 / 16 = 64 against its 128): the model a serving engine builds
/// from the same file.
pub const HF_HEAD_DIM: usize = 128;

/// `num_key_value_heads` as HF Qwen3Config reads it: 32 when the key is absent, the number of
/// attention heads when it is null.
pub(crate) fn read_kv_heads(o: &Obj<'_>, num_attention_heads: usize) -> Result<usize> {
    const HF_KV_HEADS: usize = 32;
    match o.map.get("num_key_value_heads") {
        None => Ok(HF_KV_HEADS),
        Some(Value::Null) => Ok(num_attention_heads),
        Some(_) => Ok(o
            .opt_usize("num_key_value_heads")?
            .unwrap_or(num_attention_heads)),
    }
}
