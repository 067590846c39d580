//! The candle-core autodiff oracle (f64, primitive ops only: candle-nn's fused softmax,
//! rms_norm and rope return no gradient).

use candle_core::{D, Device, Result, Tensor as CT, Var};
use dflash_config::DrafterConfig;
use dflash_models::DrafterParams;

pub struct Inputs<'a> {
    pub features: &'a [f32],
    pub embed: &'a [f32],
    pub lm_head: &'a [f32],
    pub vocab: usize,
    pub block_ids: &'a [u32],
    pub positions: &'a [i32],
    pub labels: &'a [u32],
    pub weights: &'a [f32],
    pub mask: &'a [Vec<bool>],
}

pub struct Output {
    pub loss: f64,
    /// `(B, V)` row-major.
    pub logits: Vec<f64>,
    /// One per parameter tensor, layout order.
    pub grads: Vec<Vec<f64>>,
}

fn f64s(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| v as f64).collect()
}

fn rms(x: &CT, w: &CT, eps: f64) -> Result<CT> {
    let r = x
        .sqr()?
        .mean_keepdim(D::Minus1)?
        .affine(1.0, eps)?
        .sqrt()?
        .recip()?;
    x.broadcast_mul(&r)?.broadcast_mul(w)
}

/// `x W^T`, HF linear without bias.
fn linear(x: &CT, w: &CT) -> Result<CT> {
    x.matmul(&w.t()?)
}

/// HF rotate-half RoPE on `x (T, n, D)`, angle `p * theta^(-2i/D)`.
fn rope(x: &CT, pos: &[i32], theta: f64) -> Result<CT> {
    let (t, _, d) = x.dims3()?;
    let half = d / 2;
    let (mut c, mut s) = (Vec::new(), Vec::new());
    for &p in pos {
        for i in 0..half {
            let ang = p as f64 * theta.powf(-((2 * i) as f64) / d as f64);
            c.push(ang.cos());
            s.push(ang.sin());
        }
    }
    let cos = CT::from_vec(c, (t, 1, half), &Device::Cpu)?;
    let sin = CT::from_vec(s, (t, 1, half), &Device::Cpu)?;
    let x1 = x.narrow(2, 0, half)?;
    let x2 = x.narrow(2, half, half)?;
    let y1 = (x1.broadcast_mul(&cos)? - x2.broadcast_mul(&sin)?)?;
    let y2 = (x2.broadcast_mul(&cos)? + x1.broadcast_mul(&sin)?)?;
    CT::cat(&[&y1, &y2], 2)
}

/// Projection, per-head RMSNorm, RoPE: `(T, H) -> (T, n, D)`.
fn head_proj(
    x: &CT,
    w: &CT,
    norm: &CT,
    n: usize,
    d: usize,
    pos: &[i32],
    cfg: &DrafterConfig,
) -> Result<CT> {
    let t = x.dims2()?.0;
    let y = linear(x, w)?.reshape((t, n, d))?;
    rope(&rms(&y, norm, cfg.rms_norm_eps)?, pos, cfg.rope_theta)
}

/// One drafter layer with KV injection. `p`: the 11 tensors in LAYER_TENSOR_NAMES order.
#[allow(clippy::too_many_arguments)]
fn layer(
    p: &[CT],
    x: &CT,
    ctx: &CT,
    pos_q: &[i32],
    pos_c: &[i32],
    bias: &CT,
    row_valid: &CT,
    group: &CT,
    cfg: &DrafterConfig,
) -> Result<CT> {
    let (hq, hkv, d) = (
        cfg.num_attention_heads,
        cfg.num_key_value_heads,
        cfg.head_dim,
    );
    let (b, s) = (x.dims2()?.0, ctx.dims2()?.0);
    let eps = cfg.rms_norm_eps;
    let xn = rms(x, &p[0], eps)?;
    let q = head_proj(&xn, &p[2], &p[6], hq, d, pos_q, cfg)?; // (B, hq, D)
    let kb = head_proj(&xn, &p[3], &p[7], hkv, d, pos_q, cfg)?; // (B, hkv, D)
    let kc = head_proj(ctx, &p[3], &p[7], hkv, d, pos_c, cfg)?; // (S, hkv, D)
    let vb = linear(&xn, &p[4])?.reshape((b, hkv, d))?;
    let vc = linear(ctx, &p[4])?.reshape((s, hkv, d))?;
    let k = CT::cat(&[&kc, &kb], 0)?; // (S+B, hkv, D): context keys first
    let v = CT::cat(&[&vc, &vb], 0)?;
    let qh = q.transpose(0, 1)?.contiguous()?; // (hq, B, D)
    let kh = k.transpose(0, 1)?.contiguous()?.index_select(group, 0)?; // (hq, S+B, D)
    let vh = v.transpose(0, 1)?.contiguous()?.index_select(group, 0)?;
    let scores = qh
        .matmul(&kh.transpose(1, 2)?.contiguous()?)?
        .affine((d as f64).powf(-0.5), 0.0)?; // (hq, B, S+B)
    let e = scores.broadcast_add(bias)?.exp()?;
    let probs = e.broadcast_div(&e.sum_keepdim(2)?)?;
    let attn = probs
        .matmul(&vh)? // (hq, B, D)
        .transpose(0, 1)?
        .contiguous()?
        .reshape((b, hq * d))?
        .broadcast_mul(row_valid)?;
    let h = (x + linear(&attn, &p[5])?)?;
    let hn = rms(&h, &p[1], eps)?;
    let gate = linear(&hn, &p[8])?;
    let up = linear(&hn, &p[9])?;
    let sigmoid = gate.neg()?.exp()?.affine(1.0, 1.0)?.recip()?;
    let act = ((&gate * &sigmoid)? * &up)?;
    h + linear(&act, &p[10])?
}

