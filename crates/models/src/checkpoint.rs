//! Drafter checkpoints in the layout SGLang and vLLM serve (docs/design.md §2.6): a directory
//! with `config.json` and `model.safetensors` (no name prefix). Every file is written
//! atomically, so a crash mid-save never corrupts the last good checkpoint.

use std::path::Path;

use dflash_config::{DType, DrafterConfig, Qwen3Config};
use dflash_core::Backend;
use safetensors::Dtype;

use crate::drafter::{DrafterParams, FrozenTarget};
use crate::error::{ModelError, Result};
use crate::safetensors_io::{TensorFiles, write_atomic, write_tensors_streaming};

/// Writes `dir/config.json` and `dir/model.safetensors`, the tensors stored in `cfg.dtype`
/// (what the config says; bf16/f16 rounded to nearest even).
pub fn save_drafter(
    b: &dyn Backend,
    dir: &Path,
    cfg: &DrafterConfig,
    params: &DrafterParams,
) -> Result<()> {
    save_drafter_via(b, dir, cfg, params, Fetch::InOrder)
}

/// How a write takes tensors off the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fetch {
    /// [`MemoryOps::download`](dflash_core::MemoryOps::download): after the work queued so far.
    InOrder,
    /// [`MemoryOps::download_detached`](dflash_core::MemoryOps::download_detached): tensors
    /// nothing queued writes (a snapshot), read beside the work queued since.
    Detached,
}

impl Fetch {
    pub fn download(self, b: &dyn Backend, t: &dflash_core::Tensor) -> Result<Vec<f32>> {
        Ok(match self {
            Fetch::InOrder => b.download(t)?,
            Fetch::Detached => b.download_detached(t)?,
        })
    }
}

/// As [`save_drafter`], taking the tensors off the device as `fetch` says.
pub fn save_drafter_via(
    b: &dyn Backend,
    dir: &Path,
    cfg: &DrafterConfig,
    params: &DrafterParams,
    fetch: Fetch,
) -> Result<()> {
    let layout = DrafterParams::layout(cfg);
    let meta = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
    let dtype = match cfg.dtype {
        DType::Float32 => Dtype::F32,
        DType::BFloat16 => Dtype::BF16,
        DType::Float16 => Dtype::F16,
    };
    let tensors = params.tensors();
    write_tensors_streaming(
        &dir.join("model.safetensors"),
        &layout,
        dtype,
        Some(meta),
        &|i| fetch.download(b, tensors[i]),
    )?;
    let json = serde_json::to_string_pretty(&cfg.to_json()).expect("a JSON value serialises");
    write_atomic(&dir.join("config.json"), json.as_bytes())?;
    Ok(())
}

/// Reads a drafter directory, checking every tensor's presence and shape against its config.
pub fn load_drafter(b: &dyn Backend, dir: &Path) -> Result<(DrafterConfig, DrafterParams)> {
    let cfg = DrafterConfig::from_file(dir.join("config.json"))?;
    let files = TensorFiles::open(dir)?;
    crate::target::check_layers_match(
        &files,
        "layers.",
        cfg.num_hidden_layers,
        "config.json's num_hidden_layers",
    )?;
    let ts = DrafterParams::layout(&cfg)
        .iter()
        .map(|(name, shape)| Ok(b.upload(&files.read_f32(name, shape)?, shape)?))
        .collect::<Result<Vec<_>>>()?;
    Ok((cfg, DrafterParams::from_tensors(ts)))
}

impl FrozenTarget {
    /// Loads only the target's embedding and LM head (tied embeddings handled).
    pub fn load(b: &dyn Backend, target_dir: &Path) -> Result<(Qwen3Config, Self)> {
        let cfg = Qwen3Config::from_file(target_dir.join("config.json"))?;
        let files = TensorFiles::open(target_dir)?;
        let shape = [cfg.vocab_size, cfg.hidden_size];
        // Tied: the embedding is the head whatever else the files hold (see `Qwen3Target`).
        let has_head = files.contains("lm_head.weight") && !cfg.tie_word_embeddings;
        if !has_head && !cfg.tie_word_embeddings {
            return Err(ModelError::Tensor {
                path: target_dir.to_path_buf(),
                name: "lm_head.weight".into(),
                detail: "missing and tie_word_embeddings is false".into(),
            });
        }
        // Read-only from here on: straight from the file into the backend's compute format
        // (bf16 on a GPU), never through an f32 host copy.
        let embed = b.upload_frozen(files.view("model.embed_tokens.weight", &shape)?, &shape)?;
        let frozen = if has_head {
            FrozenTarget::new(
                embed,
                b.upload_frozen(files.view("lm_head.weight", &shape)?, &shape)?,
            )
        } else {
            FrozenTarget::tied(embed)
        };
        Ok((cfg, frozen))
    }
}
