//! Forward ops against direct naive transcriptions in f64, on seeded random inputs.

mod common;

use common::*;
use dflash_core::{
    ActivationOps, AdamWParams, EmbeddingOps, GemmOps, MemoryOps, NormOps, OptimizerOps, RopeOps,
    Transpose,
};

/// `op(a) (M, K) @ op(b) (K, N)` by the triple loop, f64 (the shared op suite's oracle).
fn naive_matmul(
    a: &[f32],
    ta: bool,
    b: &[f32],
    tb: bool,
    m: usize,
    k: usize,
    n: usize,
) -> Vec<f64> {
    dflash_tests::ops::gemm::naive(a, ta, b, tb, (m, k, n)).0
}

#[test]
fn matmul_all_transpose_combos() {
    let be = backend();
    let mut r = rng(1);
    for &(m, k, n) in &[(7, 5, 3), (33, 65, 17), (1, 9, 1)] {
        for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
            let a = rand_vec(&mut r, m * k);
            let b = rand_vec(&mut r, k * n);
            let a_shape = if ta { [k, m] } else { [m, k] };
            let b_shape = if tb { [n, k] } else { [k, n] };
            let tr = |t: bool| if t { Transpose::Yes } else { Transpose::No };
            let c = be
                .matmul(
                    &up(&be, &a, &a_shape),
                    tr(ta),
                    &up(&be, &b, &b_shape),
                    tr(tb),
                )
                .unwrap();
            assert_eq!(c.dims(), &[m, n]);
            // f32 accumulation over K products of magnitude <= 1: error <= ~K * 2^-24 * K,
            // far below 1e-5 for K <= 65.
            let want = naive_matmul(&a, ta, &b, tb, m, k, n);
            assert_close(
                &format!("matmul {m}x{k}x{n} ta={ta} tb={tb}"),
                &down(&be, &c),
                &want,
                &Tolerance {
                    atol: 1e-5,
                    rtol: 1e-5,
                    atol_unit: AtolUnit::Absolute,
                    why: "f32 accumulation over K products of magnitude <= 1: error <= ~K * 2^-24 * K, far below 1e-5 for K <= 65.",
                },
            );
        }
    }
}

#[test]
fn matmul_folds_leading_dims_and_linear_is_x_wt() {
    let be = backend();
    let mut r = rng(2);
    let (x, w) = (rand_vec(&mut r, 2 * 3 * 8), rand_vec(&mut r, 5 * 8));
    let y = be
        .linear(&up(&be, &x, &[2, 3, 8]), &up(&be, &w, &[5, 8]))
        .unwrap();
    assert_eq!(y.dims(), &[6, 5]);
    // Same f32 accumulation bound as above (K = 8).
    assert_close(
        "linear",
        &down(&be, &y),
        &naive_matmul(&x, false, &w, true, 6, 8, 5),
        &Tolerance {
            atol: 1e-5,
            rtol: 1e-5,
            atol_unit: AtolUnit::Absolute,
            why: "f32 accumulation over K = 8 products of magnitude <= 1: far below 1e-5",
        },
    );
}

#[test]
fn matmul_acc_with_beta() {
    let be = backend();
    let mut r = rng(3);
    let (m, k, n) = (9, 14, 6);
    for (ta, tb, beta) in [
        (false, false, 1.0f32),
        (true, false, 0.5),
        (false, true, -2.0),
        (true, true, 1.0),
    ] {
        let a = rand_vec(&mut r, m * k);
        let b = rand_vec(&mut r, k * n);
        let c0 = rand_vec(&mut r, m * n);
        let mut c = up(&be, &c0, &[m, n]);
        let tr = |t: bool| if t { Transpose::Yes } else { Transpose::No };
        let a_t = up(&be, &a, &if ta { [k, m] } else { [m, k] });
        let b_t = up(&be, &b, &if tb { [n, k] } else { [k, n] });
        be.matmul_acc(&mut c, &a_t, tr(ta), &b_t, tr(tb), beta)
            .unwrap();
        let prod = naive_matmul(&a, ta, &b, tb, m, k, n);
        let want: Vec<f64> = prod
            .iter()
            .zip(&c0)
            .map(|(p, &c)| beta as f64 * c as f64 + p)
            .collect();
        // f32 accumulation of K = 14 products plus one scaled add: 1e-5 is generous.
        assert_close(
            &format!("matmul_acc beta={beta}"),
            &down(&be, &c),
            &want,
            &Tolerance {
                atol: 1e-5,
                rtol: 1e-5,
                atol_unit: AtolUnit::Absolute,
                why: "f32 accumulation of K = 14 products plus one scaled add: 1e-5 is generous.",
            },
        );
    }
    // beta = 0 must ignore c entirely, even NaN (it is never read).
    let a = rand_vec(&mut r, m * k);
    let b = rand_vec(&mut r, k * n);
    let mut c = up(&be, &vec![f32::NAN; m * n], &[m, n]);
    be.matmul_acc(
        &mut c,
        &up(&be, &a, &[m, k]),
        Transpose::No,
        &up(&be, &b, &[k, n]),
        Transpose::No,
        0.0,
    )
    .unwrap();
    assert_close(
        "matmul_acc beta=0",
        &down(&be, &c),
        &naive_matmul(&a, false, &b, false, m, k, n),
        &Tolerance {
            atol: 1e-5,
            rtol: 1e-5,
            atol_unit: AtolUnit::Absolute,
            why: "f32 accumulation of K products of magnitude <= 1: far below 1e-5",
        },
    );
}

