//! Attention forward/backward against a dense f64 oracle built from
//! `BlockMask::to_dense_oracle()`, on DFlash (overlapping anchors, padding blocks), sliding
//! DFlash, causal, document and sliding-window masks, MHA and GQA, head_dim 8 and 16; plus
//! a finite-difference check of the backward and bit-determinism across thread counts.

mod common;

use common::*;
use dflash_backend_reference::ReferenceAttention;
use dflash_core::mask::{BlockMask, Interval};
use dflash_core::{AttentionOps, AttnDims, AttnForward, HostAttentionKernel};

/// Everything is f64 inside and rounded once to f32.
const FWD_TOL: Tolerance = Tolerance {
    atol: 1e-6,
    rtol: 1e-6,
    atol_unit: AtolUnit::Absolute,
    why: "everything is f64 inside and rounded once to f32: 2^-24 relative on values of O(1)",
};

/// The backward recomputes P from the f32 lse and uses the f32 forward output in D_i.
const GRAD_TOL: Tolerance = Tolerance {
    atol: 1e-5,
    rtol: 1e-5,
    atol_unit: AtolUnit::Absolute,
    why: "the backward recomputes P from the f32 lse (error ~|lse| * 2^-24) and uses the f32 forward output in D_i; accumulation is f64, so ~1e-6 relative on O(1) gradients",
};

/// Dense f64 attention: returns `(out, lse, dq, dk, dv)` for cotangent `d_out`.
#[allow(clippy::type_complexity)]
fn dense_oracle(
    dims: &AttnDims,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    d_out: &[f32],
    mask: &BlockMask,
    scale: f64,
) -> (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>) {
    let dense = mask.to_dense_oracle();
    let (tq, tk, hq, hkv, d) = (
        dims.q_rows,
        dims.kv_rows,
        dims.q_heads,
        dims.kv_heads,
        dims.head_dim,
    );
    let g = hq / hkv;
    let qv = |i: usize, h: usize, c: usize| q[(i * hq + h) * d + c] as f64;
    let kv = |x: &[f32], j: usize, h: usize, c: usize| x[(j * hkv + h / g) * d + c] as f64;
    let mut out = vec![0.0; tq * hq * d];
    let mut lse = vec![f64::NEG_INFINITY; tq * hq];
    let (mut dq, mut dk, mut dv) = (vec![0.0; q.len()], vec![0.0; k.len()], vec![0.0; v.len()]);
    for i in 0..tq {
        for h in 0..hq {
            let s: Vec<f64> = (0..tk)
                .map(|j| {
                    if dense[i][j] {
                        scale * (0..d).map(|c| qv(i, h, c) * kv(k, j, h, c)).sum::<f64>()
                    } else {
                        f64::NEG_INFINITY
                    }
                })
                .collect();
            if !dense[i].iter().any(|&b| b) {
                continue; // out 0, lse -inf, no gradient
            }
            let max = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = s.iter().map(|x| (x - max).exp()).sum();
            let l = max + sum.ln();
            lse[i * hq + h] = l;
            let p: Vec<f64> = s.iter().map(|x| (x - l).exp()).collect(); // 0 where masked
            let o = |c: usize| (0..tk).map(|j| p[j] * kv(v, j, h, c)).sum::<f64>();
            let orow: Vec<f64> = (0..d).map(o).collect();
            let dor = |c: usize| d_out[(i * hq + h) * d + c] as f64;
            let big_d: f64 = (0..d).map(|c| dor(c) * orow[c]).sum();
            for j in 0..tk {
                let dp: f64 = (0..d).map(|c| dor(c) * kv(v, j, h, c)).sum();
                let ds = p[j] * (dp - big_d);
                for c in 0..d {
                    dq[(i * hq + h) * d + c] += scale * ds * kv(k, j, h, c);
                    dk[(j * hkv + h / g) * d + c] += scale * ds * qv(i, h, c);
                    dv[(j * hkv + h / g) * d + c] += p[j] * dor(c);
                }
            }
            out[(i * hq + h) * d..][..d].copy_from_slice(&orow);
        }
    }
    (out, lse, dq, dk, dv)
}

