//! RMSNorm, RoPE, SwiGLU, embedding and AdamW against the reference backend, each on the
//! adapter's bindings and on 4 KiB bindings (the chunked paths).
//!
//! Skips cleanly without an adapter; inputs, poisoning and tolerances: `common`.

mod common;

use rand::Rng;

use common::*;
use dflash_core::{
    ActivationOps, AdamWParams, EmbeddingOps, MemoryOps, NormOps, OptimizerOps, RopeOps,
};

#[test]
fn norm_ops_match_reference() {
    let rf = reference();
    let mut r = rng(3);
    for (label, be) in wgpu_reduction_variants() {
        // Odd widths, one wider than a workgroup, the QK-norm shape (many short rows), more
        // than 64 rows (several dw blocks), and a row wider than a 4 KiB binding's worth of
        // 64-row blocks would allow (only on full bindings).
        let shapes: &[(usize, usize)] = if label.starts_with("full bindings") {
            &[
                (13, 24),
                (64, 1000),
                (3000, 64),
                (1, 7),
                (37, 100),
                (130, 257),
                (2, 8200),
            ]
        } else {
            &[(13, 15), (300, 8), (1, 7), (129, 12)]
        };
        for &(rows, c) in shapes {
            let eps = 1e-6f32;
            let x = rand_vec(&mut r, rows * c, 2.0);
            let w: Vec<f32> = rand_vec(&mut r, c, 0.5).iter().map(|v| 1.0 + v).collect();
            let dy = rand_vec(&mut r, rows * c, 1.0);
            let (xw, ww, gw) = (
                up(&be, &x, &[rows, c]),
                up(&be, &w, &[c]),
                up(&be, &dy, &[rows, c]),
            );
            let (xr, wr, gr) = (
                up(&rf, &x, &[rows, c]),
                up(&rf, &w, &[c]),
                up(&rf, &dy, &[rows, c]),
            );
            let (yw, rw) = be.rms_norm(&xw, &ww, eps).unwrap();
            let (yr, rr) = rf.rms_norm(&xr, &wr, eps).unwrap();
            let why = "f32 row sums (up to C terms) vs f64";
            let tag = format!("[{label}] ({rows}x{c})");
            let tol = |atol, rtol, why| Tolerance {
                atol,
                rtol,
                atol_unit: AtolUnit::MaxWant,
                why,
            };
            assert_close(
                &format!("rms_norm y {tag}"),
                &down(&be, &yw),
                &down(&rf, &yr),
                &tol(1e-6, 1e-5, why),
            );
            assert_close(
                &format!("rms_norm rstd {tag}"),
                &down(&be, &rw),
                &down(&rf, &rr),
                &tol(0.0, 1e-5, why),
            );
            let (dxw, dww) = be.rms_norm_backward(&gw, &xw, &ww, &rw).unwrap();
            let (dxr, dwr) = rf.rms_norm_backward(&gr, &xr, &wr, &rr).unwrap();
            assert_close(
                &format!("rms_norm_backward dx {tag}"),
                &down(&be, &dxw),
                &down(&rf, &dxr),
                &tol(1e-5, 1e-4, "f32 row dot + cancellation in dy*w - xhat*dot"),
            );
            assert_close(
                &format!("rms_norm_backward dw {tag}"),
                &down(&be, &dww),
                &down(&rf, &dwr),
                &tol(1e-5, 1e-4, "f32 column sums over R rows vs f64"),
            );
        }
    }
}

#[test]
fn rope_ops_match_reference() {
    let rf = reference();
    let mut r = rng(4);
    let tol = Tolerance {
        atol: 1e-6,
        rtol: 1e-5,
        atol_unit: AtolUnit::MaxWant,
        why: "same f64 angles rounded to f32 (host tables); FMA contraction",
    };
    for (label, be) in wgpu_both() {
        for &(t, heads, d, theta) in &[
            (11, 4, 8, 10_000.0f32),
            (300, 8, 128, 1_000_000.0),
            (17, 1, 256, 500_000.0),
            (9, 3, 20, 10_000.0),
        ] {
            // Positions up to ~8K (where an f32 angle would already be off by ~1e-3 rad).
            let positions: Vec<i32> = (0..t).map(|_| r.random_range(0..8192)).collect();
            let x = rand_vec(&mut r, t * heads * d, 1.0);
            let (xw, xr) = (up(&be, &x, &[t, heads, d]), up(&rf, &x, &[t, heads, d]));
            let tag = format!("[{label}] ({t},{heads},{d}) theta {theta}");
            assert_close(
                &format!("rope {tag}"),
                &down(&be, &be.rope(&xw, &positions, theta).unwrap()),
                &down(&rf, &rf.rope(&xr, &positions, theta).unwrap()),
                &tol,
            );
            assert_close(
                &format!("rope_backward {tag}"),
                &down(&be, &be.rope_backward(&xw, &positions, theta).unwrap()),
                &down(&rf, &rf.rope_backward(&xr, &positions, theta).unwrap()),
                &tol,
            );
        }
        let bad = up(&be, &[0.1; 12], &[2, 2, 3]);
        let e = be.rope(&bad, &[0, 1], 1e4).err().unwrap().to_string();
        assert!(e.contains("D even") && e.contains("wgpu:0"), "{e}");
    }
}