#[test]
fn rms_norm_forward() {
    let be = backend();
    let mut r = rng(5);
    let (rows, c, eps) = (13, 24, 1e-6f32);
    let x = rand_vec(&mut r, rows * c);
    let w = rand_vec(&mut r, c);
    let (y, rstd) = be
        .rms_norm(&up(&be, &x, &[rows, c]), &up(&be, &w, &[c]), eps)
        .unwrap();
    let mut want_y = vec![0.0; rows * c];
    let mut want_r = vec![0.0; rows];
    for i in 0..rows {
        let row = &x[i * c..(i + 1) * c];
        let ms = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / c as f64;
        want_r[i] = 1.0 / (ms + eps as f64).sqrt();
        for j in 0..c {
            want_y[i * c + j] = row[j] as f64 * want_r[i] * w[j] as f64;
        }
    }
    // Computed in f64 and rounded once: a couple of f32 ulps (2^-23 relative).
    assert_close(
        "rms_norm y",
        &down(&be, &y),
        &want_y,
        &Tolerance {
            atol: 1e-7,
            rtol: 3e-7,
            atol_unit: AtolUnit::Absolute,
            why: "Computed in f64 and rounded once: a couple of f32 ulps (2^-23 relative).",
        },
    );
    assert_close(
        "rms_norm rstd",
        &down(&be, &rstd),
        &want_r,
        &Tolerance {
            atol: 0.0,
            rtol: 3e-7,
            atol_unit: AtolUnit::Absolute,
            why: "Computed in f64 and rounded once: a couple of f32 ulps (2^-23 relative).",
        },
    );
}

/// The rotation written as a complex product: `(x_i + i x_{i+D/2}) * e^{i p theta^(-2i/D)}`.
fn naive_rope(x: &[f32], pos: &[i32], heads: usize, d: usize, theta: f64, sign: f64) -> Vec<f64> {
    let half = d / 2;
    let mut y = vec![0.0; x.len()];
    for (t, &p) in pos.iter().enumerate() {
        for h in 0..heads {
            let base = (t * heads + h) * d;
            for i in 0..half {
                let angle = sign * p as f64 * (-(2.0 * i as f64 / d as f64) * theta.ln()).exp();
                let (zr, zi) = (x[base + i] as f64, x[base + i + half] as f64);
                let (er, ei) = (angle.cos(), angle.sin());
                y[base + i] = zr * er - zi * ei;
                y[base + i + half] = zr * ei + zi * er;
            }
        }
    }
    y
}

#[test]
fn rope_forward_and_inverse() {
    let be = backend();
    let mut r = rng(6);
    let (t, heads, d, theta) = (9, 3, 16, 1_000_000.0f32);
    let x = rand_vec(&mut r, t * heads * d);
    let pos = [0, 1, 2, 7, 100, 513, 4095, 32000, 3];
    let xt = up(&be, &x, &[t, heads, d]);
    let y = be.rope(&xt, &pos, theta).unwrap();
    // sin/cos rounded to f32 and two f32 products: ~3 ulps of values <= 1.4.
    let tol = 1e-6;
    assert_close(
        "rope",
        &down(&be, &y),
        &naive_rope(&x, &pos, heads, d, theta as f64, 1.0),
        &Tolerance {
            atol: tol,
            rtol: 0.0,
            atol_unit: AtolUnit::Absolute,
            why: "sin/cos rounded to f32 and two f32 products: ~3 ulps of values <= 1.4.",
        },
    );
    let back = be.rope_backward(&y, &pos, theta).unwrap();
    assert_close(
        "rope_backward(rope(x))",
        &down(&be, &back),
        &to_f64(&x),
        &Tolerance {
            atol: 2.0 * tol,
            rtol: 0.0,
            atol_unit: AtolUnit::Absolute,
            why: "two rotations, each sin/cos rounded to f32 and two f32 products: ~6 ulps",
        },
    );
    let dy = rand_vec(&mut r, t * heads * d);
    let dx = be
        .rope_backward(&up(&be, &dy, &[t, heads, d]), &pos, theta)
        .unwrap();
    assert_close(
        "rope_backward",
        &down(&be, &dx),
        &naive_rope(&dy, &pos, heads, d, theta as f64, -1.0),
        &Tolerance {
            atol: tol,
            rtol: 0.0,
            atol_unit: AtolUnit::Absolute,
            why: "sin/cos rounded to f32 and two f32 products: ~3 ulps of values <= 1.4",
        },
    );
}

