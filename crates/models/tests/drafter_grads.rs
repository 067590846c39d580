//! The DFlash drafter's hand-written backward and its loss, checked three independent ways
//! on a tiny random problem (hidden 16, 2 layers, 4 q / 2 kv heads, head_dim 8, MLP 24,
//! vocab 40, block 4, k = 2 target features, S = 11, anchors [2, 3, 9, -1]: two overlapping
//! blocks, one running past the end of the sequence, one padding block):
//!
//! - central finite differences of `Drafter::loss` on a random sample of every tensor;
//! - an independent autodiff oracle (candle-core, CPU, f64) transcribed from docs/design.md
//!   §2.1-2.3 with primitive ops only and a dense mask;
//! - a dense transcription of the §2.3 loss, weights, labels and accuracy.

mod common;

use std::sync::Arc;

use dflash_config::DrafterConfig;
use dflash_core::Backend;
use dflash_core::mask::BlockMask;
use dflash_data::{BlockTargets, block_targets, default_gamma};
use dflash_models::{DraftInput, Drafter, DrafterParams};
use rand::Rng;

use common::*;

/// Everything of one tiny drafter problem, host copies included.
struct Problem {
    b: Arc<dyn Backend>,
    cfg: DrafterConfig,
    frozen: Frozen,
    seq: Sequence,
    bt: BlockTargets,
    gamma: f32,
    drafter: Drafter,
    /// Parameters in `DrafterParams::layout` order.
    host: Vec<Vec<f32>>,
}

fn problem(seed: u64) -> Problem {
    let b = backend();
    let cfg = tiny_drafter_cfg();
    let params = random_params(b.as_ref(), &cfg, seed);
    let host = params
        .tensors()
        .iter()
        .map(|t| b.download(t).unwrap())
        .collect();
    let frozen = random_frozen(b.as_ref(), V, H, seed + 1);
    let seq = random_sequence(cfg.target_layer_ids.len(), seed + 2);
    let gamma = default_gamma(BS);
    let bt = block_targets(
        &seq.ids,
        &seq.loss_mask,
        &ANCHORS,
        BS,
        gamma,
        cfg.mask_token_id,
    );
    let drafter = Drafter::new(b.clone(), cfg.clone(), params, frozen.tensors.clone()).unwrap();
    Problem {
        b,
        cfg,
        frozen,
        seq,
        bt,
        gamma,
        drafter,
        host,
    }
}

fn input<'a>(seq: &'a Sequence, bt: &'a BlockTargets) -> DraftInput<'a> {
    DraftInput {
        features: (&seq.features).into(),
        anchors: &ANCHORS,
        block_ids: &bt.block_ids,
        positions: &bt.positions,
        labels: &bt.labels,
        weights: &bt.weights,
        doc_starts: &[],
        ctx_positions: &[],
    }
}

fn grads_of(p: &Problem, recompute: bool) -> Vec<Vec<f32>> {
    let mut g = DrafterParams::zeros(p.b.as_ref(), &p.cfg).unwrap();
    p.drafter
        .forward_backward(&input(&p.seq, &p.bt), 1.0, &mut g, recompute)
        .unwrap();
    g.tensors()
        .iter()
        .map(|t| p.b.download(t).unwrap())
        .collect()
}

// ---------------------------------------------------------------------------------------
// §2.3 transcribed directly (no dflash-data, no dflash-mask).

/// Labels, weights, block ids and positions of the blocks per docs/design.md §2.2-2.3. With
/// `shift = 1` the labels are the (buggy) next-position tokens `ids[a+k+1]`.
struct Spec {
    labels: Vec<u32>,
    weights: Vec<f32>,
    block_ids: Vec<u32>,
    positions: Vec<i32>,
}

fn spec_targets(seq: &Sequence, gamma: f32, shift: usize) -> Spec {
    let n = ANCHORS.len() * BS;
    let mut sp = Spec {
        labels: vec![0; n],
        weights: vec![0.0; n],
        block_ids: vec![MASK_ID; n],
        positions: vec![0; n],
    };
    for (blk, &a) in ANCHORS.iter().enumerate() {
        if a < 0 {
            continue; // padding block: all MASK, weight 0
        }
        let a = a as usize;
        sp.block_ids[blk * BS] = seq.ids[a];
        for k in 0..BS {
            let r = blk * BS + k;
            sp.positions[r] = (a + k) as i32;
            let p = a + k + shift;
            if p < S {
                sp.labels[r] = seq.ids[p]; // 0 past the end (weight 0 there anyway)
                if k > 0 && seq.loss_mask[a + k] == 1 {
                    sp.weights[r] = (-((k - 1) as f32) / gamma).exp();
                }
            }
        }
    }
    sp
}

