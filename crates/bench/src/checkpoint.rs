//! A random-weight HF Qwen3 checkpoint on disk, as transformers shards it: bf16
//! `model-0000i-of-0000n.safetensors` files, `model.safetensors.index.json` and `config.json`,
//! so the bench can time the job's load path on a checkpoint of the real size (16 GB for the
//! Qwen3-8B shape). Written once per cache directory and reused while its sizes match.

use std::collections::HashMap;
use std::path::Path;

use dflash_config::Qwen3Config;
use dflash_models::layer::{LAYER_TENSOR_NAMES, LayerWeights};
use dflash_models::safetensors_io::{Dtype, write_tensors_streaming};

use crate::{BenchError, Result};

const SHARD_BYTES: usize = 5 << 30;

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> BenchError + '_ {
    move |source| BenchError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// `(name, shape)` of every tensor of a full HF Qwen3 checkpoint, in file order.
fn layout(cfg: &Qwen3Config) -> Vec<(String, Vec<usize>)> {
    let dims = dflash_models::target::layer_dims(cfg);
    let shapes = LayerWeights::shapes(&dims, cfg.intermediate_size);
    let (v, h) = (cfg.vocab_size, cfg.hidden_size);
    let mut out = vec![("model.embed_tokens.weight".to_string(), vec![v, h])];
    for i in 0..cfg.num_hidden_layers {
        for (n, s) in LAYER_TENSOR_NAMES.iter().zip(&shapes) {
            out.push((format!("model.layers.{i}.{n}"), s.clone()));
        }
    }
    out.push(("model.norm.weight".to_string(), vec![h]));
    if !cfg.tie_word_embeddings {
        out.push(("lm_head.weight".to_string(), vec![v, h]));
    }
    out
}

/// Norm weights 1, others `N(0, 0.02^2)` from [`dflash_core::ops::memory::normal_host`]
/// (counter-based, parallel), seeded per tensor name.
fn values(name: &str, n: usize, seed: u64) -> Vec<f32> {
    if name.ends_with("norm.weight") {
        return vec![1.0; n];
    }
    let key = name
        .bytes()
        .fold(seed, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
    dflash_core::ops::memory::normal_host(n, 0.02, key)
}

fn config_json(cfg: &Qwen3Config) -> serde_json::Value {
    serde_json::json!({
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "max_position_embeddings": cfg.max_position_embeddings,
        "tie_word_embeddings": cfg.tie_word_embeddings,
        "torch_dtype": "bfloat16",
    })
}

/// Makes sure `dir` holds a random bf16 checkpoint of `cfg`; returns its tensor bytes.
pub fn ensure_random_checkpoint(dir: &Path, cfg: &Qwen3Config, seed: u64) -> Result<u64> {
    let tensors = layout(cfg);
    let total: usize = tensors
        .iter()
        .map(|(_, s)| 2 * s.iter().product::<usize>())
        .sum();
    let index_path = dir.join("model.safetensors.index.json");
    let marker = dir.join("bench-complete");
    if marker.exists()
        && std::fs::read_to_string(&marker).ok().as_deref() == Some(&total.to_string())
    {
        return Ok(total as u64);
    }
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    // Shards of at most SHARD_BYTES, in file order.
    let mut shards: Vec<Vec<usize>> = vec![Vec::new()];
    let mut in_shard = 0;
    for (i, (_, s)) in tensors.iter().enumerate() {
        let b = 2 * s.iter().product::<usize>();
        if in_shard > 0 && in_shard + b > SHARD_BYTES {
            shards.push(Vec::new());
            in_shard = 0;
        }
        shards.last_mut().expect("non-empty").push(i);
        in_shard += b;
    }
    let n = shards.len();
    let mut weight_map = serde_json::Map::new();
    for (k, members) in shards.iter().enumerate() {
        let file = format!("model-{:05}-of-{n:05}.safetensors", k + 1);
        // Streamed by the job's own checkpoint writer: one tensor in memory at a time.
        let entries: Vec<(String, Vec<usize>)> =
            members.iter().map(|&i| tensors[i].clone()).collect();
        let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
        write_tensors_streaming(&dir.join(&file), &entries, Dtype::BF16, Some(meta), &|j| {
            let (name, shape) = &entries[j];
            Ok(values(name, shape.iter().product(), seed))
        })?;
        for (name, _) in &entries {
            weight_map.insert(name.clone(), serde_json::Value::String(file.clone()));
        }
    }
    let index =
        serde_json::json!({ "metadata": { "total_size": total }, "weight_map": weight_map });
    std::fs::write(&index_path, serde_json::to_string_pretty(&index)?).map_err(io(&index_path))?;
    let cfg_path = dir.join("config.json");
    std::fs::write(&cfg_path, serde_json::to_string_pretty(&config_json(cfg))?)
        .map_err(io(&cfg_path))?;
    std::fs::write(&marker, total.to_string()).map_err(io(&marker))?;
    Ok(total as u64)
}
