//! The DFlash drafter: forward and explicit backward for one sequence's blocks.
//!
//! ```text
//! F   (S, k*H)   target features of the chosen layers, concatenated per token
//! ctx (S, H)   = rms(F fc^T, hidden_norm)                 computed once, shared by all layers
//! x0  (B, H)   = embed_target(block_ids)                  B = N * block_size, frozen
//! x_l          = layer_l(x_{l-1}, ctx)                    KV injection, DFlash mask
//! out (B, H)   = rms(x_L, norm)
//! loss         = sum_t w_t * CE(out_t lm_head^T, label_t)   fused, frozen lm_head
//! ```

use std::sync::Arc;

use dflash_config::{DrafterConfig, LayerType};
use dflash_core::mask::BlockMask;
use dflash_core::pipeline::FeaturesRef;
use dflash_core::{Backend, LossStats, Tensor, Transpose};

use crate::error::{ModelError, Result};
use crate::layer::{self, AttnGeometry, LAYER_TENSOR_NAMES, LayerCache, LayerDims, LayerWeights};

/// The drafter's trainable tensors, in checkpoint order. Gradients use the same type.
pub struct DrafterParams {
    /// `(H, k*H)`
    pub fc: Tensor,
    /// `(H)`
    pub hidden_norm: Tensor,
    /// `(H)`
    pub norm: Tensor,
    pub layers: Vec<LayerWeights>,
}

pub type DrafterGrads = DrafterParams;

pub fn layer_dims(cfg: &DrafterConfig) -> LayerDims {
    LayerDims {
        hidden: cfg.hidden_size,
        q_heads: cfg.num_attention_heads,
        kv_heads: cfg.num_key_value_heads,
        head_dim: cfg.head_dim,
        eps: cfg.rms_norm_eps as f32,
        rope_theta: cfg.rope_theta as f32,
    }
}

impl DrafterParams {
    /// `(name, shape)` of every tensor in checkpoint order (docs/design.md §2.6 names, no prefix).
    pub fn layout(cfg: &DrafterConfig) -> Vec<(String, Vec<usize>)> {
        let h = cfg.hidden_size;
        let k = cfg.target_layer_ids.len();
        let mut v = vec![
            ("fc.weight".to_string(), vec![h, k * h]),
            ("hidden_norm.weight".to_string(), vec![h]),
            ("norm.weight".to_string(), vec![h]),
        ];
        let shapes = LayerWeights::shapes(&layer_dims(cfg), cfg.intermediate_size);
        for i in 0..cfg.num_hidden_layers {
            for (n, s) in LAYER_TENSOR_NAMES.iter().zip(&shapes) {
                v.push((format!("layers.{i}.{n}"), s.clone()));
            }
        }
        v
    }

    /// Builds from tensors in [`DrafterParams::layout`] order.
    pub fn from_tensors(mut ts: Vec<Tensor>) -> Self {
        let rest = ts.split_off(3);
        let mut it = ts.into_iter();
        let (fc, hidden_norm, norm) = (it.next().unwrap(), it.next().unwrap(), it.next().unwrap());
        let mut layers = Vec::new();
        let mut rest = rest.into_iter().peekable();
        while rest.peek().is_some() {
            layers.push(LayerWeights::from_vec(rest.by_ref().take(11).collect()));
        }
        DrafterParams {
            fc,
            hidden_norm,
            norm,
            layers,
        }
    }

    pub fn tensors(&self) -> Vec<&Tensor> {
        let mut v = vec![&self.fc, &self.hidden_norm, &self.norm];
        for l in &self.layers {
            v.extend(l.tensors());
        }
        v
    }

    pub fn tensors_mut(&mut self) -> Vec<&mut Tensor> {
        let mut v = vec![&mut self.fc, &mut self.hidden_norm, &mut self.norm];
        for l in &mut self.layers {
            v.extend(l.tensors_mut());
        }
        v
    }