/// The DFlash mask, densely, from the §2.3 rule: block n (anchor a_n) sees context rows with
/// position < a_n and every row of its own block; padding blocks see nothing.
fn spec_mask() -> Vec<Vec<bool>> {
    let rows = ANCHORS.len() * BS;
    (0..rows)
        .map(|r| {
            let (blk, a) = (r / BS, ANCHORS[r / BS]);
            (0..S + rows)
                .map(|key| {
                    a >= 0
                        && if key < S {
                            (key as i32) < a
                        } else {
                            (key - S) / BS == blk
                        }
                })
                .collect()
        })
        .collect()
}

/// `sum w * CE` over rows of `(B, V)` logits.
fn dense_weighted_ce(logits: &[f64], labels: &[u32], weights: &[f32]) -> f64 {
    logits
        .chunks(V)
        .zip(labels.iter().zip(weights))
        .filter(|(_, (_, w))| **w > 0.0)
        .map(|(row, (&lab, &w))| {
            let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let lse = m + row.iter().map(|z| (z - m).exp()).sum::<f64>().ln();
            w as f64 * (lse - row[lab as usize])
        })
        .sum()
}

/// `(argmax, top1 - top2 margin)` of a row.
fn argmax_margin(row: &[f64]) -> (usize, f64) {
    let mut idx: Vec<usize> = (0..row.len()).collect();
    idx.sort_by(|&i, &j| row[j].total_cmp(&row[i]));
    (idx[0], row[idx[0]] - row[idx[1]])
}

// ---------------------------------------------------------------------------------------
// The candle-core autodiff oracle (f64, primitive ops only: candle-nn's fused softmax,
// rms_norm and rope return no gradient).

mod oracle {
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
}

fn run_oracle(p: &Problem, labels: &[u32], weights: &[f32]) -> oracle::Output {
    let mask = BlockMask::dflash(S, BS, &ANCHORS)
        .unwrap()
        .to_dense_oracle();
    oracle::run(
        &p.cfg,
        &p.host,
        &oracle::Inputs {
            features: &p.seq.features,
            embed: &p.frozen.embed,
            lm_head: &p.frozen.lm_head,
            vocab: V,
            block_ids: &p.bt.block_ids,
            positions: &p.bt.positions,
            labels,
            weights,
            mask: &mask,
        },
    )
    .expect("the candle oracle runs")
}

// ---------------------------------------------------------------------------------------

/// The mask the drafter uses (and the oracle densifies) is exactly the §2.3 rule: by anchor
/// position (overlapping blocks 2 and 3 stay isolated), context strictly before the anchor,
/// padding blocks blind.
#[test]
fn mask_matches_the_position_rule() {
    let dense = BlockMask::dflash(S, BS, &ANCHORS)
        .unwrap()
        .to_dense_oracle();
    assert_eq!(dense, spec_mask());
    // Spot checks of the known bugs: the anchor's own feature is not visible ...
    assert!(
        !dense[0][2] && dense[0][1],
        "block at 2 sees context [0, 2)"
    );
    // ... and block 1 (anchor 3) sees its own rows only, not block 0's overlapping ones.
    assert!(dense[BS][S + BS] && !dense[BS][S] && dense[BS][2] && !dense[BS][3]);
}

