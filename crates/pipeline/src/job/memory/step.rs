//! The drafter replica's state and step, and the target worker's weights and forward, in
//! bytes: the walks of `dflash_models::drafter::Drafter::forward_backward`,
//! `DrafterReplica::finish_step` and `Qwen3Target::features_packed` over [`super::sim`].

use dflash_config::{DrafterConfig, Qwen3Config};

use dflash_models::layer::LayerWeights;

use super::model::{BackendModel, Dtype, OpsKind};
use super::sim::{LayerShape, Walk, layer_backward, layer_cache, layer_forward};

/// Bytes of a host [`dflash_core::mask::BlockMask`] row: two `(start, end)` i32 intervals.
const MASK_ROW_BYTES: u128 = 16;

pub(super) fn drafter_layer(cfg: &DrafterConfig) -> LayerShape {
    let dims = dflash_models::drafter::layer_dims(cfg);
    LayerShape::new(&dims, cfg.intermediate_size, Dtype::F32)
}

pub(super) fn target_layer(cfg: &Qwen3Config, m: &BackendModel) -> LayerShape {
    let dims = dflash_models::target::layer_dims(cfg);
    LayerShape::new(&dims, cfg.intermediate_size, m.compute_dtype())
}

/// Elements of the drafter's trainable tensors (`DrafterParams::layout`, counted without
/// building it: a typo'd layer count must not allocate the list).
pub(super) fn drafter_params(cfg: &DrafterConfig) -> u128 {
    let l = drafter_layer(cfg);
    let kh = cfg.target_layer_ids.len() as u128 * cfg.hidden_size as u128;
    l.h * kh + 2 * l.h + cfg.num_hidden_layers as u128 * (l.matrix_elems() + l.norm_elems())
}

/// The largest single trainable tensor, in elements.
fn largest_param(cfg: &DrafterConfig) -> u128 {
    let l = drafter_layer(cfg);
    l.largest_matrix()
        .max(l.h * cfg.target_layer_ids.len() as u128 * cfg.hidden_size as u128)
}

/// One micro-batch as the drafter sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct MicroShape {
    /// Context rows: the micro-batch's tokens (`sum S`).
    pub ctx_rows: usize,
    /// Blocks (anchors) over all its documents.
    pub blocks: usize,
}

/// What one micro-batch's forward and backward add on top of the replica's state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepBytes {
    /// High-water mark of the step's own allocations (with the backend's kept workspace).
    pub peak: u128,
    /// Activations held when the forward ends (the layer caches unless recomputed).
    pub kept: u128,
    /// The largest attention workspace and the CE workspace of the step (within `peak`; the
    /// CE's includes what the backend keeps between calls).
    pub attention_ws: u128,
    pub ce_ws: u128,
}

/// One `DrafterReplica::accumulate` of a micro-batch `mb` whose features are on the device
/// (`import`: copied there for the step first).
pub(super) fn drafter_step(
    cfg: &DrafterConfig,
    mb: MicroShape,
    recompute: bool,
    import: bool,
    m: &BackendModel,
) -> StepBytes {
    let l = drafter_layer(cfg);
    let (s, rows) = (
        mb.ctx_rows as u128,
        mb.blocks as u128 * cfg.block_size as u128,
    );
    let (h, v) = (l.h, cfg.vocab_size as u128);
    let kh = cfg.target_layer_ids.len() as u128 * h;
    let layers = cfg.num_hidden_layers as u128;
    let (act, compute) = (m.act_dtype(), m.compute_dtype());
    let mut w = Walk::new(m);
    // The loss workspace a backend keeps between calls (CUDA) is there from the previous
    // step on, so from the start of this one.
    let active = mb.blocks as u128 * cfg.block_size.saturating_sub(1) as u128;
    let (ce_t, ce_kept) = m.ce_workspace(active, h, v);
    let ce_kept = w.sim.alloc(ce_kept);
    // The host inputs (ids, positions, labels, weights per slot; anchors) and, for a host
    // backend, the masks (one per layer) and context positions: host memory, which is the
    // device's memory only on the host.
    if m.ops == OpsKind::Host {
        w.sim
            .alloc(rows * 16 + layers * rows * MASK_ROW_BYTES + s * 4);
    }
    // prepare: features imported when they live elsewhere; c = fc(F); ctx, rstd_c = norm(c).
    if import {
        w.sim.alloc(s * kh * m.compute as u128);
    }
    let _c = w.linear((compute, s * kh), Dtype::F32, h * kh, s * h);
    let _ctx = w.rms_norm(s, h);
    // forward: x0 = embed(block ids); every layer's input stays (`inputs`), and its cache
    // without recomputation.
    w.a(rows * h);
    let mut cache = 0;
    w.repeat(layers, |w| {
        cache = layer_forward(w, &l, rows, Some(s), !recompute).1;
    });
    let kept = w.sim.live.max(0) as u128 - ce_kept;
    // out = norm(x); the fused CE writes d_out (T, H) with its workspace; out is dropped.
    let (out, _rstd_f) = w.rms_norm(rows, h);
    w.a(rows * h);
    w.sim.transient(ce_t);
    w.free(out);
    let (dx, _d_norm) = w.rms_norm_backward(rows, h);
    w.f(s * h); // d_ctx
    // Each layer from the last: its cache (recomputed, or the forward's), the backward's new
    // dx replacing the old one, then the cache dropped.
    w.repeat(layers, |w| {
        let c = match recompute {
            true => layer_cache(w, &l, rows, Some(s)),
            false => cache,
        };
        layer_backward(w, &l, rows, s);
        w.free(dx);
        w.free(c);
    });
    // dc, d_hidden_norm = norm backward of the context; fc's gradient reads dc and F.
    w.rms_norm_backward(s, h);
    w.gemm(&[(act, s * h), (compute, s * kh)]);
    StepBytes {
        peak: w.sim.peak.max(0) as u128,
        kept,
        attention_ws: w.attn_ws,
        ce_ws: ce_t + ce_kept,
    }
}

