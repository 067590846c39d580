//! The Qwen3 decoder layer shared by target and drafter, forward and explicit backward.
//!
//! ```text
//! xn = rms(x, input_ln)                       (B, H)
//! q  = rope(rms_h(xn Wq^T, q_norm), pos_q)    (B, Hq, D)
//! k  = [rope(rms_h(ctx Wk^T), pos_c) ; rope(rms_h(xn Wk^T), pos_q)]   (S+B, Hkv, D)
//! v  = [ctx Wv^T ; xn Wv^T]                   (S+B, Hkv, D)
//! h  = x + attn(q, k, v, mask) Wo^T           (B, H)
//! y  = h + down(silu(gate(hn)) * up(hn)),  hn = rms(h, post_ln)
//! ```
//! With no context (`ctx = None`) this is plain self-attention: the target's layer.
//! With context it is DFlash KV injection: context rows are keys/values only (same Wk/Wv,
//! k_norm applies to both), never queried, never through Wo or the MLP.

use dflash_core::mask::BlockMask;
use dflash_core::{Backend, Tensor, Transpose};

use crate::error::Result;

/// Dimensions of a layer's attention.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerDims {
    pub hidden: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub eps: f32,
    pub rope_theta: f32,
}

impl LayerDims {
    pub fn scale(&self) -> f32 {
        (self.head_dim as f32).powf(-0.5)
    }
}

/// One decoder layer's weights (HF names under `layers.{i}.`).
pub struct LayerWeights {
    pub input_layernorm: Tensor,
    pub post_attention_layernorm: Tensor,
    pub q_proj: Tensor,
    pub k_proj: Tensor,
    pub v_proj: Tensor,
    pub o_proj: Tensor,
    pub q_norm: Tensor,
    pub k_norm: Tensor,
    pub gate_proj: Tensor,
    pub up_proj: Tensor,
    pub down_proj: Tensor,
}

/// Names relative to `layers.{i}.`, in the order [`LayerWeights::tensors`] lists them.
pub const LAYER_TENSOR_NAMES: [&str; 11] = [
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
];

impl LayerWeights {
    /// Shapes in [`LAYER_TENSOR_NAMES`] order.
    pub fn shapes(d: &LayerDims, intermediate: usize) -> [Vec<usize>; 11] {
        let (h, qd, kvd) = (d.hidden, d.q_heads * d.head_dim, d.kv_heads * d.head_dim);
        [
            vec![h],
            vec![h],
            vec![qd, h],
            vec![kvd, h],
            vec![kvd, h],
            vec![h, qd],
            vec![d.head_dim],
            vec![d.head_dim],
            vec![intermediate, h],
            vec![intermediate, h],
            vec![h, intermediate],
        ]
    }
    pub fn from_vec(mut v: Vec<Tensor>) -> Self {
        assert_eq!(v.len(), 11, "a layer has 11 tensors");
        let mut next = || v.remove(0);
        LayerWeights {
            input_layernorm: next(),
            post_attention_layernorm: next(),
            q_proj: next(),
            k_proj: next(),
            v_proj: next(),
            o_proj: next(),
            q_norm: next(),
            k_norm: next(),
            gate_proj: next(),
            up_proj: next(),
            down_proj: next(),
        }
    }
    pub fn tensors(&self) -> [&Tensor; 11] {
        [
            &self.input_layernorm,
            &self.post_attention_layernorm,
            &self.q_proj,
            &self.k_proj,
            &self.v_proj,
            &self.o_proj,
            &self.q_norm,
            &self.k_norm,
            &self.gate_proj,
            &self.up_proj,
            &self.down_proj,
        ]
    }
    pub fn tensors_mut(&mut self) -> [&mut Tensor; 11] {
        [
            &mut self.input_layernorm,
            &mut self.post_attention_layernorm,
            &mut self.q_proj,
            &mut self.k_proj,
            &mut self.v_proj,
            &mut self.o_proj,
            &mut self.q_norm,
            &mut self.k_norm,
            &mut self.gate_proj,
            &mut self.up_proj,
            &mut self.down_proj,
        ]
    }
}

/// Positions and mask of one attention call.
pub struct AttnGeometry<'a> {
    /// `(B)` positions of the query rows.
    pub pos_q: &'a [i32],
    /// `(S)` positions of the context rows (empty without context).
    pub pos_ctx: &'a [i32],
    /// `(B) x (S + B)` mask: context keys first, then the query rows' own keys.
    pub mask: &'a BlockMask,
}

