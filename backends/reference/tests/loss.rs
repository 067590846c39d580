//! Fused linear cross-entropy and chunked argmax against a naive full-logits transcription.

mod common;

use common::*;
use dflash_core::LossOps;

/// Full `(T, V)` logits in f64.
fn naive_logits(x: &[f32], w: &[f32], t: usize, h: usize, v: usize) -> Vec<f64> {
    let mut l = vec![0.0; t * v];
    for i in 0..t {
        for j in 0..v {
            l[i * v + j] = (0..h)
                .map(|c| x[i * h + c] as f64 * w[j * h + c] as f64)
                .sum();
        }
    }
    l
}

fn argmax(row: &[f64]) -> usize {
    let mut best = 0;
    for (i, &z) in row.iter().enumerate() {
        if z > row[best] {
            best = i;
        }
    }
    best
}

/// `(sum w*CE, sum w, correct, counted, dx)` by the textbook formulas.
fn naive_ce(
    x: &[f32],
    w: &[f32],
    labels: &[u32],
    wts: &[f32],
    gs: f64,
    h: usize,
    v: usize,
) -> (f64, f64, u64, u64, Vec<f64>) {
    let t = labels.len();
    let logits = naive_logits(x, w, t, h, v);
    let (mut loss, mut wsum, mut correct, mut counted) = (0.0, 0.0, 0, 0);
    let mut dx = vec![0.0; t * h];
    for i in 0..t {
        let wt = wts[i] as f64;
        if wt == 0.0 {
            continue;
        }
        let row = &logits[i * v..(i + 1) * v];
        let lab = labels[i] as usize;
        let lse = row.iter().map(|z| z.exp()).sum::<f64>().ln();
        loss += wt * (lse - row[lab]);
        wsum += wt;
        counted += 1;
        correct += (argmax(row) == lab) as u64;
        for j in 0..v {
            let g = gs * wt * ((row[j] - lse).exp() - if j == lab { 1.0 } else { 0.0 });
            for c in 0..h {
                dx[i * h + c] += g * w[j * h + c] as f64;
            }
        }
    }
    (loss, wsum, correct, counted, dx)
}

#[test]
fn fused_ce_matches_naive_over_several_chunks() {
    let be = backend();
    let mut r = rng(80);
    // 150 rows: with ~30% zero weights the active rows span two 64-row chunks and a tail.
    let (t, h, v) = (150, 16, 50);
    let x: Vec<f32> = rand_vec(&mut r, t * h).iter().map(|a| 2.0 * a).collect();
    let w = rand_vec(&mut r, v * h);
    let logits = naive_logits(&x, &w, t, h, v);
    let u = rand_vec(&mut r, 3 * t);
    let mut labels = Vec::new();
    let mut wts = Vec::new();
    for i in 0..t {
        // Half the labels are the true argmax so the accuracy count is exercised.
        let lab = if u[i] > 0.0 {
            argmax(&logits[i * v..(i + 1) * v]) as u32
        } else {
            ((u[t + i] + 1.0) * 0.5 * v as f32) as u32 % v as u32
        };
        labels.push(lab);
        wts.push(if u[2 * t + i] < -0.4 {
            0.0
        } else {
            (u[2 * t + i] + 1.0) * 0.7
        });
    }
    // Labels out of range are fine on skipped rows.
    let skipped = (0..t).find(|&i| wts[i] == 0.0).unwrap();
    labels[skipped] = v as u32 + 5;
    let gs = 0.37f32;
    let (stats, dx) = be
        .linear_cross_entropy(
            &up(&be, &x, &[t, h]),
            &up(&be, &w, &[v, h]),
            &labels,
            &wts,
            gs,
        )
        .unwrap();
    let (loss, wsum, correct, counted, dx_want) = naive_ce(&x, &w, &labels, &wts, gs as f64, h, v);
    // Logits come from an f32 sgemm (K = 16): ~1e-6 relative per logit, summed over ~100
    // rows of CE ~4: 1e-5 relative on the total.
    assert!(
        (stats.weighted_loss - loss).abs() <= 1e-5 * loss,
        "{} vs {loss}",
        stats.weighted_loss
    );
    assert!((stats.weight_sum - wsum).abs() <= 1e-9 * wsum);
    assert_eq!((stats.correct, stats.counted), (correct, counted));
    assert!(
        correct > 20 && counted < t as u64,
        "test data exercises both paths"
    );
    let dx_h = down(&be, &dx);
    // dlogits rounded to f32 then an f32 sgemm over V = 50: 1e-5 abs on O(0.1) values.
    assert_close(
        "fused ce dx",
        &dx_h,
        &dx_want,
        &Tolerance {
            atol: 1e-5,
            rtol: 1e-4,
            atol_unit: AtolUnit::Absolute,
            why: "dlogits rounded to f32 then an f32 sgemm over V = 50: 1e-5 abs on O(0.1) values.",
        },
    );
    for i in (0..t).filter(|&i| wts[i] == 0.0) {
        assert!(
            dx_h[i * h..(i + 1) * h].iter().all(|z| z.to_bits() == 0),
            "row {i} not +0.0"
        );
    }
}