/// Tables are cached by positions: arrays of equal length but different values must never
/// share one, and a repeat must still be right after others went through. Exact: the same
/// kernel on the same inputs.
#[test]
fn rope_table_cache_never_serves_stale_values() {
    let Some(be) = wgpu() else { return };
    let mut r = rng(44);
    let (t, heads, d, theta) = (32, 2, 16, 10_000.0f32);
    let x = up(&be, &rand_vec(&mut r, t * heads * d, 1.0), &[t, heads, d]);
    let pos: Vec<Vec<i32>> = (0..12)
        .map(|_| (0..t).map(|_| r.random_range(0..4096)).collect())
        .collect();
    let fresh: Vec<Vec<f32>> = pos
        .iter()
        .map(|p| down(&be, &be.rope(&x, p, theta).unwrap()))
        .collect();
    for i in [3, 0, 11, 7, 3, 10, 0] {
        let again = down(&be, &be.rope(&x, &pos[i], theta).unwrap());
        check_exact(
            &format!("rope with positions #{i} again"),
            &again,
            &fresh[i],
        );
        assert_ne!(again, fresh[(i + 1) % pos.len()]);
    }
}

#[test]
fn activation_ops_match_reference() {
    let rf = reference();
    let mut r = rng(5);
    let tol = Tolerance {
        atol: 1e-7,
        rtol: 1e-5,
        atol_unit: AtolUnit::MaxWant,
        why: "f32 exp (a few ulp) vs f64",
    };
    for (label, be) in wgpu_both() {
        let (t, i) = (333, 257);
        let s = [t, i];
        let g = rand_vec(&mut r, t * i, 8.0); // deep into both tails of the sigmoid
        let u = rand_vec(&mut r, t * i, 2.0);
        let dh = rand_vec(&mut r, t * i, 1.0);
        let (gw, uw, dw) = (up(&be, &g, &s), up(&be, &u, &s), up(&be, &dh, &s));
        let (gr, ur, dr) = (up(&rf, &g, &s), up(&rf, &u, &s), up(&rf, &dh, &s));
        assert_close(
            &format!("[{label}] swiglu"),
            &down(&be, &be.swiglu(&gw, &uw).unwrap()),
            &down(&rf, &rf.swiglu(&gr, &ur).unwrap()),
            &tol,
        );
        let (dgw, duw) = be.swiglu_backward(&dw, &gw, &uw).unwrap();
        let (dgr, dur) = rf.swiglu_backward(&dr, &gr, &ur).unwrap();
        assert_close(
            &format!("[{label}] swiglu_backward d_gate"),
            &down(&be, &dgw),
            &down(&rf, &dgr),
            &tol,
        );
        assert_close(
            &format!("[{label}] swiglu_backward d_up"),
            &down(&be, &duw),
            &down(&rf, &dur),
            &tol,
        );
        let e = be
            .swiglu(&gw, &up(&be, &[1.0; 3], &[3]))
            .err()
            .unwrap()
            .to_string();
        let want = rf
            .swiglu(&gr, &up(&rf, &[1.0; 3], &[3]))
            .err()
            .unwrap()
            .to_string();
        assert_eq!(e.replace("wgpu:0", "cpu"), want);
    }
}

/// A gather: bit-exact. Tables larger than a 4 KiB binding are walked in chunks.
#[test]
fn embedding_ops_match_reference() {
    let rf = reference();
    let mut r = rng(6);
    for (label, be) in wgpu_both() {
        for (v, h) in [(1000, 96), (777, 97), (5, 1)] {
            let table = rand_vec(&mut r, v * h, 4.0);
            let ids: Vec<u32> = (0..517).map(|_| r.random_range(0..v as u32)).collect();
            let (tw, tr) = (up(&be, &table, &[v, h]), up(&rf, &table, &[v, h]));
            let ew = be.embedding(&tw, &ids).unwrap();
            assert_eq!(ew.dims(), &[ids.len(), h]);
            check_exact(
                &format!("[{label}] embedding ({v}, {h})"),
                &down(&be, &ew),
                &down(&rf, &rf.embedding(&tr, &ids).unwrap()),
            );
            let e1 = be.embedding(&tw, &[3, v as u32]).err().unwrap().to_string();
            let e2 = rf.embedding(&tr, &[3, v as u32]).err().unwrap().to_string();
            assert_eq!(e1.replace("wgpu:0", "cpu"), e2);
        }
    }
}

