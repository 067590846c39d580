//! The frozen Qwen3 dense target: forward only, stopping after the deepest needed layer,
//! emitting the chosen layers' outputs. Its embedding and LM head are lent to the drafter.

use std::path::Path;
use std::sync::Arc;

use dflash_config::Qwen3Config;
use dflash_core::mask::BlockMask;
use dflash_core::pipeline::Features;
use dflash_core::{Backend, HostSlice, Tensor};

use crate::drafter::FrozenTarget;
use crate::error::{ModelError, Result};
use crate::layer::{self, AttnGeometry, LAYER_TENSOR_NAMES, LayerDims, LayerWeights};
use crate::safetensors_io::TensorFiles;

pub struct Qwen3Target {
    backend: Arc<dyn Backend>,
    cfg: Qwen3Config,
    pub(crate) dims: LayerDims,
    /// Layers `0..=max(layer_ids)` only: deeper ones are never run, so never loaded.
    pub(crate) layers: Vec<LayerWeights>,
    layer_ids: Vec<usize>,
    /// `(V, H)` embedding and LM head, shared with drafters on the same device.
    pub(crate) frozen: Arc<FrozenTarget>,
    pub(crate) norm: Option<Tensor>,
    /// Bytes read from the checkpoint (0 for a random target).
    loaded_bytes: u64,
}

pub fn layer_dims(cfg: &Qwen3Config) -> LayerDims {
    LayerDims {
        hidden: cfg.hidden_size,
        q_heads: cfg.num_attention_heads,
        kv_heads: cfg.num_key_value_heads,
        head_dim: cfg.head_dim,
        eps: cfg.rms_norm_eps as f32,
        rope_theta: cfg.rope_theta as f32,
    }
}

/// A frozen weight in the backend's compute format (bf16 on a GPU with bf16 GEMMs: half the
/// memory and no conversion per use). Norm weights (1-D) stay f32: the norms read them in f32.
fn frozen(b: &dyn Backend, t: Tensor) -> Result<Tensor> {
    Ok(if t.dims().len() == 2 {
        b.to_compute_format(t)?
    } else {
        t
    })
}

/// A frozen weight as the file stores it, into the backend: 2-D ones straight into the
/// compute format (no f32 host copy on a device backend), 1-D norm weights in f32 as
/// [`frozen`] keeps them (a few KB each).
fn frozen_from_file(b: &dyn Backend, data: HostSlice<'_>, shape: &[usize]) -> Result<Tensor> {
    Ok(if shape.len() == 2 {
        b.upload_frozen(data, shape)?
    } else {
        b.upload(&data.to_f32_vec(), shape)?
    })
}

impl Qwen3Target {
    /// Loads an HF Qwen3 checkpoint directory (`config.json` + `model.safetensors` or a
    /// sharded index), keeping only the layers up to the deepest of `layer_ids`.
    pub fn load(backend: Arc<dyn Backend>, dir: &Path, layer_ids: &[usize]) -> Result<Self> {
        let cfg = Qwen3Config::from_file(dir.join("config.json"))?;
        let files = TensorFiles::open(dir)?;
        Self::from_files(backend, cfg, &files, layer_ids)
    }

    pub fn from_files(
        backend: Arc<dyn Backend>,
        cfg: Qwen3Config,
        files: &TensorFiles,
        layer_ids: &[usize],
    ) -> Result<Self> {
        let origin = format!("the target in {}", files.dir().display());
        check_layer_count(&cfg, files)?;
        // A tied target's head is its embedding, as HF ties them after loading and serving
        // engines skip `lm_head.*`: a stale head a tied export also ships is not read.
        let has_lm_head = files.contains("lm_head.weight") && !cfg.tie_word_embeddings;
        if !has_lm_head && !cfg.tie_word_embeddings {
            return Err(ModelError::Tensor {
                path: files.dir().to_path_buf(),
                name: "lm_head.weight".into(),
                detail: "missing and tie_word_embeddings is false".into(),
            });
        }
        let b = backend.clone();
        let mut loaded = 0u64;
        let mut target = Self::assemble(
            backend,
            cfg,
            layer_ids,
            &origin,
            has_lm_head,
            |name, shape| {
                let data = files.view(name, shape)?;
                loaded += data.bytes().len() as u64;
                frozen_from_file(b.as_ref(), data, shape)
            },
        )?;
        target.loaded_bytes = loaded;
        Ok(target)
    }

    /// A target with random weights and no files (benchmarks, tests): linear weights,
    /// embedding and LM head `N(0, 0.02^2)` from [`dflash_core::MemoryOps::random_normal`]
    /// (generated on the device where the backend can), norm weights 1. Only layers up to
    /// the deepest of `layer_ids` are built. Deterministic in `seed`.
    pub fn random(
        backend: Arc<dyn Backend>,
        cfg: Qwen3Config,
        layer_ids: &[usize],
        seed: u64,
    ) -> Result<Self> {
        const STD: f32 = 0.02;
        let has_lm_head = !cfg.tie_word_embeddings;
        let b = backend.clone();
        let mut next_seed = seed;
        Self::assemble(
            backend,
            cfg,
            layer_ids,
            "the random target",
            has_lm_head,
            |_, shape| {
                next_seed = next_seed.wrapping_add(1);
                if shape.len() == 1 {
                    Ok(b.upload(&vec![1.0; shape[0]], shape)?) // norm weights
                } else {
                    frozen(b.as_ref(), b.random_normal(shape, STD, next_seed)?)
                }
            },
        )
    }