/// `block_targets` produces exactly the §2.2-2.3 labels (same position), weights, noise ids
/// and positions, and those are what the drafter consumes.
#[test]
fn block_targets_follow_the_spec() {
    let p = problem(11);
    let sp = spec_targets(&p.seq, p.gamma, 0);
    assert_eq!(p.bt.labels, sp.labels);
    assert_eq!(p.bt.block_ids, sp.block_ids);
    assert_eq!(p.bt.positions, sp.positions);
    let same_weights = Tolerance {
        atol: 1e-7,
        rtol: 0.0,
        atol_unit: AtolUnit::Absolute,
        why: "the same gamma-decay weights computed in f32 by two transcriptions",
    };
    assert_close("block weights", &p.bt.weights, &sp.weights, &same_weights);
    // The problem is not degenerate: overlapping blocks, a hole, slots past the end.
    // Supervised slots: positions 3, 4 (block at 2; 5 is a hole), 4, 6 (block at 3), 10
    // (block at 9; 11 and 12 are past the end).
    assert_eq!(p.bt.weights.iter().filter(|&&w| w > 0.0).count(), 5);
    assert_eq!(
        p.bt.weights[2 * BS + 2],
        0.0,
        "slot at position 11 >= S has weight 0"
    );
}

/// `sum w*CE` with entry `i` of parameter tensor `ti` moved by `delta` (the tensor stays so).
fn perturbed_loss(p: &mut Problem, ti: usize, shape: &[usize], i: usize, delta: f32) -> f64 {
    let mut data = p.host[ti].clone();
    data[i] += delta;
    *p.drafter.params.tensors_mut()[ti] = p.b.upload(&data, shape).unwrap();
    p.drafter.loss(&input(&p.seq, &p.bt)).unwrap().weighted_loss
}

/// (a) Central finite differences (5-point stencil, h = 1e-2) of `sum w*CE` w.r.t. 10 random
/// entries of every parameter tensor vs `forward_backward`'s gradient.
///
/// Tolerance `|fd - g| <= 1e-2 |g| + 1e-3`: the model is f32, so each loss evaluation carries
/// rounding noise of ~1e-6 (loss ~20); the stencil divides differences by 12h = 0.12,
/// giving FD noise ~1e-4, and the stencil's truncation error is O(h^4) ~ 1e-8. A wrong or
/// missing backward path is off by O(|g|) (|g| here is typically 0.1..10).
#[test]
fn finite_differences_match_backward() {
    let mut p = problem(21);
    let grads = grads_of(&p, false);
    let layout = DrafterParams::layout(&p.cfg);
    let mut r = rng(22);
    let h = 1e-2f32;
    let (mut worst_abs, mut worst_ratio) = (0.0f64, 0.0f64);
    for (ti, (name, shape)) in layout.iter().enumerate() {
        let n = p.host[ti].len();
        let g_norm: f64 = grads[ti]
            .iter()
            .map(|&g| (g as f64).powi(2))
            .sum::<f64>()
            .sqrt();
        assert!(g_norm > 1e-6, "{name}: gradient is identically zero");
        let picks = rand::seq::index::sample(&mut r, n, 10.min(n));
        for i in picks.iter() {
            let mut loss_at = |delta: f32| perturbed_loss(&mut p, ti, shape, i, delta);
            let (l2, l1, m1, m2) = (loss_at(2.0 * h), loss_at(h), loss_at(-h), loss_at(-2.0 * h));
            loss_at(0.0); // restore
            let fd = (-l2 + 8.0 * l1 - 8.0 * m1 + m2) / (12.0 * h as f64);
            let g = grads[ti][i] as f64;
            let err = (fd - g).abs();
            let ratio = err / (1e-2 * g.abs() + 1e-3);
            worst_abs = worst_abs.max(err);
            worst_ratio = worst_ratio.max(ratio);
            assert!(
                ratio <= 1.0,
                "{name}[{i}]: backward {g:.6e}, finite difference {fd:.6e}"
            );
        }
    }
    eprintln!(
        "finite differences: max abs error {worst_abs:.3e}, max ratio to tolerance {worst_ratio:.3}"
    );
}