/// Runs the backend's attention fwd/bwd on random inputs and compares with the oracle.
fn check_case(name: &str, mask: &BlockMask, hq: usize, hkv: usize, d: usize, seed: u64) {
    let be = backend();
    let mut r = rng(seed);
    let (tq, tk) = (mask.q_len(), mask.kv_len());
    let dims = AttnDims {
        q_rows: tq,
        kv_rows: tk,
        q_heads: hq,
        kv_heads: hkv,
        head_dim: d,
    };
    // Inputs in [-2, 2) so the softmax is far from uniform.
    let big = |r: &mut _, n| rand_vec(r, n).iter().map(|x| 2.0 * x).collect::<Vec<f32>>();
    let (q, k, v) = (
        big(&mut r, tq * hq * d),
        big(&mut r, tk * hkv * d),
        rand_vec(&mut r, tk * hkv * d),
    );
    let d_out = rand_vec(&mut r, tq * hq * d);
    let scale = (d as f32).powf(-0.5);
    let (qt, kt, vt) = (
        up(&be, &q, &[tq, hq, d]),
        up(&be, &k, &[tk, hkv, d]),
        up(&be, &v, &[tk, hkv, d]),
    );
    let (out, lse) = be.attention(&qt, &kt, &vt, mask, scale).unwrap();
    assert_eq!(lse.dims(), &[tq, hq]);
    let (o_w, l_w, dq_w, dk_w, dv_w) = dense_oracle(&dims, &q, &k, &v, &d_out, mask, scale as f64);
    let (out_h, lse_h) = (down(&be, &out), down(&be, &lse));
    assert_close(&format!("{name}: out"), &out_h, &o_w, &FWD_TOL);
    assert_close(&format!("{name}: lse"), &lse_h, &l_w, &FWD_TOL);
    // Rows with no visible key: out exactly 0 and lse -inf.
    for i in 0..tq {
        if mask.row(i).iter().all(|iv| iv.is_empty()) {
            for h in 0..hq {
                assert_eq!(lse_h[i * hq + h], f32::NEG_INFINITY, "{name}: lse row {i}");
                assert!(out_h[(i * hq + h) * d..][..d].iter().all(|&x| x == 0.0));
            }
        }
    }
    let (dq, dk, dv) = be
        .attention_backward(
            &qt,
            &kt,
            &vt,
            &out,
            &lse,
            &up(&be, &d_out, &[tq, hq, d]),
            mask,
            scale,
        )
        .unwrap();
    assert_close(&format!("{name}: dq"), &down(&be, &dq), &dq_w, &GRAD_TOL);
    assert_close(&format!("{name}: dk"), &down(&be, &dk), &dk_w, &GRAD_TOL);
    assert_close(&format!("{name}: dv"), &down(&be, &dv), &dv_w, &GRAD_TOL);
}

/// Context of 40 rows; anchors 3 and 5 overlap (closer than block size 4), 5 and 7 too,
/// two padding blocks (negative anchors), one anchor at the very end of the context.
fn dflash_mask() -> BlockMask {
    BlockMask::dflash(40, 4, &[0, 3, 5, 7, 20, 39, -1, -1]).unwrap()
}

#[test]
fn dflash_mask_mha_and_gqa() {
    let m = dflash_mask();
    for (hq, hkv) in [(2, 2), (4, 2), (4, 1)] {
        for d in [8, 16] {
            check_case(
                &format!("dflash hq={hq} hkv={hkv} d={d}"),
                &m,
                hq,
                hkv,
                d,
                100 + d as u64,
            );
        }
    }
}

#[test]
fn dflash_sliding_mask() {
    let m = BlockMask::dflash_sliding(40, 4, &[2, 3, 5, 30, -1], 6).unwrap();
    check_case("dflash_sliding", &m, 4, 2, 8, 31);
    check_case("dflash_sliding", &m, 4, 1, 16, 32);
}

#[test]
fn causal_document_and_sliding_masks() {
    let cases = [
        ("causal", BlockMask::causal(70).unwrap()), // > KEY_BLOCK keys: several dk/dv blocks
        ("document", BlockMask::document(&[5, 9, 1, 17]).unwrap()),
        ("sliding_window", BlockMask::sliding_window(30, 5).unwrap()),
    ];
    for (i, (name, m)) in cases.iter().enumerate() {
        check_case(name, m, 4, 2, 8, 40 + i as u64);
        check_case(name, m, 4, 1, 16, 50 + i as u64);
    }
}

