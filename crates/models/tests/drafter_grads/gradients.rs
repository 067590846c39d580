//! The backward against finite differences and the candle autodiff oracle; recomputation is
//! bit-identical and gradients accumulate.

use dflash_models::DrafterParams;

use crate::common::*;
use crate::support::{Problem, grads_of, input, problem, run_oracle};

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