    pub fn zeros(b: &dyn Backend, cfg: &DrafterConfig) -> Result<Self> {
        let ts = Self::layout(cfg)
            .iter()
            .map(|(_, s)| b.zeros(s).map_err(ModelError::from))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self::from_tensors(ts))
    }

    /// HF-style initialisation: linear weights `N(0, std)`, norm weights 1. Each weight is
    /// drawn by the backend's counter-based [`MemoryOps::random_normal`] from its own stream
    /// (`seed`, tensor index): on the device where the backend has a generator, in parallel on
    /// the host otherwise, and the same values on every backend. (A serial host generator took
    /// ~30 s for the 1 B weights of the 8B recipe's drafter.)
    ///
    /// [`MemoryOps::random_normal`]: dflash_core::MemoryOps::random_normal
    pub fn init_random(b: &dyn Backend, cfg: &DrafterConfig, std: f32, seed: u64) -> Result<Self> {
        // A domain of its own, so a drafter and a target drawn from the same seed differ.
        const DOMAIN: u64 = 0xD7AF_7E20_5EED_0001;
        let base = (seed ^ DOMAIN).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let ts = Self::layout(cfg)
            .iter()
            .enumerate()
            .map(|(i, (name, shape))| {
                let t = if name.ends_with("norm.weight") || name.ends_with("layernorm.weight") {
                    b.upload(&vec![1.0; shape.iter().product()], shape)?
                } else {
                    b.random_normal(shape, std, base.wrapping_add(i as u64))?
                };
                Ok(t)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self::from_tensors(ts))
    }

    /// Sets every tensor to zero (between optimizer steps). Fresh zeros, not `x * 0`, which
    /// would keep a NaN from a bad step alive forever.
    pub fn zero_(&mut self, b: &dyn Backend) -> Result<()> {
        for t in self.tensors_mut() {
            *t = b.zeros(t.dims())?;
        }
        Ok(())
    }

    pub fn num_params(&self) -> usize {
        self.tensors().iter().map(|t| t.numel()).sum()
    }
}

/// Box-Muller normal samples (no extra dependency for one distribution).
pub fn normal_vec(rng: &mut impl rand::Rng, n: usize, std: f32) -> Vec<f32> {
    (0..n)
        .map(|_| {
            let u1: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
            let u2: f64 = rng.random();
            ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32 * std
        })
        .collect()
}

/// The frozen target tensors the drafter borrows.
pub struct FrozenTarget {
    /// `(V, H)`
    embed: Tensor,
    /// `(V, H)`; `None` where the target ties its LM head to the embedding: one tensor
    /// serves both (Qwen3-4B's would be a second 0.78 GB in bf16).
    lm_head: Option<Tensor>,
}

impl FrozenTarget {
    /// A target with its own LM head.
    pub fn new(embed: Tensor, lm_head: Tensor) -> Self {
        FrozenTarget {
            embed,
            lm_head: Some(lm_head),
        }
    }

    /// A target whose LM head is its embedding (`tie_word_embeddings`).
    pub fn tied(embed: Tensor) -> Self {
        FrozenTarget {
            embed,
            lm_head: None,
        }
    }

    /// `(V, H)` embedding table.
    pub fn embed(&self) -> &Tensor {
        &self.embed
    }

    /// `(V, H)` LM head: the embedding itself where tied.
    pub fn lm_head(&self) -> &Tensor {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// Whether the LM head is the embedding.
    pub fn is_tied(&self) -> bool {
        self.lm_head.is_none()
    }
}

/// One sequence's drafter input: context features and the sampled blocks.
#[derive(Debug, Clone, Copy)]
pub struct DraftInput<'a> {
    /// `(S, k*H)`: host values, or a tensor (taken as it is when it lives on the drafter's
    /// device, imported otherwise).
    pub features: FeaturesRef<'a>,
    /// `(N)` sorted anchors; negative = padding block.
    pub anchors: &'a [i32],
    /// `(N*bs)` `[token at anchor, MASK, ...]` per block.
    pub block_ids: &'a [u32],
    /// `(N*bs)` absolute positions `a + j`.
    pub positions: &'a [i32],
    /// `(N*bs)` same-position labels (token at `a + j`).
    pub labels: &'a [u32],
    /// `(N*bs)` loss weights (0 on slot 0, past the end, unsupervised, padding).
    pub weights: &'a [f32],
    /// `(N)` for a packed micro-batch (several documents laid end to end as the context):
    /// the first context row of each block's document, which bounds what the block sees.
    /// Empty: one document starting at row 0.
    pub doc_starts: &'a [i32],
    /// `(S)` RoPE position of each context row (in a packed micro-batch, counted from its
    /// document's start; block slots then carry document positions in `positions` too).
    /// Empty: `0..S`.
    pub ctx_positions: &'a [i32],
}

