//! Writing a drafter config in exactly the layout that SGLang, vLLM and the DFlash reference
//! code load, so a trained drafter can be served as is.

use serde_json::{Map, Value, json};

use super::DrafterConfig;
use crate::json::number;
use crate::qwen3::TokenIds;

impl DrafterConfig {
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