    /// Builds the target from `tensor(name, shape)` (files or random), in a fixed order:
    /// the layers up to the deepest of `layer_ids`, the embedding, the final norm, then the LM
    /// head (`has_lm_head`), else the embedding serves as the LM head (tied). `origin` names the source
    /// in errors.
    fn assemble(
        backend: Arc<dyn Backend>,
        cfg: Qwen3Config,
        layer_ids: &[usize],
        origin: &str,
        has_lm_head: bool,
        mut tensor: impl FnMut(&str, &[usize]) -> Result<Tensor>,
    ) -> Result<Self> {
        if let Some(&bad) = layer_ids.iter().find(|&&l| l >= cfg.num_hidden_layers) {
            return Err(ModelError::Input(format!(
                "target layer id {bad} is out of range: {origin} has {} layers",
                cfg.num_hidden_layers
            )));
        }
        let dims = layer_dims(&cfg);
        let depth = layer_ids.iter().max().map_or(0, |m| m + 1);
        let shapes = LayerWeights::shapes(&dims, cfg.intermediate_size);
        let mut layers = Vec::with_capacity(depth);
        for i in 0..depth {
            let ts = LAYER_TENSOR_NAMES
                .iter()
                .zip(&shapes)
                .map(|(n, s)| tensor(&format!("model.layers.{i}.{n}"), s))
                .collect::<Result<Vec<_>>>()?;
            layers.push(LayerWeights::from_vec(ts));
        }
        let (v, h) = (cfg.vocab_size, cfg.hidden_size);
        let embed = tensor("model.embed_tokens.weight", &[v, h])?;
        let norm = Some(tensor("model.norm.weight", &[h])?);
        let frozen = if has_lm_head {
            FrozenTarget::new(embed, tensor("lm_head.weight", &[v, h])?)
        } else {
            FrozenTarget::tied(embed)
        };
        Ok(Qwen3Target {
            backend,
            cfg,
            dims,
            layers,
            layer_ids: layer_ids.to_vec(),
            frozen: Arc::new(frozen),
            norm,
            loaded_bytes: 0,
        })
    }

    /// Bytes of the tensors read from the checkpoint files, as stored there (0 for
    /// [`Qwen3Target::random`]): with the load's wall time, its throughput.
    pub fn loaded_bytes(&self) -> u64 {
        self.loaded_bytes
    }

    pub fn config(&self) -> &Qwen3Config {
        &self.cfg
    }
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }
    /// `(V, H)` frozen embedding table.
    pub fn embedding(&self) -> &Tensor {
        self.frozen.embed()
    }
    /// `(V, H)` frozen LM head.
    pub fn lm_head(&self) -> &Tensor {
        self.frozen.lm_head()
    }
    /// The embedding and LM head, for a drafter that borrows them (on the same device).
    pub fn frozen(&self) -> &Arc<FrozenTarget> {
        &self.frozen
    }

    /// Runs layers `0..n` on one sequence and calls `emit(layer, output)` after each.
    fn run(
        &self,
        ids: &[u32],
        n: usize,
        emit: impl FnMut(usize, &Tensor) -> Result<()>,
    ) -> Result<()> {
        self.run_packed(&[ids], n, emit)
    }

    /// Runs layers `0..n` on documents packed end to end (`(sum S, H)` rows; each document
    /// causal within itself, positions from 0, as if run alone) and calls
    /// `emit(layer, output)` after each.
    fn run_packed(
        &self,
        docs: &[&[u32]],
        n: usize,
        mut emit: impl FnMut(usize, &Tensor) -> Result<()>,
    ) -> Result<()> {
        let b = self.backend.as_ref();
        for (d, ids) in docs.iter().enumerate() {
            if let Some(&bad) = ids.iter().find(|&&t| t as usize >= self.cfg.vocab_size) {
                return Err(ModelError::Input(format!(
                    "token id {bad} of packed document {d} is outside the target vocabulary of {}",
                    self.cfg.vocab_size
                )));
            }
        }
        let ids: Vec<u32> = docs.concat();
        let pos: Vec<i32> = docs.iter().flat_map(|d| 0..d.len() as i32).collect();
        let lens: Vec<usize> = docs.iter().map(|d| d.len()).collect();
        let mask = BlockMask::document(&lens).map_err(dflash_core::Error::from)?;
        let geo = AttnGeometry {
            pos_q: &pos,
            pos_ctx: &[],
            mask: &mask,
        };
        let mut x = b.embedding(self.frozen.embed(), &ids)?;
        for (i, w) in self.layers.iter().take(n).enumerate() {
            x = layer::forward(b, w, &self.dims, &x, None, &geo, false)?.0;
            emit(i, &x)?;
        }
        Ok(())
    }

    /// Raw outputs of the loaded layers: index 0 is the embedding output, index `i` the
    /// output of layer `i-1` (never the final norm, unlike HF's last entry). For golden tests.
    pub fn hidden_states(&self, ids: &[u32]) -> Result<Vec<Vec<f32>>> {
        let b = self.backend.as_ref();
        let mut out = vec![b.download(&b.embedding(self.frozen.embed(), ids)?)?];
        self.run(ids, self.layers.len(), |_, x| {
            out.push(b.download(x)?);
            Ok(())
        })?;
        Ok(out)
    }

    /// Logits of the last loaded layer's output through the final norm and LM head (only
    /// meaningful when all layers are loaded). For golden tests.
    pub fn logits(&self, ids: &[u32]) -> Result<Vec<f32>> {
        let b = self.backend.as_ref();
        let mut last = None;
        self.run(ids, self.layers.len(), |_, x| {
            last = Some(b.copy(x)?);
            Ok(())
        })?;
        let x = last.ok_or_else(|| ModelError::Input("no layers loaded".into()))?;
        let norm = self.norm.as_ref().expect("norm is loaded by from_files");
        let (y, _) = b.rms_norm(&x, norm, self.dims.eps)?;
        Ok(b.download(&b.linear(&y, self.lm_head())?)?)
    }
}