pub struct StepOutput {
    pub stats: LossStats,
}

pub struct Drafter {
    backend: Arc<dyn Backend>,
    cfg: DrafterConfig,
    dims: LayerDims,
    pub params: DrafterParams,
    frozen: Arc<FrozenTarget>,
}

/// The features tensor the drafter reads: the caller's own when it lives here, else a copy.
enum MaybeOwned<'a> {
    Borrowed(&'a Tensor),
    Owned(Tensor),
}

impl MaybeOwned<'_> {
    fn get(&self) -> &Tensor {
        match self {
            MaybeOwned::Borrowed(t) => t,
            MaybeOwned::Owned(t) => t,
        }
    }
}

struct Prepared<'a> {
    s: usize,
    feats: MaybeOwned<'a>,
    c: Tensor,
    ctx: Tensor,
    rstd_c: Tensor,
    pos_ctx: Vec<i32>,
    masks: Vec<BlockMask>,
}

impl Drafter {
    pub fn new(
        backend: Arc<dyn Backend>,
        cfg: DrafterConfig,
        params: DrafterParams,
        frozen: Arc<FrozenTarget>,
    ) -> Result<Self> {
        let expect = DrafterParams::layout(&cfg);
        let tensors = params.tensors();
        if tensors.len() != expect.len() {
            return Err(ModelError::Input(format!(
                "the drafter's parameters are {} tensors, its config ({} layers) has {}",
                tensors.len(),
                cfg.num_hidden_layers,
                expect.len()
            )));
        }
        for ((name, shape), t) in expect.iter().zip(tensors) {
            if t.dims() != shape.as_slice() {
                return Err(ModelError::Input(format!(
                    "drafter tensor {name} has shape {:?}, config says {shape:?}",
                    t.dims()
                )));
            }
        }
        let (v, h) = (frozen.embed.dims()[0], frozen.embed.dims()[1]);
        if h != cfg.hidden_size || frozen.lm_head().dims() != [v, h] {
            return Err(ModelError::Input(format!(
                "drafter hidden_size {} does not match the target's embedding {:?} / lm_head {:?}",
                cfg.hidden_size,
                frozen.embed.dims(),
                frozen.lm_head().dims()
            )));
        }
        if cfg.mask_token_id as usize >= v {
            return Err(ModelError::Input(format!(
                "mask_token_id {} is outside the target vocabulary of {v}",
                cfg.mask_token_id
            )));
        }
        let dims = layer_dims(&cfg);
        Ok(Drafter {
            backend,
            cfg,
            dims,
            params,
            frozen,
        })
    }