#[test]
fn optimizer_ops_match_reference() {
    let rf = reference();
    let mut r = rng(8);
    for (label, be) in wgpu_both() {
        let n = 10_003;
        let p0 = rand_vec(&mut r, n, 1.0);
        let (mut pw, mut mw, mut vw) = (
            up(&be, &p0, &[n]),
            be.zeros(&[n]).unwrap(),
            be.zeros(&[n]).unwrap(),
        );
        let (mut pr, mut mr, mut vr) = (
            up(&rf, &p0, &[n]),
            rf.zeros(&[n]).unwrap(),
            rf.zeros(&[n]).unwrap(),
        );
        for step in 1..=5u64 {
            let g = rand_vec(&mut r, n, 0.1);
            let hp = AdamWParams {
                lr: 6e-4,
                beta1: 0.9,
                beta2: 0.95,
                eps: 1e-8,
                weight_decay: 0.1,
                step,
                grad_scale: 0.37 * step as f32,
            };
            be.adamw_step(&mut pw, &up(&be, &g, &[n]), &mut mw, &mut vw, &hp)
                .unwrap();
            rf.adamw_step(&mut pr, &up(&rf, &g, &[n]), &mut mr, &mut vr, &hp)
                .unwrap();
        }
        // f32 arithmetic per element (a few roundings per state per step) against one f64
        // evaluation rounded once: ~1e-7 of the state's magnitude.
        let tol = Tolerance {
            atol: 1e-6,
            rtol: 1e-5,
            atol_unit: AtolUnit::MaxWant,
            why: "f32 per-element AdamW vs f64, 5 steps",
        };
        assert_close(
            &format!("[{label}] adamw param after 5 steps"),
            &down(&be, &pw),
            &down(&rf, &pr),
            &tol,
        );
        assert_close(
            &format!("[{label}] adamw m"),
            &down(&be, &mw),
            &down(&rf, &mr),
            &tol,
        );
        assert_close(
            &format!("[{label}] adamw v"),
            &down(&be, &vw),
            &down(&rf, &vr),
            &tol,
        );
        let bad = AdamWParams {
            lr: 1e-3,
            beta1: 0.9,
            beta2: 0.99,
            eps: 1e-8,
            weight_decay: 0.0,
            step: 0,
            grad_scale: 1.0,
        };
        let g = be.zeros(&[n]).unwrap();
        let e = be
            .adamw_step(&mut pw, &g, &mut mw, &mut vw, &bad)
            .unwrap_err()
            .to_string();
        assert!(e.contains("1-based") && e.contains("wgpu:0"), "{e}");
    }
}

/// An f16 table (a frozen embedding in the compute format): the rows it holds, bit for bit
/// (widening is exact); odd `H` puts rows at odd f16 offsets. Ops that compute in f32 only
/// reject an f16 operand by name.
#[test]
fn embedding_f16_table_and_f32_only_ops() {
    let rf = reference();
    let mut r = rng(16);
    for (label, be) in wgpu_f16_both() {
        for (v, h) in [(1000, 96), (777, 97), (5, 1)] {
            let (tw, held) = up_f16(&be, &rand_vec(&mut r, v * h, 4.0), &[v, h]);
            let tr = up(&rf, &held, &[v, h]);
            let ids: Vec<u32> = (0..517).map(|_| r.random_range(0..v as u32)).collect();
            let ew = be.embedding(&tw, &ids).unwrap();
            assert_eq!(dtype(&ew), dflash_backend_wgpu::DType::F32);
            check_exact(
                &format!("[{label}] embedding, f16 table ({v}, {h})"),
                &down(&be, &ew),
                &down(&rf, &rf.embedding(&tr, &ids).unwrap()),
            );
            let e = be.embedding(&tw, &[3, v as u32]).err().unwrap().to_string();
            assert!(e.contains("out of range"), "{e}");
        }
        let (x, _) = up_f16(&be, &rand_vec(&mut r, 12, 1.0), &[3, 4]);
        let w = up(&be, &[1.0; 4], &[4]);
        let e = assert_err(
            be.rms_norm(&x, &w, 1e-6),
            &["rms_norm", "[3, 4]", "f16", "wgpu:0"],
        );
        println!("  {e}");
        assert_err(be.swiglu(&x, &x), &["swiglu", "f16", "wgpu:0"]);
    }
}
