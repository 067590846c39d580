//! The LR schedule's edges, the gradient norm and clipping inside AdamW's update.

use dflash_models::DrafterParams;
use dflash_training::optimizer::{AdamWHyper, clip_factor, grad_norm};
use dflash_training::{AdamW, LrSchedule};

use crate::support::{HYPER, backend, drafter_config};

#[test]
fn lr_schedule_edges() {
    // No warm-up: the first step is at the peak; cosine to the floor; clamped after the end.
    let s = LrSchedule::new(1e-3, 10, 0.0, 0.1);
    assert_eq!(s.warmup_steps, 0);
    assert_eq!(s.lr(0), 1e-3);
    assert!((s.lr(10) - 1e-4).abs() < 1e-15);
    assert_eq!(s.lr(25), s.lr(10), "past the end stays at the floor");
    assert!(
        (s.lr(5) - 5.5e-4).abs() < 1e-15,
        "half way is the mid-point of peak and floor"
    );
    for k in 0..12 {
        assert!(s.lr(k + 1) <= s.lr(k) && s.lr(k) >= 1e-4 - 1e-18);
    }
    assert!(
        s.lr(9) > 1e-4,
        "the last trained step is still above the floor"
    );

    // Half warm-up: linear from peak/W at step 0 to the peak at step W-1.
    let w = LrSchedule::new(2.0, 10, 0.5, 0.0);
    assert_eq!(w.warmup_steps, 5);
    for k in 0..5 {
        assert!((w.lr(k) - 2.0 * (k + 1) as f64 / 5.0).abs() < 1e-12);
    }
    assert_eq!(w.lr(5), 2.0);

    // Degenerate lengths stay finite.
    for total in [0, 1] {
        let d = LrSchedule::new(3e-4, total, 0.04, 0.0);
        assert_eq!(d.lr(0), 3e-4, "total {total}");
    }
    let all_warm = LrSchedule::new(1.0, 4, 1.0, 0.0);
    assert_eq!(all_warm.lr(3), 1.0);
    assert!(all_warm.lr(4).is_finite());
}

#[test]
fn grad_norm_and_clipping() {
    let b = backend("reference");
    let cfg = drafter_config(4);
    let mut grads = DrafterParams::zeros(b.as_ref(), &cfg).unwrap();
    let fc: Vec<f32> = (0..grads.fc.numel())
        .map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 1e-4)
        .collect();
    let norm_g: Vec<f32> = (0..cfg.hidden_size).map(|i| i as f32 * 0.01).collect();
    grads.fc = b
        .upload(&fc, &[cfg.hidden_size, 2 * cfg.hidden_size])
        .unwrap();
    grads.norm = b.upload(&norm_g, &[cfg.hidden_size]).unwrap();
    let expect = fc
        .iter()
        .chain(&norm_g)
        .map(|&x| (x as f64).powi(2))
        .sum::<f64>()
        .sqrt();
    let norm = grad_norm(b.as_ref(), &grads).unwrap();
    assert!((norm - expect).abs() <= 1e-9 * expect, "{norm} vs {expect}");

    // Below the limit, or clipping disabled (0): factor 1. Above: max / (norm + 1e-6)
    // (PyTorch's clip_grad_norm_).
    assert_eq!(clip_factor(norm, 2.0 * norm), 1.0);
    assert_eq!(clip_factor(norm, 0.0), 1.0);
    let max = norm / 4.0;
    let f = clip_factor(norm, max);
    assert_eq!(f, max / (norm + 1e-6));

    // The factor is applied inside AdamW's pass, without touching the gradients: the update
    // equals, bit for bit, one on gradients scaled beforehand (both round g * f to f32), and
    // the gradients scaled that way have the clipped norm.
    let snapshot = |g: &DrafterParams| -> Vec<Vec<f32>> {
        g.tensors().iter().map(|t| b.download(t).unwrap()).collect()
    };
    let before = snapshot(&grads);
    let params = |seed: u64| {
        let mut p = DrafterParams::zeros(b.as_ref(), &cfg).unwrap();
        for (i, t) in p.tensors_mut().into_iter().enumerate() {
            let n = t.numel();
            let v: Vec<f32> = (0..n)
                .map(|j| ((j * 31 + i * 17 + seed as usize) % 97) as f32 * 0.01 - 0.48)
                .collect();
            *t = b.upload(&v, t.dims()).unwrap();
        }
        p
    };
    let (mut fused, mut plain) = (params(3), params(3));
    let mut opt_fused = AdamW::new(b.as_ref(), &cfg, HYPER).unwrap();
    let mut opt_plain = AdamW::new(b.as_ref(), &cfg, HYPER).unwrap();
    opt_fused
        .update(b.as_ref(), &mut fused, &grads, 1e-2, f as f32)
        .unwrap();
    assert_eq!(snapshot(&grads), before, "grads are only read");
    let mut scaled = DrafterParams::zeros(b.as_ref(), &cfg).unwrap();
    for (s, g) in scaled.tensors_mut().into_iter().zip(grads.tensors()) {
        *s = b.copy(g).unwrap();
        b.scale_assign(s, f as f32).unwrap();
    }
    opt_plain
        .update(b.as_ref(), &mut plain, &scaled, 1e-2, 1.0)
        .unwrap();
    assert_eq!(snapshot(&fused), snapshot(&plain));
    assert_ne!(
        snapshot(&fused),
        snapshot(&params(3)),
        "the update moved something"
    );
    let after = grad_norm(b.as_ref(), &scaled).unwrap();
    assert!((after - max).abs() <= 1e-5 * max, "{after} vs {max}");
}

/// Weight decay shrinks the matrices only: with zero gradients one step scales every 2-D
/// weight by `1 - lr * wd` and leaves the 1-D ones (norm weights) as they were, as HF
/// Trainer's parameter groups do.
#[test]
fn weight_decay_spares_norm_weights() {
    let b = backend("reference");
    let cfg = drafter_config(4);
    let mut params = DrafterParams::init_random(b.as_ref(), &cfg, 0.02, 5).unwrap();
    let before: Vec<Vec<f32>> = params
        .tensors()
        .iter()
        .map(|t| b.download(t).unwrap())
        .collect();
    let grads = DrafterParams::zeros(b.as_ref(), &cfg).unwrap();
    let (lr, wd) = (1e-2f32, 0.1f32);
    let hyper = AdamWHyper {
        weight_decay: wd,
        ..HYPER
    };
    let mut opt = AdamW::new(b.as_ref(), &cfg, hyper).unwrap();
    opt.update(b.as_ref(), &mut params, &grads, lr, 1.0)
        .unwrap();
    let decay = 1.0 - lr as f64 * wd as f64;
    let layout = DrafterParams::layout(&cfg);
    let mut kinds = (0, 0);
    for (((name, shape), t), old) in layout.iter().zip(params.tensors()).zip(&before) {
        let new = b.download(t).unwrap();
        let expect: Vec<f32> = if shape.len() >= 2 {
            kinds.0 += 1;
            old.iter().map(|&x| (x as f64 * decay) as f32).collect()
        } else {
            kinds.1 += 1;
            old.clone()
        };
        assert!(new == expect, "{name} {shape:?}");
        assert!(
            old.iter().any(|&x| x != 0.0),
            "{name}: a zero tensor tests nothing"
        );
    }
    assert!(kinds.0 > 0 && kinds.1 > 0, "{kinds:?}");
}