#[test]
fn swiglu_forward() {
    let be = backend();
    let mut r = rng(7);
    let n = 5 * 11;
    let g: Vec<f32> = rand_vec(&mut r, n).iter().map(|v| v * 6.0).collect();
    let u = rand_vec(&mut r, n);
    let h = be
        .swiglu(&up(&be, &g, &[5, 11]), &up(&be, &u, &[5, 11]))
        .unwrap();
    let want: Vec<f64> = g
        .iter()
        .zip(&u)
        .map(|(&g, &u)| g as f64 / (1.0 + (-g as f64).exp()) * u as f64)
        .collect();
    // f64 evaluation rounded once.
    assert_close(
        "swiglu",
        &down(&be, &h),
        &want,
        &Tolerance {
            atol: 1e-7,
            rtol: 2e-7,
            atol_unit: AtolUnit::Absolute,
            why: "f64 evaluation rounded once.",
        },
    );
}

#[test]
fn embedding_gathers_rows() {
    let be = backend();
    let mut r = rng(8);
    let (v, h) = (11, 6);
    let table = rand_vec(&mut r, v * h);
    let ids = [3u32, 0, 10, 3, 7];
    let e = be.embedding(&up(&be, &table, &[v, h]), &ids).unwrap();
    assert_eq!(e.dims(), &[5, h]);
    let want: Vec<f32> = ids
        .iter()
        .flat_map(|&i| table[i as usize * h..(i as usize + 1) * h].to_vec())
        .collect();
    assert_bits_eq("embedding", &down(&be, &e), &want); // a copy: exact
}

#[test]
fn adamw_matches_scalar_loop_over_three_steps() {
    let be = backend();
    let mut r = rng(9);
    let n = 37;
    let p0 = rand_vec(&mut r, n);
    let (mut p, mut m, mut v) = (
        up(&be, &p0, &[n]),
        be.zeros(&[n]).unwrap(),
        be.zeros(&[n]).unwrap(),
    );
    let (mut sp, mut sm, mut sv) = (to_f64(&p0), vec![0.0f64; n], vec![0.0f64; n]);
    for step in 1..=3u64 {
        let g = rand_vec(&mut r, n);
        let hp = AdamWParams {
            lr: 1e-2,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
            step,
            // A clipping-like factor, applied to g in f32 as the formula below does.
            grad_scale: 0.6,
        };
        be.adamw_step(&mut p, &up(&be, &g, &[n]), &mut m, &mut v, &hp)
            .unwrap();
        // torch.optim.AdamW, written out per element in f64.
        let (lr, b1, b2) = (hp.lr as f64, hp.beta1 as f64, hp.beta2 as f64);
        for i in 0..n {
            let gi = (g[i] * hp.grad_scale) as f64;
            sp[i] -= lr * hp.weight_decay as f64 * sp[i];
            sm[i] = b1 * sm[i] + (1.0 - b1) * gi;
            sv[i] = b2 * sv[i] + (1.0 - b2) * gi.powi(2);
            let mhat = sm[i] / (1.0 - b1.powi(step as i32));
            let vhat = sv[i] / (1.0 - b2.powi(step as i32));
            sp[i] -= lr * mhat / (vhat.sqrt() + hp.eps as f64);
        }
        // The backend rounds p, m, v to f32 after each step; the loop keeps f64. Over three
        // steps that drifts by a few f32 ulps of the values (|p| <= ~1, updates ~1e-2).
        assert_close(
            &format!("adamw p step {step}"),
            &down(&be, &p),
            &sp,
            &Tolerance {
                atol: 1e-6,
                rtol: 1e-6,
                atol_unit: AtolUnit::Absolute,
                why: "The backend rounds p, m, v to f32 after each step; the loop keeps f64. Over three steps that drifts by a few f32 ulps of the values (|p| <= ~1, updates ~1e-2).",
            },
        );
        assert_close(
            &format!("adamw m step {step}"),
            &down(&be, &m),
            &sm,
            &Tolerance {
                atol: 1e-7,
                rtol: 1e-6,
                atol_unit: AtolUnit::Absolute,
                why: "f32 rounding after each AdamW step vs an f64 loop: a few f32 ulps over three steps",
            },
        );
        assert_close(
            &format!("adamw v step {step}"),
            &down(&be, &v),
            &sv,
            &Tolerance {
                atol: 1e-8,
                rtol: 1e-6,
                atol_unit: AtolUnit::Absolute,
                why: "f32 rounding after each AdamW step vs an f64 loop: a few f32 ulps over three steps",
            },
        );
    }
}