#[test]
fn attention_backward_vs_finite_differences() {
    let be = backend();
    let mut r = rng(60);
    let mask = BlockMask::dflash(6, 3, &[2, 3, -1]).unwrap();
    let (tq, tk, hq, hkv, d) = (9, 15, 2, 1, 4);
    let q = rand_vec(&mut r, tq * hq * d);
    let k = rand_vec(&mut r, tk * hkv * d);
    let v = rand_vec(&mut r, tk * hkv * d);
    let cot = rand_vec(&mut r, tq * hq * d);
    let scale = 0.5f32;
    let fwd = |q: &[f32], k: &[f32], v: &[f32]| {
        be.attention(
            &up(&be, q, &[tq, hq, d]),
            &up(&be, k, &[tk, hkv, d]),
            &up(&be, v, &[tk, hkv, d]),
            &mask,
            scale,
        )
        .unwrap()
    };
    let (out, lse) = fwd(&q, &k, &v);
    let (dq, dk, dv) = be
        .attention_backward(
            &up(&be, &q, &[tq, hq, d]),
            &up(&be, &k, &[tk, hkv, d]),
            &up(&be, &v, &[tk, hkv, d]),
            &out,
            &lse,
            &up(&be, &cot, &[tq, hq, d]),
            &mask,
            scale,
        )
        .unwrap();
    // 5-point stencil, h = 1e-2; f32 forward noise ~1e-5 after amplification (see grads.rs).
    fd_check(
        "attention",
        &[q, k, v],
        &[
            Some(down(&be, &dq)),
            Some(down(&be, &dk)),
            Some(down(&be, &dv)),
        ],
        1e-2,
        &Tolerance::FD_GRAD,
        |ins| dot64(&down(&be, &fwd(&ins[0], &ins[1], &ins[2]).0), &cot),
    );
}

#[test]
fn attention_is_bit_deterministic_across_thread_counts() {
    let mask = dflash_mask();
    let (tq, tk, hq, hkv, d) = (mask.q_len(), mask.kv_len(), 4, 2, 8);
    let mut r = rng(70);
    let (q, k, v, dout) = (
        rand_vec(&mut r, tq * hq * d),
        rand_vec(&mut r, tk * hkv * d),
        rand_vec(&mut r, tk * hkv * d),
        rand_vec(&mut r, tq * hq * d),
    );
    let run = |threads| {
        let be = backend_threads(threads);
        let (qt, kt, vt) = (
            up(&be, &q, &[tq, hq, d]),
            up(&be, &k, &[tk, hkv, d]),
            up(&be, &v, &[tk, hkv, d]),
        );
        let (o, l) = be.attention(&qt, &kt, &vt, &mask, 0.3).unwrap();
        let (dq, dk, dv) = be
            .attention_backward(
                &qt,
                &kt,
                &vt,
                &o,
                &l,
                &up(&be, &dout, &[tq, hq, d]),
                &mask,
                0.3,
            )
            .unwrap();
        [&o, &l, &dq, &dk, &dv].map(|t| down(&be, t))
    };
    let base = run(1);
    for threads in [1, 2, 3] {
        for (a, b) in base.iter().zip(run(threads)) {
            assert_bits_eq(&format!("threads={threads}"), a, &b);
        }
    }
}

#[test]
fn kernel_rejects_wrong_slice_lengths() {
    let mask = BlockMask::causal(4).unwrap();
    let dims = AttnDims {
        q_rows: 4,
        kv_rows: 4,
        q_heads: 2,
        kv_heads: 1,
        head_dim: 8,
    };
    let (q, k) = (vec![0.5f32; 4 * 2 * 8], vec![0.5f32; 4 * 8]);
    let mut out = vec![0.0f32; 4 * 2 * 8];
    let mut lse = vec![0.0f32; 3]; // should be 8
    let err = AttnForward::new(&dims, &mask, 1.0, [&q, &k, &k], [&mut out, &mut lse])
        .and_then(|c| ReferenceAttention.forward(c))
        .unwrap_err();
    assert!(
        err.contains("lse has 3 elements, expected 8 = (Tq 4, Hq 2)"),
        "{err}"
    );
    // Dims whose buffer sizes overflow usize are an error naming the size, not a panic.
    let absurd = AttnDims {
        q_heads: usize::MAX / 2 + 1,
        kv_heads: 1,
        ..dims
    };
    let err = AttnForward::new(&absurd, &mask, 1.0, [&q, &k, &k], [&mut out, &mut lse])
        .and_then(|c| ReferenceAttention.forward(c))
        .unwrap_err();
    assert!(err.contains("overflows usize"), "{err}");
    let bad = AttnDims {
        kv_heads: 3,
        ..dims
    };
    let err = AttnForward::new(&bad, &mask, 1.0, [&q, &k, &k], [&mut out, &mut lse])
        .and_then(|c| ReferenceAttention.forward(c))
        .unwrap_err();
    assert!(err.contains("multiple"), "{err}");
}