impl dflash_core::pipeline::Target for Qwen3Target {
    fn hidden_size(&self) -> usize {
        self.cfg.hidden_size
    }
    fn vocab_size(&self) -> usize {
        self.cfg.vocab_size
    }
    fn layer_ids(&self) -> &[usize] {
        &self.layer_ids
    }
    fn features_packed(&self, docs: &[&[u32]]) -> dflash_core::Result<Features> {
        let b = self.backend.as_ref();
        let mut chosen: Vec<Option<Tensor>> = (0..self.layer_ids.len()).map(|_| None).collect();
        let depth = self.layers.len();
        self.run_packed(docs, depth, |i, x| {
            for (slot, &l) in self.layer_ids.iter().enumerate() {
                if l == i {
                    // HF's hidden_states[L] (the last layer's entry) has the final norm
                    // applied; DFlash reads hidden_states[l + 1], so do the same.
                    chosen[slot] = Some(if l + 1 == self.cfg.num_hidden_layers {
                        let norm = self.norm.as_ref().expect("norm is loaded by from_files");
                        b.rms_norm(x, norm, self.dims.eps)?.0
                    } else {
                        b.copy(x)?
                    });
                }
            }
            Ok(())
        })
        .map_err(|e| match e {
            ModelError::Backend(e) => e,
            other => dflash_core::Error::op("target.features", b.device(), other.to_string()),
        })?;
        let parts: Vec<&Tensor> = chosen
            .iter()
            .map(|t| t.as_ref().expect("every id <= depth"))
            .collect();
        // Left on the target's device, in its compute format (bf16 for bf16 GEMMs: the
        // drafter's fc reads them as a GEMM operand, which rounds them to bf16 anyway).
        Ok(Features::Tensor(
            b.to_compute_format(b.concat_cols(&parts)?)?,
        ))
    }
}

/// A layer tensor past `config.json`'s `num_hidden_layers` means the config describes
/// another model (HF loads it with a warning and drops the layers; training on a silently
/// truncated target is never meant). Missing deeper layers are fine: only the layers up to
/// the deepest one used are ever read.
fn check_layer_count(cfg: &Qwen3Config, files: &TensorFiles) -> Result<()> {
    check_layers_match(
        files,
        "model.layers.",
        cfg.num_hidden_layers,
        "config.json's num_hidden_layers",
    )
}

/// The layer tensors of `files` (named `{prefix}{i}.{name}`) against the `n` layers the
/// config says, in both directions: a layer index `>= n` is an unused tensor, and every
/// layer `< n` must hold all of its tensors, also those the job will not read (a target
/// is run only to its deepest needed layer): either way the config and the weights
/// describe different models, or a shard is missing.
pub(crate) fn check_layers_match(
    files: &TensorFiles,
    prefix: &str,
    n: usize,
    what: &str,
) -> Result<()> {
    let err = |name: String, detail: String| ModelError::Tensor {
        path: files.dir().to_path_buf(),
        name,
        detail,
    };
    let mut names = files.names();
    names.sort();
    for name in names {
        let Some(i) = name
            .strip_prefix(prefix)
            .and_then(|rest| rest.split('.').next())
            .and_then(|i| i.parse::<usize>().ok())
        else {
            continue;
        };
        if i >= n {
            return Err(err(
                name,
                format!(
                    "layer {i} is beyond {what} {n}: the config and the weights describe \
                     different models"
                ),
            ));
        }
    }
    for i in 0..n {
        if let Some(t) = LAYER_TENSOR_NAMES
            .iter()
            .map(|t| format!("{prefix}{i}.{t}"))
            .find(|t| !files.contains(t))
        {
            return Err(err(
                t,
                format!(
                    "missing: {what} is {n}, but the weights hold no such tensor of layer {i} \
                     (a shard missing, or a config for a deeper model)"
                ),
            ));
        }
    }
    Ok(())
}