pub fn run(cfg: &DrafterConfig, host: &[Vec<f32>], inp: &Inputs<'_>) -> Result<Output> {
    let dev = &Device::Cpu;
    let (h, kh) = (
        cfg.hidden_size,
        cfg.hidden_size * cfg.target_layer_ids.len(),
    );
    let s = inp.features.len() / kh;
    let rows = inp.block_ids.len();
    let vars = DrafterParams::layout(cfg)
        .iter()
        .zip(host)
        .map(|((_, shape), data)| Var::from_vec(f64s(data), shape.as_slice(), dev))
        .collect::<Result<Vec<_>>>()?;
    let p: Vec<CT> = vars.iter().map(|v| v.as_tensor().clone()).collect();

    // Dense mask as an additive bias; rows that see nothing (padding blocks) get bias 0
    // and an output multiplier 0, i.e. attention output 0 without a 0/0.
    let mut bias = Vec::with_capacity(rows * (s + rows));
    let mut valid = Vec::with_capacity(rows);
    for row in inp.mask {
        let any = row.iter().any(|&m| m);
        valid.push(if any { 1.0 } else { 0.0 });
        bias.extend(row.iter().map(|&m| if m || !any { 0.0 } else { -1e30 }));
    }
    let bias = CT::from_vec(bias, (rows, s + rows), dev)?;
    let row_valid = CT::from_vec(valid, (rows, 1), dev)?;
    let g = cfg.num_attention_heads / cfg.num_key_value_heads;
    let group: Vec<u32> = (0..cfg.num_attention_heads)
        .map(|i| (i / g) as u32)
        .collect();
    let group = CT::from_vec(group, cfg.num_attention_heads, dev)?;
    let pos_c: Vec<i32> = (0..s as i32).collect();

    let feats = CT::from_vec(f64s(inp.features), (s, kh), dev)?;
    let ctx = rms(&linear(&feats, &p[0])?, &p[1], cfg.rms_norm_eps)?; // (S, H)
    let embed = CT::from_vec(f64s(inp.embed), (inp.vocab, h), dev)?;
    let ids = CT::from_vec(inp.block_ids.to_vec(), rows, dev)?;
    let mut x = embed.index_select(&ids, 0)?; // (B, H) noise embedding
    for l in 0..cfg.num_hidden_layers {
        let lp = &p[3 + 11 * l..3 + 11 * (l + 1)];
        x = layer(
            lp,
            &x,
            &ctx,
            inp.positions,
            &pos_c,
            &bias,
            &row_valid,
            &group,
            cfg,
        )?;
    }
    let out = rms(&x, &p[2], cfg.rms_norm_eps)?;
    let head = CT::from_vec(f64s(inp.lm_head), (inp.vocab, h), dev)?;
    let logits = linear(&out, &head)?; // (B, V)
    let lse = logits.exp()?.sum_keepdim(1)?.log()?;
    let labels = CT::from_vec(inp.labels.to_vec(), (rows, 1), dev)?;
    let picked = logits.gather(&labels, 1)?;
    let w = CT::from_vec(f64s(inp.weights), (rows, 1), dev)?;
    let loss = ((lse - picked)? * w)?.sum_all()?;
    let store = loss.backward()?;
    let grads = vars
        .iter()
        .map(|v| {
            store
                .get(v.as_tensor())
                .expect("every parameter reaches the loss")
                .flatten_all()?
                .to_vec1::<f64>()
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Output {
        loss: loss.to_scalar::<f64>()?,
        logits: logits.flatten_all()?.to_vec1::<f64>()?,
        grads,
    })
}