/// Regression (NaN policy): scores past the f32 range made the f32 lse `+-inf` while `out`
/// stayed finite, and the backward's `exp(s - lse)` then gave silently zero (or infinite)
/// gradients. Such a row now comes out NaN (out and lse, hence dq); other rows are untouched.
#[test]
fn scores_past_f32_range_give_nan_rows_not_silent_gradients() {
    let (tq, hq, hkv, d) = (4, 2, 1, 8);
    let last = tq - 1;
    // Rows 0..3 causal; the last row sees only its own key, so no other row reads q or k of
    // the last row and the other rows' results must not change at all.
    let mut first: Vec<_> = (0..last as i32).map(|i| Interval::new(0, i + 1)).collect();
    first.push(Interval::new(last as i32, tq as i32));
    let mask = BlockMask::from_intervals(tq, first, vec![Interval::EMPTY; tq]).unwrap();
    let be = backend();
    let mut r = rng(91);
    let (q, k, v, dout) = (
        rand_vec(&mut r, tq * hq * d),
        rand_vec(&mut r, tq * hkv * d),
        rand_vec(&mut r, tq * hkv * d),
        rand_vec(&mut r, tq * hq * d),
    );
    let run = |q: &[f32], k: &[f32]| {
        let (qt, kt, vt) = (
            up(&be, q, &[tq, hq, d]),
            up(&be, k, &[tq, hkv, d]),
            up(&be, &v, &[tq, hkv, d]),
        );
        let (o, l) = be.attention(&qt, &kt, &vt, &mask, 0.35).unwrap();
        let rows = be.attention_rows(&qt, &kt, &vt, &mask, 0.35).unwrap();
        let dot = up(&be, &dout, &[tq, hq, d]);
        let (dq, _, _) = be
            .attention_backward(&qt, &kt, &vt, &o, &l, &dot, &mask, 0.35)
            .unwrap();
        [&o, &l, &rows, &dq].map(|t| down(&be, t))
    };
    let base = run(&q, &k);
    // q = 1e20 and k = +-1e20: scores +-0.35 * 8e40, past f32::MAX (3.4e38), so the f32 lse
    // would be +inf (all p = 0) or -inf (the empty row's marker, all p = inf).
    for sign in [1.0f32, -1.0] {
        let (mut q2, mut k2) = (q.clone(), k.clone());
        q2[last * hq * d..].fill(1e20);
        k2[last * hkv * d..].fill(sign * 1e20);
        let [o, l, rows, dq] = run(&q2, &k2);
        // Per-row element counts of out/dq and of lse.
        let (row, lrow) = (hq * d, hq);
        for (what, x, n) in [
            ("out", &o, row),
            ("lse", &l, lrow),
            ("attention_rows", &rows, row),
            ("dq", &dq, row),
        ] {
            assert!(
                x[last * n..].iter().all(|v| v.is_nan()),
                "sign {sign}: {what} of the overflowing row must be NaN: {:?}",
                &x[last * n..]
            );
        }
        // The other rows: bit-identical to the run without the huge row, hence finite.
        for (i, (what, n)) in [
            ("out", row),
            ("lse", lrow),
            ("attention_rows", row),
            ("dq", row),
        ]
        .into_iter()
        .enumerate()
        {
            let (got, want) = ([&o, &l, &rows, &dq][i], &base[i]);
            assert!(want[..last * n].iter().all(|v| v.is_finite()), "{what}");
            assert_bits_eq(
                &format!("sign {sign}: {what} rows 0..{last}"),
                &got[..last * n],
                &want[..last * n],
            );
        }
    }
}

/// Regression: a reversed interval (`start > end`, public fields) passed `from_intervals`
/// unnormalised and the kernel walked `start as usize..end as usize` out of bounds (a panic,
/// also inside the plugin's C entry). It is an empty interval now: that row sees nothing.
#[test]
fn reversed_intervals_are_empty_rows_not_out_of_bounds() {
    let (t, hq, d) = (3, 1, 8);
    let mask = BlockMask::from_intervals(
        t,
        vec![
            Interval::new(0, 1),
            Interval { start: 2, end: -1 },
            Interval::new(0, 3),
        ],
        vec![
            Interval::EMPTY,
            Interval {
                start: i32::MAX,
                end: 0,
            },
            Interval::EMPTY,
        ],
    )
    .unwrap();
    let be = backend();
    let mut r = rng(17);
    let x = [0; 3].map(|_| up(&be, &rand_vec(&mut r, t * hq * d), &[t, hq, d]));
    let (o, l) = be.attention(&x[0], &x[1], &x[2], &mask, 0.3).unwrap();
    let (o, l) = (down(&be, &o), down(&be, &l));
    assert_eq!(l[1], f32::NEG_INFINITY, "row 1 sees nothing");
    assert!(o[d..2 * d].iter().all(|&v| v == 0.0), "row 1 out is 0");
    assert!(l[0].is_finite() && l[2].is_finite());
}