/// Activations a layer's backward needs. Dropped and recomputed when recomputation is on.
pub struct LayerCache {
    xn: Tensor,
    rstd_in: Tensor,
    q: Tensor,
    rstd_q: Tensor,
    q_rot: Tensor,
    k_ctx: Option<(Tensor, Tensor)>,
    k_blk: (Tensor, Tensor),
    k_all: Tensor,
    v_all: Tensor,
    attn: Tensor,
    lse: Tensor,
    h: Tensor,
    hn: Tensor,
    rstd_post: Tensor,
    gate: Tensor,
    up: Tensor,
    act: Tensor,
}

/// RMSNorm of each head: `x (T, heads*D)` viewed as `(T*heads, D)`.
pub(crate) fn head_norm(
    b: &dyn Backend,
    x: &Tensor,
    w: &Tensor,
    d: &LayerDims,
) -> Result<(Tensor, Tensor)> {
    let (rows, cols) = x.shape().as_matrix();
    let xv = b.copy(x)?.reshape([rows * cols / d.head_dim, d.head_dim])?;
    let (y, rstd) = b.rms_norm(&xv, w, d.eps)?;
    Ok((y.reshape([rows, cols / d.head_dim, d.head_dim])?, rstd))
}

/// Forward of one layer. `x (B, H)`; `ctx (S, H)` or `None`. Returns `y (B, H)` and, when
/// `keep` is set, the cache for backward.
pub fn forward(
    b: &dyn Backend,
    w: &LayerWeights,
    d: &LayerDims,
    x: &Tensor,
    ctx: Option<&Tensor>,
    geo: &AttnGeometry<'_>,
    keep: bool,
) -> Result<(Tensor, Option<LayerCache>)> {
    let cache = recompute_cache(b, w, d, x, ctx, geo)?;
    let down = b.linear(&cache.act, &w.down_proj)?;
    let y = b.add(&cache.h, &down)?;
    Ok((y, keep.then_some(cache)))
}

/// The activations [`backward`] needs: the layer's forward short of its output (the down
/// projection and the second residual add, whose results the backward never reads). Used
/// by [`forward`] and, on its own, by activation recomputation, which so skips one of the
/// layer's seven projections.
pub fn recompute_cache(
    b: &dyn Backend,
    w: &LayerWeights,
    d: &LayerDims,
    x: &Tensor,
    ctx: Option<&Tensor>,
    geo: &AttnGeometry<'_>,
) -> Result<LayerCache> {
    let rows = x.dims()[0];
    let (xn, rstd_in) = b.rms_norm(x, &w.input_layernorm, d.eps)?;

    let q = b.linear(&xn, &w.q_proj)?; // (B, Hq*D)
    let (qn, rstd_q) = head_norm(b, &q, &w.q_norm, d)?;
    let q_rot = b.rope(&qn, geo.pos_q, d.rope_theta)?; // (B, Hq, D)

    let kb = b.linear(&xn, &w.k_proj)?; // (B, Hkv*D)
    let (kbn, rstd_kb) = head_norm(b, &kb, &w.k_norm, d)?;
    let kb_rot = b.rope(&kbn, geo.pos_q, d.rope_theta)?;
    let vb = b
        .linear(&xn, &w.v_proj)?
        .reshape([rows, d.kv_heads, d.head_dim])?;

    let (k_all, v_all, k_ctx) = match ctx {
        Some(ctx) => {
            let s = ctx.dims()[0];
            let kc = b.linear(ctx, &w.k_proj)?;
            let (kcn, rstd_kc) = head_norm(b, &kc, &w.k_norm, d)?;
            let kc_rot = b.rope(&kcn, geo.pos_ctx, d.rope_theta)?;
            let vc = b
                .linear(ctx, &w.v_proj)?
                .reshape([s, d.kv_heads, d.head_dim])?;
            let k_all = b.concat_rows(&[&kc_rot, &kb_rot])?;
            let v_all = b.concat_rows(&[&vc, &vb])?;
            (k_all, v_all, Some((kc, rstd_kc)))
        }
        None => (kb_rot, vb, None),
    };

    let (attn, lse) = b.attention(&q_rot, &k_all, &v_all, geo.mask, d.scale())?;
    let attn = attn.reshape([rows, d.q_heads * d.head_dim])?;
    let o = b.linear(&attn, &w.o_proj)?;
    let h = b.add(x, &o)?;

    let (hn, rstd_post) = b.rms_norm(&h, &w.post_attention_layernorm, d.eps)?;
    let gate = b.linear(&hn, &w.gate_proj)?;
    let up = b.linear(&hn, &w.up_proj)?;
    let act = b.swiglu(&gate, &up)?;

    Ok(LayerCache {
        xn,
        rstd_in,
        q,
        rstd_q,
        q_rot,
        k_ctx,
        k_blk: (kb, rstd_kb),
        k_all,
        v_all,
        attn,
        lse,
        h,
        hn,
        rstd_post,
        gate,
        up,
        act,
    })
}

