//! Reading a drafter `config.json`: both HF RoPE forms, HF's `layer_types` rule when the key is
//! absent, and errors that name the file and the key.

use std::path::Path;

use serde_json::Value;

use super::{DType, DrafterConfig, LayerType};
use crate::error::Result;
use crate::json::{Obj, parse_object, read_text};
use crate::qwen3::{TokenIds, reject_unimplemented_layer_math};
use crate::rope::read_rope_theta;

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

        check_supported(&o)?;

        let dflash = o
            .opt_obj("dflash_config")?
            .ok_or_else(|| o.missing("dflash_config"))?;
        let num_hidden_layers = o.req_usize("num_hidden_layers")?;
        let num_attention_heads = o.req_usize("num_attention_heads")?;
        let hidden_size = o.req_usize("hidden_size")?;
        if num_attention_heads == 0 {
            return Err(o.invalid("num_attention_heads", "must be at least 1"));
        }
        // The drafter is a Qwen3 model to the engines: absent sizes take HF Qwen3Config's
        // defaults, as theirs do.
        let head_dim = o
            .opt_usize("head_dim")?
            .unwrap_or(crate::qwen3::HF_HEAD_DIM);
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
        let layer_types = read_layer_types(&o)?;
        let layer_types_given = layer_types.is_some();
        let dtype = read_dtype(&o)?;

        let mut cfg = DrafterConfig {
            hidden_size,
            intermediate_size: o.req_usize("intermediate_size")?,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads: crate::qwen3::read_kv_heads(&o, num_attention_heads)?,
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
            layer_types: layer_types.unwrap_or_default(),
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
        if !layer_types_given {
            // HF's rule gives one entry per layer: a layer count no machine could train (a
            // typo) is refused before it is allocated.
            cfg.check_size_at(origin)?;
            cfg.layer_types = hf_layer_types(
                num_hidden_layers,
                use_sliding_window,
                sliding_window,
                max_window_layers,
            );
        }
        cfg.check(origin)?;
        Ok(cfg)
    }
}

/// Refuses a config of another architecture or model type, or with an activation or attention
/// bias the drafter layers do not implement.
fn check_supported(o: &Obj<'_>) -> Result<()> {
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
    reject_unimplemented_layer_math(o)
}

/// `layer_types` as given; `None` when the key is absent (see [`hf_layer_types`]).
fn read_layer_types(o: &Obj<'_>) -> Result<Option<Vec<LayerType>>> {
    let Some(types) = o.opt_array("layer_types")? else {
        return Ok(None);
    };
    types
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
        .collect::<Result<_>>()
        .map(Some)
}

/// HF's rule for `layer_types` when the key is absent.
fn hf_layer_types(
    num_hidden_layers: usize,
    use_sliding_window: bool,
    sliding_window: Option<usize>,
    max_window_layers: usize,
) -> Vec<LayerType> {
    (0..num_hidden_layers)
        .map(|i| {
            if use_sliding_window && sliding_window.is_some() && i >= max_window_layers {
                LayerType::SlidingAttention
            } else {
                LayerType::FullAttention
            }
        })
        .collect()
}

/// `dtype`, else the older `torch_dtype`, else bfloat16.
fn read_dtype(o: &Obj<'_>) -> Result<DType> {
    match o
        .opt_str("dtype")?
        .map(|s| ("dtype", s))
        .or(o.opt_str("torch_dtype")?.map(|s| ("torch_dtype", s)))
    {
        None => Ok(DType::BFloat16),
        Some((key, s)) => DType::parse(s).ok_or_else(|| {
            o.unsupported(
                key,
                &Value::from(s),
                "expected \"bfloat16\", \"float16\" or \"float32\"",
            )
        }),
    }
}