#[test]
fn fused_ce_gradient_vs_finite_differences() {
    let be = backend();
    let mut r = rng(81);
    let (t, h, v) = (5, 4, 7);
    let x = rand_vec(&mut r, t * h);
    let w: Vec<f32> = rand_vec(&mut r, v * h).iter().map(|a| 2.0 * a).collect();
    let labels = [3u32, 0, 6, 6, 1];
    let wts = [0.5f32, 0.0, 1.0, 0.25, 2.0];
    let gs = 0.8f32;
    let ce = |x: &[f32]| {
        be.linear_cross_entropy(
            &up(&be, x, &[t, h]),
            &up(&be, &w, &[v, h]),
            &labels,
            &wts,
            gs,
        )
        .unwrap()
    };
    let dx = down(&be, &ce(&x).1);
    // The loss is f64 from f32 logits; 5-point stencil, h = 1e-2 (see grads.rs).
    fd_check(
        "fused ce",
        &[x],
        &[Some(dx)],
        1e-2,
        &Tolerance {
            atol: 1e-4,
            rtol: 1e-3,
            atol_unit: AtolUnit::Absolute,
            why: "The loss is f64 from f32 logits; 5-point stencil, h = 1e-2 (see grads.rs).",
        },
        |ins| gs as f64 * ce(&ins[0]).0.weighted_loss,
    );
}

#[test]
fn fused_ce_label_out_of_range_is_an_error() {
    let be = backend();
    let mut r = rng(82);
    let (x, w) = (rand_vec(&mut r, 3 * 4), rand_vec(&mut r, 6 * 4));
    let err = be
        .linear_cross_entropy(
            &up(&be, &x, &[3, 4]),
            &up(&be, &w, &[6, 4]),
            &[1, 6, 2],
            &[1.0, 0.5, 1.0],
            1.0,
        )
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("label 6") && err.contains("V = 6") && err.contains("row 1"),
        "{err}"
    );
    assert!(err.contains("linear_cross_entropy"), "{err}");
}

#[test]
fn linear_argmax_matches_naive_and_breaks_ties_low() {
    let be = backend();
    let mut r = rng(83);
    let (t, h, v) = (130, 8, 40);
    let x = rand_vec(&mut r, t * h);
    let mut w = rand_vec(&mut r, v * h);
    // Rows 30 and 9 of the head equal row 17: a tie always resolves to the lowest index.
    let row17 = w[17 * h..18 * h].to_vec();
    w[30 * h..31 * h].copy_from_slice(&row17);
    w[9 * h..10 * h].copy_from_slice(&row17);
    let got = be
        .linear_argmax(&up(&be, &x, &[t, h]), &up(&be, &w, &[v, h]))
        .unwrap();
    let logits = naive_logits(&x, &w, t, h, v);
    let want: Vec<u32> = (0..t)
        .map(|i| argmax(&logits[i * v..(i + 1) * v]) as u32)
        .collect();
    assert_eq!(got, want);
    assert!(!got.contains(&17) && !got.contains(&30), "ties go to 9");
    assert!(got.contains(&9), "seed should make row 9 win somewhere");
}

#[test]
fn fused_ce_is_bit_deterministic_across_thread_counts() {
    let mut r = rng(84);
    let (t, h, v) = (70, 8, 33);
    let x = rand_vec(&mut r, t * h);
    let w = rand_vec(&mut r, v * h);
    let labels: Vec<u32> = (0..t as u32).map(|i| (i * 7) % v as u32).collect();
    let wts: Vec<f32> = (0..t).map(|i| (i % 3) as f32 * 0.5).collect();
    let run = |threads| {
        let be = backend_threads(threads);
        let (s, dx) = be
            .linear_cross_entropy(
                &up(&be, &x, &[t, h]),
                &up(&be, &w, &[v, h]),
                &labels,
                &wts,
                1.0,
            )
            .unwrap();
        (s.weighted_loss.to_bits(), down(&be, &dx))
    };
    let (l1, d1) = run(1);
    for threads in [2, 3] {
        let (l, d) = run(threads);
        assert_eq!(l, l1);
        assert_bits_eq("dx", &d, &d1);
    }
}