/// A replica's state: weights, gradients, AdamW moments (all f32), in bytes each (what a
/// checkpoint writes of each).
pub(super) fn drafter_state(cfg: &DrafterConfig) -> u128 {
    drafter_params(cfg) * 4
}

/// [`drafter_state`] as the backend of `m` holds it: each trainable tensor rounded as the
/// backend rounds its buffer (`DrafterParams::layout`, one layer's tensors counted once).
pub(super) fn drafter_state_on(cfg: &DrafterConfig, m: &BackendModel) -> u128 {
    let f32_tensor = |shape: &[usize]| m.tensor_bytes(elems(shape) * 4);
    let dims = dflash_models::drafter::layer_dims(cfg);
    let layer: u128 = LayerWeights::shapes(&dims, cfg.intermediate_size)
        .iter()
        .map(|s| f32_tensor(s))
        .sum();
    let (h, k) = (cfg.hidden_size, cfg.target_layer_ids.len());
    f32_tensor(&[h, k * h]) + 2 * f32_tensor(&[h]) + cfg.num_hidden_layers as u128 * layer
}

/// Elements of a tensor of `shape` (128-bit: a typo'd size must not overflow).
fn elems(shape: &[usize]) -> u128 {
    shape.iter().map(|&d| d as u128).product()
}

/// `finish_step`'s own high-water mark above the state: gradients are zeroed by fresh
/// tensors made before the old ones go (the largest one counts), and with several replicas
/// the host all-reduce holds one tensor's copy and its sum.
pub(super) fn finish_step(cfg: &DrafterConfig, replicas: usize, m: &BackendModel) -> u128 {
    let largest = m.tensor_bytes(largest_param(cfg) * 4);
    let reduce = match (replicas > 1, m.ops) {
        (true, OpsKind::Host) => 2 * largest,
        _ => 0,
    };
    largest.max(reduce)
}

/// The frozen target's weights on its worker: layers `0..depth` (projections in the compute
/// format, norms f32), the final norm, and the embedding and LM head (the drafter's frozen
/// pair, [`frozen_pair`]).
pub(super) fn target_weights(cfg: &Qwen3Config, depth: usize, m: &BackendModel) -> (u128, u128) {
    let dims = dflash_models::target::layer_dims(cfg);
    // Projections (2-D) in the compute format, norms f32; each tensor as the backend rounds it.
    let tensor = |shape: &[usize]| {
        let bytes = if shape.len() == 2 { m.compute } else { 4 };
        m.tensor_bytes(elems(shape) * bytes as u128)
    };
    let layer: u128 = LayerWeights::shapes(&dims, cfg.intermediate_size)
        .iter()
        .map(|s| tensor(s))
        .sum();
    let h = cfg.hidden_size;
    let layers = depth as u128 * layer + tensor(&[h]);
    (layers, frozen_pair(cfg, m))
}

/// The target's embedding and LM head, the drafter's frozen pair: one tensor where the
/// target ties them (`tie_word_embeddings`: the embedding serves as the head).
pub(super) fn frozen_pair(cfg: &Qwen3Config, m: &BackendModel) -> u128 {
    let tensors = if cfg.tie_word_embeddings { 1 } else { 2 };
    tensors * frozen_matrix(cfg.vocab_size, cfg.hidden_size, m)
}

/// One of the frozen embedding and LM head, `(V, H)` in the compute format.
pub(super) fn frozen_matrix(vocab: usize, hidden: usize, m: &BackendModel) -> u128 {
    m.tensor_bytes(elems(&[vocab, hidden]) * m.compute as u128)
}

/// One `Target::features_packed` of `tokens` tokens through layers `0..depth`, emitting the
/// layers `ids` (the features: `(tokens, k*H)` in the compute format). Returns (peak above
/// the weights, the features' bytes, which leave with the batch).
pub(super) fn target_forward(
    cfg: &Qwen3Config,
    ids: &[usize],
    tokens: usize,
    m: &BackendModel,
) -> (u128, u128) {
    let depth = ids.iter().max().map_or(0, |d| d + 1);
    let l = target_layer(cfg, m);
    let t = tokens as u128;
    let mut w = Walk::new(m);
    if m.ops == OpsKind::Host {
        w.sim.alloc(t * (4 + 4 + MASK_ROW_BYTES)); // ids, positions, the document mask
    }
    let x = w.a(t * l.h); // embedding
    // The chosen layers' copies: all but the deepest are made before the deepest layer runs,
    // where the forward peaks (counting them from the start overstates no later moment).
    let copies = ids.len().saturating_sub(1) as u128;
    let chosen: u128 = (0..copies).map(|_| w.a(t * l.h)).sum();
    // Each layer: y made, the previous x dropped.
    w.repeat(depth as u128, |w| {
        layer_forward(w, &l, t, None, false);
        w.free(x);
    });
    // The deepest chosen layer (normed when it is the target's last).
    let last = w.a(t * l.h);
    if depth == cfg.num_hidden_layers {
        w.sim.transient(t * 4);
    }
    w.free(x);
    let kh = ids.len() as u128 * l.h;
    let concat = w.a(t * kh);
    let features = if m.act != m.compute {
        let f = w.sim.alloc(t * kh * m.compute as u128);
        w.free(concat);
        f
    } else {
        concat
    };
    w.free(chosen + last);
    (w.sim.peak.max(0) as u128, features)
}
