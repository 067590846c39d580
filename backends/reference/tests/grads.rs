//! Hand-written backward ops against finite differences of their forward ops.
//!
//! Loss = `sum(out * cotangent)` in f64 with a random cotangent; 5-point stencil with
//! h = 1e-2 (truncation ~h^4 = 1e-8). The forward is f32, so each loss evaluation carries
//! ~sqrt(n) * 2^-24 * |out| of rounding noise, amplified by 1/(12h) * 18: with n <= 100
//! outputs of size ~1 that is ~1e-5 absolute, hence tolerances of 1e-4 absolute + 1e-3
//! relative: tight enough that any real formula error (O(1)) fails loudly.

mod common;

use common::*;
use dflash_core::{ActivationOps, NormOps, RopeOps};

const H: f32 = 1e-2;

#[test]
fn rms_norm_backward_vs_finite_differences() {
    let be = backend();
    let mut r = rng(21);
    let (rows, c, eps) = (3, 7, 1e-5f32);
    let x = rand_vec(&mut r, rows * c);
    let w = rand_vec(&mut r, c);
    let cot = rand_vec(&mut r, rows * c);
    let (_, rstd) = be
        .rms_norm(&up(&be, &x, &[rows, c]), &up(&be, &w, &[c]), eps)
        .unwrap();
    let (dx, dw) = be
        .rms_norm_backward(
            &up(&be, &cot, &[rows, c]),
            &up(&be, &x, &[rows, c]),
            &up(&be, &w, &[c]),
            &rstd,
        )
        .unwrap();
    fd_check(
        "rms_norm",
        &[x, w],
        &[Some(down(&be, &dx)), Some(down(&be, &dw))],
        H,
        &Tolerance::FD_GRAD,
        |ins| {
            let (y, _) = be
                .rms_norm(&up(&be, &ins[0], &[rows, c]), &up(&be, &ins[1], &[c]), eps)
                .unwrap();
            dot64(&down(&be, &y), &cot)
        },
    );
}

#[test]
fn rope_backward_vs_finite_differences() {
    let be = backend();
    let mut r = rng(22);
    let (t, heads, d, theta) = (3, 2, 8, 10_000.0f32);
    let pos = [5, 0, 77];
    let x = rand_vec(&mut r, t * heads * d);
    let cot = rand_vec(&mut r, t * heads * d);
    let dx = be
        .rope_backward(&up(&be, &cot, &[t, heads, d]), &pos, theta)
        .unwrap();
    fd_check(
        "rope",
        &[x],
        &[Some(down(&be, &dx))],
        H,
        &Tolerance::FD_GRAD,
        |ins| {
            let y = be
                .rope(&up(&be, &ins[0], &[t, heads, d]), &pos, theta)
                .unwrap();
            dot64(&down(&be, &y), &cot)
        },
    );
}

#[test]
fn swiglu_backward_vs_finite_differences() {
    let be = backend();
    let mut r = rng(23);
    let n = 24;
    let g: Vec<f32> = rand_vec(&mut r, n).iter().map(|v| v * 4.0).collect();
    let u = rand_vec(&mut r, n);
    let cot = rand_vec(&mut r, n);
    let (dg, du) = be
        .swiglu_backward(
            &up(&be, &cot, &[4, 6]),
            &up(&be, &g, &[4, 6]),
            &up(&be, &u, &[4, 6]),
        )
        .unwrap();
    fd_check(
        "swiglu",
        &[g, u],
        &[Some(down(&be, &dg)), Some(down(&be, &du))],
        H,
        &Tolerance::FD_GRAD,
        |ins| {
            let h = be
                .swiglu(&up(&be, &ins[0], &[4, 6]), &up(&be, &ins[1], &[4, 6]))
                .unwrap();
            dot64(&down(&be, &h), &cot)
        },
    );
}