/// `acc += a^T @ c`: a weight gradient `(out, in)` from `a (T, out)` and `c (T, in)`.
fn acc_weight_grad(b: &dyn Backend, acc: &mut Tensor, dy: &Tensor, x: &Tensor) -> Result<()> {
    b.matmul_acc(acc, dy, Transpose::Yes, x, Transpose::No, 1.0)?;
    Ok(())
}

/// Backward of one layer. Accumulates weight gradients into `g`; returns `dx (B, H)` and
/// adds the context gradient into `d_ctx` when there is context.
#[allow(clippy::too_many_arguments)]
pub fn backward(
    b: &dyn Backend,
    w: &LayerWeights,
    d: &LayerDims,
    x: &Tensor,
    ctx: Option<&Tensor>,
    geo: &AttnGeometry<'_>,
    c: &LayerCache,
    dy: &Tensor,
    g: &mut LayerWeights,
    d_ctx: Option<&mut Tensor>,
) -> Result<Tensor> {
    let d_h = mlp_backward(b, w, c, dy, g)?;
    let d_xn = attention_backward(b, w, d, ctx, geo, c, &d_h, g, d_ctx)?;
    let (dx_norm, d_in) = b.rms_norm_backward(&d_xn, x, &w.input_layernorm, &c.rstd_in)?;
    b.add_assign(&mut g.input_layernorm, &d_in)?;
    Ok(b.add(&d_h, &dx_norm)?)
}

/// Backward of the MLP half, `y = h + down(swiglu(gate(hn), up(hn)))` with `hn` the
/// post-attention norm of `h`: weight gradients into `g`; returns `d_h (B, H)`, the residual
/// path plus the MLP's.
fn mlp_backward(
    b: &dyn Backend,
    w: &LayerWeights,
    c: &LayerCache,
    dy: &Tensor,
    g: &mut LayerWeights,
) -> Result<Tensor> {
    acc_weight_grad(b, &mut g.down_proj, dy, &c.act)?;
    let d_act = b.matmul(dy, Transpose::No, &w.down_proj, Transpose::No)?; // (B, I)
    let (d_gate, d_up) = b.swiglu_backward(&d_act, &c.gate, &c.up)?;
    acc_weight_grad(b, &mut g.gate_proj, &d_gate, &c.hn)?;
    acc_weight_grad(b, &mut g.up_proj, &d_up, &c.hn)?;
    let mut d_hn = b.matmul(&d_gate, Transpose::No, &w.gate_proj, Transpose::No)?;
    b.matmul_acc(
        &mut d_hn,
        &d_up,
        Transpose::No,
        &w.up_proj,
        Transpose::No,
        1.0,
    )?;
    let (d_h_mlp, d_post) =
        b.rms_norm_backward(&d_hn, &c.h, &w.post_attention_layernorm, &c.rstd_post)?;
    b.add_assign(&mut g.post_attention_layernorm, &d_post)?;
    Ok(b.add(dy, &d_h_mlp)?) // (B, H): residual + MLP path
}