    pub fn config(&self) -> &DrafterConfig {
        &self.cfg
    }
    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.backend
    }

    /// Validates an input; returns `(S, block length)`. The block length is
    /// `block_ids.len() / anchors.len()`: the configured `block_size` in training, shorter
    /// only for evaluation's last block near the end of a sequence (as the serving loop drafts).
    fn check_input(&self, inp: &DraftInput<'_>) -> Result<(usize, usize)> {
        let kh = self.cfg.target_layer_ids.len() * self.cfg.hidden_size;
        if inp.features.is_empty() || !inp.features.len().is_multiple_of(kh) {
            return Err(ModelError::Input(format!(
                "features have {} values, not a positive multiple of k*H = {kh}",
                inp.features.len()
            )));
        }
        if let FeaturesRef::Tensor(t) = inp.features
            && (t.dims().len() != 2 || t.dims()[1] != kh)
        {
            return Err(ModelError::Input(format!(
                "features tensor has shape {:?}, expected (S, k*H = {kh})",
                t.dims()
            )));
        }
        let n = inp.anchors.len().max(1);
        let bs = inp.block_ids.len() / n;
        if bs == 0 || bs > self.cfg.block_size || inp.block_ids.len() != bs * inp.anchors.len() {
            return Err(ModelError::Input(format!(
                "{} block ids for {} anchors: expected anchors x block length with block length \
                 in 1..={}",
                inp.block_ids.len(),
                inp.anchors.len(),
                self.cfg.block_size
            )));
        }
        let rows = inp.block_ids.len();
        for (what, n) in [
            ("positions", inp.positions.len()),
            ("labels", inp.labels.len()),
            ("weights", inp.weights.len()),
        ] {
            if n != rows {
                return Err(ModelError::Input(format!(
                    "{what} has {n} entries, expected one per block slot ({rows})"
                )));
            }
        }
        let s = inp.features.len() / kh;
        if !inp.doc_starts.is_empty() && inp.doc_starts.len() != inp.anchors.len() {
            return Err(ModelError::Input(format!(
                "doc_starts has {} entries, expected one per block ({})",
                inp.doc_starts.len(),
                inp.anchors.len()
            )));
        }
        if !inp.ctx_positions.is_empty() && inp.ctx_positions.len() != s {
            return Err(ModelError::Input(format!(
                "ctx_positions has {} entries, expected one per context row ({s})",
                inp.ctx_positions.len()
            )));
        }
        Ok((s, bs))
    }

    fn prepare<'a>(&self, inp: &DraftInput<'a>) -> Result<Prepared<'a>> {
        let b = self.backend.as_ref();
        let (s, bs) = self.check_input(inp)?;
        let kh = self.cfg.target_layer_ids.len() * self.cfg.hidden_size;
        let feats = match inp.features {
            FeaturesRef::Host(h) => MaybeOwned::Owned(b.upload(h, &[s, kh])?),
            FeaturesRef::Tensor(t) if b.is_local(t) => MaybeOwned::Borrowed(t),
            FeaturesRef::Tensor(t) => MaybeOwned::Owned(b.import(t)?),
        };
        let c = b.linear(feats.get(), &self.params.fc)?; // (S, H)
        let (ctx, rstd_c) = b.rms_norm(&c, &self.params.hidden_norm, self.dims.eps)?;
        let masks = self
            .cfg
            .layer_types
            .iter()
            .map(|t| {
                let window = match t {
                    LayerType::FullAttention => None,
                    LayerType::SlidingAttention => {
                        Some(self.cfg.sliding_window.unwrap_or(usize::MAX / 4))
                    }
                };
                BlockMask::dflash_packed(s, bs, inp.anchors, inp.doc_starts, window)
            })
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(dflash_core::Error::from)?;
        let pos_ctx = if inp.ctx_positions.is_empty() {
            (0..s as i32).collect()
        } else {
            inp.ctx_positions.to_vec()
        };
        Ok(Prepared {
            s,
            feats,
            c,
            ctx,
            rstd_c,
            pos_ctx,
            masks,
        })
    }

    /// Forward to the final normed output `(B, H)`, keeping what backward needs.
    fn forward(
        &self,
        inp: &DraftInput<'_>,
        p: &Prepared,
        keep: bool,
    ) -> Result<(Vec<Tensor>, Vec<Option<LayerCache>>, Tensor)> {
        let b = self.backend.as_ref();
        let mut x = b.embedding(&self.frozen.embed, inp.block_ids)?;
        let (mut inputs, mut caches) = (Vec::new(), Vec::new());
        for (l, w) in self.params.layers.iter().enumerate() {
            let geo = AttnGeometry {
                pos_q: inp.positions,
                pos_ctx: &p.pos_ctx,
                mask: &p.masks[l],
            };
            let (y, cache) = layer::forward(b, w, &self.dims, &x, Some(&p.ctx), &geo, keep)?;
            inputs.push(x);
            caches.push(cache);
            x = y;
        }
        Ok((inputs, caches, x))
    }

    /// Greedy predictions `(B)` for every block slot (evaluation);
    /// [`ModelError::NonFiniteOutput`] when the output is not finite (NaN features or weights).
    pub fn predict(&self, inp: &DraftInput<'_>) -> Result<Vec<u32>> {
        let b = self.backend.as_ref();
        let p = self.prepare(inp)?;
        let (_, _, x) = self.forward(inp, &p, false)?;
        let (out, _) = b.rms_norm(&x, &self.params.norm, self.dims.eps)?;
        // Checked on the hidden states, not the logits: finite ones give finite logits through
        // the head, whose weights the loader checks, and only a flag comes back.
        if !b.all_finite(&out)? {
            return Err(ModelError::NonFiniteOutput { op: "predict" });
        }
        Ok(b.linear_argmax(&out, self.frozen.lm_head())?)
    }

    /// Loss statistics only (no gradients).
    pub fn loss(&self, inp: &DraftInput<'_>) -> Result<LossStats> {
        let b = self.backend.as_ref();
        let p = self.prepare(inp)?;
        let (_, _, x) = self.forward(inp, &p, false)?;
        let (out, _) = b.rms_norm(&x, &self.params.norm, self.dims.eps)?;
        let (stats, _) =
            b.linear_cross_entropy(&out, self.frozen.lm_head(), inp.labels, inp.weights, 0.0)?;
        Ok(stats)
    }

    /// Forward and backward of one sequence. Adds `grad_scale * d(sum w*CE)` into `grads`
    /// (`grad_scale` is `1 / global weight sum`, so the loss is normalised once across
    /// micro-batches and ranks). With `recompute`, layer activations are dropped after the
    /// forward and recomputed one layer at a time in the backward.
    pub fn forward_backward(
        &self,
        inp: &DraftInput<'_>,
        grad_scale: f32,
        grads: &mut DrafterGrads,
        recompute: bool,
    ) -> Result<LossStats> {
        let b = self.backend.as_ref();
        let p = self.prepare(inp)?;
        let (inputs, mut caches, x) = self.forward(inp, &p, !recompute)?;
        let (out, rstd_f) = b.rms_norm(&x, &self.params.norm, self.dims.eps)?;
        let (stats, d_out) = b.linear_cross_entropy(
            &out,
            self.frozen.lm_head(),
            inp.labels,
            inp.weights,
            grad_scale,
        )?;
        if stats.weight_sum == 0.0 {
            return Ok(stats); // nothing supervised: every gradient is exactly zero
        }
        drop(out);
        let (mut dx, d_norm) = b.rms_norm_backward(&d_out, &x, &self.params.norm, &rstd_f)?;
        b.add_assign(&mut grads.norm, &d_norm)?;
        let mut d_ctx = b.zeros(&[p.s, self.cfg.hidden_size])?;
        for l in (0..self.params.layers.len()).rev() {
            let w = &self.params.layers[l];
            let geo = AttnGeometry {
                pos_q: inp.positions,
                pos_ctx: &p.pos_ctx,
                mask: &p.masks[l],
            };
            let cache = match caches[l].take() {
                Some(c) => c,
                None => layer::recompute_cache(b, w, &self.dims, &inputs[l], Some(&p.ctx), &geo)?,
            };
            dx = layer::backward(
                b,
                w,
                &self.dims,
                &inputs[l],
                Some(&p.ctx),
                &geo,
                &cache,
                &dx,
                &mut grads.layers[l],
                Some(&mut d_ctx),
            )?;
        }
        let (dc, d_hn) = b.rms_norm_backward(&d_ctx, &p.c, &self.params.hidden_norm, &p.rstd_c)?;
        b.add_assign(&mut grads.hidden_norm, &d_hn)?;
        b.matmul_acc(
            &mut grads.fc,
            &dc,
            Transpose::Yes,
            p.feats.get(),
            Transpose::No,
            1.0,
        )?;
        Ok(stats)
    }
}