/// (b) Recomputation changes memory, not math: bit-identical gradients and stats. Gradients
/// accumulate: a second call with grad_scale 0.5 on the same buffers gives 1.5x.
#[test]
fn recompute_is_bit_identical_and_grads_accumulate() {
    let p = problem(31);
    let inp = input(&p.seq, &p.bt);
    let mut g_keep = DrafterParams::zeros(p.b.as_ref(), &p.cfg).unwrap();
    let mut g_rec = DrafterParams::zeros(p.b.as_ref(), &p.cfg).unwrap();
    let s_keep = p
        .drafter
        .forward_backward(&inp, 1.0, &mut g_keep, false)
        .unwrap();
    let s_rec = p
        .drafter
        .forward_backward(&inp, 1.0, &mut g_rec, true)
        .unwrap();
    assert_eq!(s_keep, s_rec);
    let names = DrafterParams::layout(&p.cfg);
    let once: Vec<Vec<f32>> = g_keep
        .tensors()
        .iter()
        .map(|t| p.b.download(t).unwrap())
        .collect();
    for ((name, _), (a, c)) in names
        .iter()
        .zip(g_keep.tensors().iter().zip(g_rec.tensors()))
    {
        let (a, c) = (p.b.download(a).unwrap(), p.b.download(c).unwrap());
        let same = a.iter().zip(&c).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same, "{name}: recompute=true differs from recompute=false");
    }
    // Loss stats equal the forward-only loss.
    let s_fwd = p.drafter.loss(&inp).unwrap();
    assert_eq!(s_fwd, s_keep);

    p.drafter
        .forward_backward(&inp, 0.5, &mut g_keep, true)
        .unwrap();
    for ((name, _), (t, g1)) in names.iter().zip(g_keep.tensors().iter().zip(&once)) {
        let g15: Vec<f32> = g1.iter().map(|g| 1.5 * g).collect();
        let accumulated = Tolerance {
            atol: 1e-7,
            rtol: 1e-5,
            atol_unit: AtolUnit::Absolute,
            why: "g + 0.5 g accumulated in f32 vs 1.5 g: one or two f32 roundings",
        };
        let got = p.b.download(t).unwrap();
        assert_close(
            &format!("{name}: accumulated gradient"),
            &got,
            &g15,
            &accumulated,
        );
    }
}

/// (c) The candle-core f64 autodiff oracle: loss and every parameter gradient.
///
/// Tolerance per tensor: `max |ours - oracle| <= 1e-4 max |oracle| + 1e-7`. Ours stores
/// activations in f32 (relative rounding ~6e-8 per op, a few dozen ops deep) while the oracle
/// is f64 throughout, so agreement is ~1e-6 relative; 1e-4 leaves margin but catches any
/// missing term (a wrong path moves a gradient by O(its size)).
#[test]
fn candle_autodiff_oracle_matches_loss_and_every_gradient() {
    let p = problem(41);
    let ours = grads_of(&p, false);
    let stats = p.drafter.loss(&input(&p.seq, &p.bt)).unwrap();
    let o = run_oracle(&p, &p.bt.labels, &p.bt.weights);
    let loss_rel = (stats.weighted_loss - o.loss).abs() / o.loss.abs();
    assert!(
        loss_rel <= 1e-5,
        "loss {} vs oracle {} (rel {loss_rel:e})",
        stats.weighted_loss,
        o.loss
    );
    let mut worst = 0.0f64;
    for ((name, _), (g, og)) in DrafterParams::layout(&p.cfg)
        .iter()
        .zip(ours.iter().zip(&o.grads))
    {
        assert_eq!(g.len(), og.len(), "{name}");
        let scale = og.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        assert!(
            scale > 1e-6,
            "{name}: oracle gradient is zero, the check would be vacuous"
        );
        let err = g
            .iter()
            .zip(og)
            .fold(0.0f64, |m, (&a, &b)| m.max((a as f64 - b).abs()));
        let rel = err / scale;
        worst = worst.max(rel);
        assert!(
            err <= 1e-4 * scale + 1e-7,
            "{name}: max |ours - oracle| = {err:.3e} (oracle max {scale:.3e}, rel {rel:.2e})"
        );
    }
    eprintln!(
        "candle oracle: loss rel error {loss_rel:.3e}, worst gradient error / max|g| {worst:.3e}"
    );
}