/// Backward of the attention half, `h = x + attn(xn) Wo^T` with `xn` the input norm of `x`:
/// weight gradients into `g`, the context rows' gradient into `d_ctx` when there is context;
/// returns `d_xn (B, H)` (the gradient at the input norm's output).
#[allow(clippy::too_many_arguments)]
fn attention_backward(
    b: &dyn Backend,
    w: &LayerWeights,
    d: &LayerDims,
    ctx: Option<&Tensor>,
    geo: &AttnGeometry<'_>,
    c: &LayerCache,
    d_h: &Tensor,
    g: &mut LayerWeights,
    d_ctx: Option<&mut Tensor>,
) -> Result<Tensor> {
    let rows = d_h.dims()[0];
    let (hd, qh, kvh) = (d.head_dim, d.q_heads, d.kv_heads);
    acc_weight_grad(b, &mut g.o_proj, d_h, &c.attn)?;
    let d_attn = b
        .matmul(d_h, Transpose::No, &w.o_proj, Transpose::No)?
        .reshape([rows, qh, hd])?;
    let attn = b.copy(&c.attn)?.reshape([rows, qh, hd])?;
    let (dq_rot, dk_all, dv_all) = b.attention_backward(
        &c.q_rot,
        &c.k_all,
        &c.v_all,
        &attn,
        &c.lse,
        &d_attn,
        geo.mask,
        d.scale(),
    )?;

    // Queries: rope, then per-head norm, then projection.
    let dq_n = b
        .rope_backward(&dq_rot, geo.pos_q, d.rope_theta)?
        .reshape([rows * qh, hd])?;
    let q_rows = b.copy(&c.q)?.reshape([rows * qh, hd])?;
    let (dq, dq_norm) = b.rms_norm_backward(&dq_n, &q_rows, &w.q_norm, &c.rstd_q)?;
    b.add_assign(&mut g.q_norm, &dq_norm)?;
    let dq = dq.reshape([rows, qh * hd])?;
    acc_weight_grad(b, &mut g.q_proj, &dq, &c.xn)?;
    let mut d_xn = b.matmul(&dq, Transpose::No, &w.q_proj, Transpose::No)?;

    // Keys and values: the block rows come after the context rows.
    let s = dk_all.dims()[0] - rows;
    let dk_blk = b.narrow_rows(&dk_all, s, rows)?;
    let dv_blk = b.narrow_rows(&dv_all, s, rows)?.reshape([rows, kvh * hd])?;
    let dk_b = key_backward(b, w, d, &dk_blk, geo.pos_q, &c.k_blk, &mut g.k_norm)?;
    acc_weight_grad(b, &mut g.k_proj, &dk_b, &c.xn)?;
    acc_weight_grad(b, &mut g.v_proj, &dv_blk, &c.xn)?;
    b.matmul_acc(
        &mut d_xn,
        &dk_b,
        Transpose::No,
        &w.k_proj,
        Transpose::No,
        1.0,
    )?;
    b.matmul_acc(
        &mut d_xn,
        &dv_blk,
        Transpose::No,
        &w.v_proj,
        Transpose::No,
        1.0,
    )?;

    if let (Some(ctx), Some(k_ctx), Some(d_ctx)) = (ctx, &c.k_ctx, d_ctx) {
        let dk_ctx = b.narrow_rows(&dk_all, 0, s)?;
        let dv_ctx = b.narrow_rows(&dv_all, 0, s)?.reshape([s, kvh * hd])?;
        let dk_c = key_backward(b, w, d, &dk_ctx, geo.pos_ctx, k_ctx, &mut g.k_norm)?;
        acc_weight_grad(b, &mut g.k_proj, &dk_c, ctx)?;
        acc_weight_grad(b, &mut g.v_proj, &dv_ctx, ctx)?;
        b.matmul_acc(d_ctx, &dk_c, Transpose::No, &w.k_proj, Transpose::No, 1.0)?;
        b.matmul_acc(d_ctx, &dv_ctx, Transpose::No, &w.v_proj, Transpose::No, 1.0)?;
    }
    Ok(d_xn)
}

/// Backward of the keys' rope and per-head norm for rows at positions `pos`: `dk_rot (n, Hkv,
/// D)` to the gradient at the key projection's output `(n, Hkv * D)`, given the pre-norm keys
/// and their rstd (`k_pre`); the norm's weight gradient into `g_knorm`.
fn key_backward(
    b: &dyn Backend,
    w: &LayerWeights,
    d: &LayerDims,
    dk_rot: &Tensor,
    pos: &[i32],
    (k_pre, rstd): &(Tensor, Tensor),
    g_knorm: &mut Tensor,
) -> Result<Tensor> {
    let (hd, kvh) = (d.head_dim, d.kv_heads);
    let n = dk_rot.dims()[0];
    let dk_n = b
        .rope_backward(dk_rot, pos, d.rope_theta)?
        .reshape([n * kvh, hd])?;
    let k_rows = b.copy(k_pre)?.reshape([n * kvh, hd])?;
    let (dk, dk_norm) = b.rms_norm_backward(&dk_n, &k_rows, &w.k_norm, rstd)?;
    b.add_assign(g_knorm, &dk_norm)?;
    Ok(dk.reshape([n, kvh * hd])?)
}