/// (d) `LossStats` against the §2.3 transcription: weight sum from the formula, weighted CE
/// and accuracy from dense (oracle, f64) logits with same-position labels; greedy
/// predictions equal the dense argmax. Then accuracy with labels set to the argmax on half
/// the supervised rows, so `correct` is checked at a non-trivial value.
#[test]
fn loss_accuracy_and_weight_sum_match_dense_transcription() {
    let p = problem(51);
    let sp = spec_targets(&p.seq, p.gamma, 0);
    let inp = input(&p.seq, &p.bt);
    let stats = p.drafter.loss(&inp).unwrap();
    let o = run_oracle(&p, &sp.labels, &sp.weights);

    let wsum: f64 = sp.weights.iter().map(|&w| w as f64).sum();
    assert!(
        (stats.weight_sum - wsum).abs() <= 1e-6,
        "{} vs {wsum}",
        stats.weight_sum
    );
    let want = dense_weighted_ce(&o.logits, &sp.labels, &sp.weights);
    let rel = (stats.weighted_loss - want).abs() / want;
    assert!(
        rel <= 1e-5,
        "weighted loss {} vs dense {want} (rel {rel:e})",
        stats.weighted_loss
    );
    let loss_rel = (stats.loss() - want / wsum).abs() / (want / wsum);
    assert!(loss_rel <= 1e-5);

    // Greedy predictions of every non-padding row equal the dense argmax (margins are wide
    // on a random model; rows closer than 1e-3 to a tie are not compared).
    let pred = p.drafter.predict(&inp).unwrap();
    for (r, row) in o.logits.chunks(V).enumerate().take(3 * BS) {
        let (am, margin) = argmax_margin(row);
        if margin > 1e-3 {
            assert_eq!(pred[r] as usize, am, "row {r}");
        }
    }

    // Accuracy: rows with w > 0 whose argmax is the label.
    let supervised: Vec<usize> = (0..sp.weights.len())
        .filter(|&r| sp.weights[r] > 0.0)
        .collect();
    assert_eq!(stats.counted as usize, supervised.len());
    let mut labels = sp.labels.clone();
    let mut rr = rng(52);
    for &r in &supervised {
        if rr.random_bool(0.5) {
            labels[r] = argmax_margin(&o.logits[r * V..(r + 1) * V]).0 as u32;
        }
    }
    let (mut expect, mut ambiguous) = (0i64, 0i64);
    for &r in &supervised {
        let (am, margin) = argmax_margin(&o.logits[r * V..(r + 1) * V]);
        expect += (am as u32 == labels[r]) as i64;
        ambiguous += (margin <= 1e-3) as i64;
    }
    assert!(expect > 0, "the accuracy check needs some correct rows");
    let s2 = p
        .drafter
        .loss(&DraftInput {
            labels: &labels,
            ..inp
        })
        .unwrap();
    assert!(
        (s2.correct as i64 - expect).abs() <= ambiguous,
        "correct {} vs dense {expect} ({ambiguous} near-ties)",
        s2.correct
    );
    assert_eq!(s2.counted, stats.counted);
    eprintln!(
        "dense transcription: weighted loss rel error {rel:.3e}, accuracy {}/{}",
        s2.correct, s2.counted
    );
}

/// (e) Regression "labels shifted by one": the drafter's loss equals the dense §2.3 loss with
/// same-position labels (`ids[a+k]`) and clearly differs from the shifted one (`ids[a+k+1]`).
#[test]
fn labels_are_same_position_not_shifted() {
    let p = problem(61);
    let same = spec_targets(&p.seq, p.gamma, 0);
    let shifted = spec_targets(&p.seq, p.gamma, 1);
    assert_ne!(same.labels, shifted.labels);
    // block_targets' labels (what the drafter consumes) are the same-position ones.
    assert_eq!(p.bt.labels, same.labels);
    for (blk, &a) in ANCHORS.iter().enumerate().filter(|(_, a)| **a >= 0) {
        for k in 1..BS {
            let pos = a as usize + k;
            if pos < S {
                assert_eq!(
                    p.bt.labels[blk * BS + k],
                    p.seq.ids[pos],
                    "block {blk} slot {k}"
                );
            }
        }
    }
    let stats = p.drafter.loss(&input(&p.seq, &p.bt)).unwrap();
    let o = run_oracle(&p, &same.labels, &same.weights);
    let l_same = dense_weighted_ce(&o.logits, &same.labels, &same.weights);
    let l_shift = dense_weighted_ce(&o.logits, &shifted.labels, &shifted.weights);
    assert!((stats.weighted_loss - l_same).abs() <= 1e-5 * l_same);
    assert!(
        (stats.weighted_loss - l_shift).abs() > 0.05 * l_same,
        "same-position {l_same} and shifted {l_shift} losses are too close to tell apart"
    );
}
