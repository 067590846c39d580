//! RMSNorm, RoPE, SwiGLU, embedding and AdamW against the reference backend.
//!
//! Skips cleanly without CUDA; inputs, poisoning and the tolerance scheme: `common`.

mod common;

use rand::Rng;

use common::*;
use dflash_core::{
    ActivationOps, AdamWParams, EmbeddingOps, MemoryOps, NormOps, OptimizerOps, RopeOps,
};

// ---------------------------------------------------------------------------------------
// Activation modes: every test body below runs through both (ripgrep style: one body, each
// run named after its path). f32 activations (`CudaOptions::activations = F32`): f32 inputs,
// f32 outputs, `check`. bf16 activations: every input in f32 and in bf16, mixed included,
// against the reference on the same (bf16-rounded) values; outputs poisoned (bf16 NaN 0x7FC0)
// before the op writes them; `check_bf16`: the op's own f32 tolerance plus one bf16 rounding
// of the f32 result, 2^-8 of |ref|. Statistics and parameter gradients (rstd, dw) stay f32 at
// the f32 tolerances in both modes.

use dflash_backend_cuda::{CudaBackend, DType, GemmPrecision};
use dflash_core::Tensor;

struct ActMode {
    cu: CudaBackend,
    act: DType,
}

impl ActMode {
    /// The modes this machine can run (none without CUDA). No GEMM in these ops: the GEMM
    /// precision does not matter.
    fn all() -> Vec<ActMode> {
        [DType::F32, DType::Bf16]
            .into_iter()
            .filter_map(|act| cuda_act(GemmPrecision::Tf32, act).map(|cu| ActMode { cu, act }))
            .collect()
    }

    /// The input dtypes an op takes in this mode.
    fn inputs(&self) -> &'static [DType] {
        match self.act {
            DType::F32 => &[DType::F32],
            DType::Bf16 => &DTYPES,
        }
    }

    /// Checks an activation output: its dtype is the mode's, its values within `tol` (plus
    /// one bf16 rounding in the bf16 mode).
    fn check_act(&self, name: &str, got: &Tensor, want: &[f32], tol: &Tolerance) {
        let name = format!("[{} act] {name}", self.act.name());
        assert_dtype(&name, got, self.act);
        let g = down(&self.cu, got);
        match self.act {
            DType::F32 => assert_close(&name, &g, want, tol),
            DType::Bf16 => check_bf16(&name, &g, want, tol),
        };
    }
}

// ---------------------------------------------------------------------------------------
// RMSNorm

#[test]
fn norm_ops_match_reference() {
    let rf = reference();
    let mut r = rng(3);
    for mode in ActMode::all() {
        let cu = &mode.cu;
        // (rows, cols): odd widths, one wider than a block, the QK-norm shape (many short rows);
        // widths not divisible by 8 (the kernels' scalar path), a width past 32 vectors per
        // lane group (8200: one row per block, 288 threads), the widest row the vector path
        // holds (16384: 512 lanes), and wider ones (20000, 40000: the scalar path at 512 lanes).
        for &(rows, c) in &[
            (13, 24),
            (64, 4096),
            (3000, 64),
            (5, 1000),
            (1, 7),
            (37, 100),
            (1000, 128),
            (3, 8200),
            (2, 16384),
            (2, 20000),
            (2, 40000),
        ] {
            let eps = 1e-6f32;
            let x = rand_vec(&mut r, rows * c, 2.0);
            let w: Vec<f32> = rand_vec(&mut r, c, 0.5).iter().map(|v| 1.0 + v).collect();
            let dy = rand_vec(&mut r, rows * c, 1.0);
            let (wc, wr) = (up(cu, &w, &[c]), up(&rf, &w, &[c]));
            for &xd in mode.inputs() {
                let (xc, xv) = up_as(cu, &x, &[rows, c], xd);
                let xr = up(&rf, &xv, &[rows, c]);
                let (yc, rc) = cu.rms_norm(&xc, &wc, eps).unwrap();
                let (yr, rr) = rf.rms_norm(&xr, &wr, eps).unwrap();
                let why = "f32 row sums (up to C terms) vs f64";
                let tag = format!("({rows}x{c}, x {})", xd.name());
                mode.check_act(
                    &format!("rms_norm y {tag}"),
                    &yc,
                    &down(&rf, &yr),
                    &Tolerance {
                        atol: 1e-6,
                        rtol: 1e-5,
                        atol_unit: AtolUnit::MaxWant,
                        why,
                    },
                );
                assert_dtype("rms_norm rstd", &rc, DType::F32);
                assert_close(
                    &format!("rms_norm rstd {tag}"),
                    &down(cu, &rc),
                    &down(&rf, &rr),
                    &Tolerance {
                        atol: 0.0,
                        rtol: 1e-5,
                        atol_unit: AtolUnit::MaxWant,
                        why,
                    },
                );
                for &gd in mode.inputs() {
                    let (dyc, dyv) = up_as(cu, &dy, &[rows, c], gd);
                    let dyr = up(&rf, &dyv, &[rows, c]);
                    let (dxc, dwc) = cu.rms_norm_backward(&dyc, &xc, &wc, &rc).unwrap();
                    let (dxr, dwr) = rf.rms_norm_backward(&dyr, &xr, &wr, &rr).unwrap();
                    let tag = format!("({rows}x{c}, dy {}, x {})", gd.name(), xd.name());
                    mode.check_act(
                        &format!("rms_norm_backward dx {tag}"),
                        &dxc,
                        &down(&rf, &dxr),
                        &Tolerance {
                            atol: 1e-5,
                            rtol: 1e-4,
                            atol_unit: AtolUnit::MaxWant,
                            why: "f32 row dot + cancellation in dy*w - xhat*dot",
                        },
                    );
                    assert_dtype("rms_norm_backward dw", &dwc, DType::F32);
                    assert_close(
                        &format!("rms_norm_backward dw {tag}"),
                        &down(cu, &dwc),
                        &down(&rf, &dwr),
                        &Tolerance {
                            atol: 1e-5,
                            rtol: 1e-4,
                            atol_unit: AtolUnit::MaxWant,
                            why: "f32 column sums over R rows vs f64",
                        },
                    );
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// RoPE

/// Positions and masks are uploaded through a small content-keyed cache: arrays of equal
/// length but different values must never share a buffer, and a repeat must still be right
/// after other arrays went through. Exact: the same kernel on the same inputs.
#[test]
fn rope_positions_cache_never_serves_stale_values() {
    let Some(cu) = cuda() else { return };
    let mut r = rng(44);
    let (t, heads, d, theta) = (64, 2, 64, 10_000.0f32);
    let x = up(&cu, &rand_vec(&mut r, t * heads * d, 1.0), &[t, heads, d]);
    let pos: Vec<Vec<i32>> = (0..20)
        .map(|_| (0..t).map(|_| r.random_range(0..4096)).collect())
        .collect();
    let fresh: Vec<Vec<f32>> = pos
        .iter()
        .map(|p| down(&cu, &cu.rope(&x, p, theta).unwrap()))
        .collect();
    for i in [3, 0, 19, 7, 3, 18, 0] {
        let again = down(&cu, &cu.rope(&x, &pos[i], theta).unwrap());
        check_exact(
            &format!("rope with positions #{i} again"),
            &again,
            &fresh[i],
        );
        let other = (i + 1) % pos.len();
        assert_ne!(
            again, fresh[other],
            "positions #{i} and #{other} gave the same output"
        );
    }
}

#[test]
fn rope_ops_match_reference() {
    let rf = reference();
    let mut r = rng(4);
    for mode in ActMode::all() {
        let cu = &mode.cu;
        for &(t, heads, d, theta) in &[
            (11, 4, 8, 10_000.0f32),
            (300, 8, 128, 1_000_000.0),
            (40, 2, 64, 10_000.0),
            (17, 1, 256, 500_000.0),
            // D/2 not a multiple of 8 (the kernel's scalar path), odd head counts
            (9, 3, 20, 10_000.0),
            (5, 5, 16, 10_000.0),
        ] {
            // Positions up to ~8K (where an f32 angle would already be off by ~1e-3 rad).
            let positions: Vec<i32> = (0..t).map(|_| r.random_range(0..8192)).collect();
            let x = rand_vec(&mut r, t * heads * d, 1.0);
            for &xd in mode.inputs() {
                let (xc, xv) = up_as(cu, &x, &[t, heads, d], xd);
                let xr = up(&rf, &xv, &[t, heads, d]);
                let tag = format!("({t},{heads},{d}) theta {theta}, x {}", xd.name());
                mode.check_act(
                    &format!("rope {tag}"),
                    &cu.rope(&xc, &positions, theta).unwrap(),
                    &down(&rf, &rf.rope(&xr, &positions, theta).unwrap()),
                    &Tolerance {
                        atol: 1e-6,
                        rtol: 1e-5,
                        atol_unit: AtolUnit::MaxWant,
                        why: "same f64 angles rounded to f32; FMA contraction",
                    },
                );
                mode.check_act(
                    &format!("rope_backward {tag}"),
                    &cu.rope_backward(&xc, &positions, theta).unwrap(),
                    &down(&rf, &rf.rope_backward(&xr, &positions, theta).unwrap()),
                    &Tolerance {
                        atol: 1e-6,
                        rtol: 1e-5,
                        atol_unit: AtolUnit::MaxWant,
                        why: "as rope",
                    },
                );
            }
        }
        let e = cu
            .rope(&up(cu, &[0.1; 12], &[2, 2, 3]), &[0, 1], 1e4)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("D even") && e.contains("cuda:0"), "{e}");
    }
}

// ---------------------------------------------------------------------------------------
// SwiGLU

#[test]
fn activation_ops_match_reference() {
    let rf = reference();
    let mut r = rng(5);
    for mode in ActMode::all() {
        let cu = &mode.cu;
        let (t, i) = (333, 257);
        let s = [t, i];
        let g = rand_vec(&mut r, t * i, 8.0); // deep into both tails of the sigmoid
        let u = rand_vec(&mut r, t * i, 2.0);
        let dh = rand_vec(&mut r, t * i, 1.0);
        let why = "f32 expf (<= 2 ulp) vs f64";
        // (dh, g, u) dtypes: uniform and mixed (a mixed call widens its bf16 inputs exactly).
        let combos: &[(DType, DType, DType)] = match mode.act {
            DType::F32 => &[(DType::F32, DType::F32, DType::F32)],
            DType::Bf16 => &[
                (DType::F32, DType::F32, DType::F32),
                (DType::Bf16, DType::Bf16, DType::Bf16),
                (DType::Bf16, DType::F32, DType::Bf16),
                (DType::F32, DType::Bf16, DType::F32),
            ],
        };
        for &(dd, gd, ud) in combos {
            let (gc, gv) = up_as(cu, &g, &s, gd);
            let (uc, uv) = up_as(cu, &u, &s, ud);
            let (dc, dv) = up_as(cu, &dh, &s, dd);
            let (gr, ur, dr) = (up(&rf, &gv, &s), up(&rf, &uv, &s), up(&rf, &dv, &s));
            let tag = format!("g {}, u {}", gd.name(), ud.name());
            mode.check_act(
                &format!("swiglu ({tag})"),
                &cu.swiglu(&gc, &uc).unwrap(),
                &down(&rf, &rf.swiglu(&gr, &ur).unwrap()),
                &Tolerance {
                    atol: 1e-7,
                    rtol: 1e-5,
                    atol_unit: AtolUnit::MaxWant,
                    why,
                },
            );
            let (dgc, duc) = cu.swiglu_backward(&dc, &gc, &uc).unwrap();
            let (dgr, dur) = rf.swiglu_backward(&dr, &gr, &ur).unwrap();
            let tag = format!("dh {}, {tag}", dd.name());
            mode.check_act(
                &format!("swiglu_backward d_gate ({tag})"),
                &dgc,
                &down(&rf, &dgr),
                &Tolerance {
                    atol: 1e-7,
                    rtol: 1e-5,
                    atol_unit: AtolUnit::MaxWant,
                    why,
                },
            );
            mode.check_act(
                &format!("swiglu_backward d_up ({tag})"),
                &duc,
                &down(&rf, &dur),
                &Tolerance {
                    atol: 1e-7,
                    rtol: 1e-5,
                    atol_unit: AtolUnit::MaxWant,
                    why,
                },
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// Embedding

/// A gather, so bit-exact in both modes: f32 activations copy an f32 table; bf16 activations
/// copy a bf16 table and round an f32 one once (RNE, compared with the `half` crate's rounding
/// of the reference). Odd `H` puts rows of 2-byte elements at every alignment.
#[test]
fn embedding_ops_match_reference() {
    let rf = reference();
    let mut r = rng(6);
    for mode in ActMode::all() {
        let cu = &mode.cu;
        for (v, h) in [(1000, 96), (777, 97), (5, 1)] {
            let table = rand_vec(&mut r, v * h, 4.0);
            let ids: Vec<u32> = (0..517).map(|_| r.random_range(0..v as u32)).collect();
            for &td in mode.inputs() {
                let (tc, tv) = up_as(cu, &table, &[v, h], td);
                let tr = up(&rf, &tv, &[v, h]);
                let ec = cu.embedding(&tc, &ids).unwrap();
                assert_eq!(ec.dims(), &[ids.len(), h]);
                assert_dtype("embedding", &ec, mode.act);
                let want = down(&rf, &rf.embedding(&tr, &ids).unwrap());
                let want = match mode.act {
                    DType::F32 => want,
                    DType::Bf16 => bf16_rounded(&want),
                };
                check_exact(
                    &format!(
                        "[{} act] embedding ({v}, {h}), table {}",
                        mode.act.name(),
                        td.name()
                    ),
                    &down(cu, &ec),
                    &want,
                );
                let e1 = cu.embedding(&tc, &[3, v as u32]).err().unwrap().to_string();
                let e2 = rf.embedding(&tr, &[3, v as u32]).err().unwrap().to_string();
                assert_eq!(e1.replace("cuda:0", "cpu"), e2);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// AdamW

#[test]
fn optimizer_ops_match_reference() {
    let Some(cu) = cuda() else { return };
    let rf = reference();
    let mut r = rng(8);
    let n = 100_003;
    let p0 = rand_vec(&mut r, n, 1.0);
    let (mut pc, mut mc, mut vc) = (
        up(&cu, &p0, &[n]),
        cu.zeros(&[n]).unwrap(),
        cu.zeros(&[n]).unwrap(),
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
        cu.adamw_step(&mut pc, &up(&cu, &g, &[n]), &mut mc, &mut vc, &hp)
            .unwrap();
        rf.adamw_step(&mut pr, &up(&rf, &g, &[n]), &mut mr, &mut vr, &hp)
            .unwrap();
    }
    let tol = Tolerance {
        atol: 0.0,
        rtol: 1e-7,
        atol_unit: AtolUnit::MaxWant,
        why: "same f64 per-element formula, one f32 rounding per state",
    };
    assert_close(
        "adamw param after 5 steps",
        &down(&cu, &pc),
        &down(&rf, &pr),
        &tol,
    );
    assert_close("adamw m", &down(&cu, &mc), &down(&rf, &mr), &tol);
    assert_close("adamw v", &down(&cu, &vc), &down(&rf, &vr), &tol);
}

// ---------------------------------------------------------------------------------------
// bf16 inputs

/// `embedding` from a bf16 table (`to_compute_format` with bf16 GEMMs) is a pure gather and an
/// exact widening: bit-exact against the reference on the bf16-rounded table, f32 output.
/// Odd `H` puts rows of 2-byte elements at every alignment.
#[test]
fn embedding_bf16_table_matches_reference() {
    let Some(cu) = cuda_with(dflash_backend_cuda::GemmPrecision::Bf16) else {
        return;
    };
    let rf = reference();
    let mut r = rng(104);
    for (v, h) in [(1000, 96), (777, 97), (5, 1)] {
        let table = rand_vec(&mut r, v * h, 4.0);
        let tb = bf16_rounded(&table);
        assert!(table != tb);
        let ids: Vec<u32> = (0..517).map(|_| r.random_range(0..v as u32)).collect();
        let tc = cu.to_compute_format(up(&cu, &table, &[v, h])).unwrap();
        assert_eq!(dtype_of(&tc), dflash_backend_cuda::DType::Bf16);
        let tr = up(&rf, &tb, &[v, h]);
        let ec = cu.embedding(&tc, &ids).unwrap();
        assert_eq!(ec.dims(), &[ids.len(), h]);
        assert_eq!(dtype_of(&ec), dflash_backend_cuda::DType::F32);
        check_exact(
            &format!("embedding gather, bf16 table ({v}, {h})"),
            &down(&cu, &ec),
            &down(&rf, &rf.embedding(&tr, &ids).unwrap()),
        );
        let e1 = cu.embedding(&tc, &[3, v as u32]).err().unwrap().to_string();
        let e2 = rf.embedding(&tr, &[3, v as u32]).err().unwrap().to_string();
        assert_eq!(e1.replace("cuda:0", "cpu"), e2);
    }
}

/// Ops with no bf16 variant (AdamW: parameters, moments and gradients are f32 by design;
/// the statistics input `rstd` of `rms_norm_backward`) report a bf16 input by op name, dtype
/// and device instead of reading its bytes as f32. (RMSNorm, RoPE and SwiGLU took this test's
/// bf16 rejections before they gained bf16 inputs: see `bf16_activations_*` below.)
#[test]
fn f32_only_ops_reject_bf16() {
    let Some(cu) = cuda_with(dflash_backend_cuda::GemmPrecision::Bf16) else {
        return;
    };
    let mut r = rng(105);
    let (t, c) = (6, 16);
    let x = rand_vec(&mut r, t * c, 1.0);
    let w = rand_vec(&mut r, c, 1.0);
    let (xf, wf) = (up(&cu, &x, &[t, c]), up(&cu, &w, &[c]));
    let xb = cu.to_compute_format(up(&cu, &x, &[t, c])).unwrap();
    assert_eq!(dtype_of(&xb), dflash_backend_cuda::DType::Bf16);
    let (_, rstd) = cu.rms_norm(&xf, &wf, 1e-6).unwrap();
    let rstd_b = cu
        .to_dtype(&rstd, dflash_backend_cuda::DType::Bf16)
        .unwrap();
    assert_bf16_rejected(
        cu.rms_norm_backward(&xf, &xf, &wf, &rstd_b),
        "rms_norm_backward",
    );
    let hp = AdamWParams {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.0,
        step: 1,
        grad_scale: 1.0,
    };
    let (mut m, mut v) = (cu.zeros(&[t, c]).unwrap(), cu.zeros(&[t, c]).unwrap());
    let mut pb = cu.copy(&xb).unwrap();
    assert_bf16_rejected(cu.adamw_step(&mut pb, &xf, &mut m, &mut v, &hp), "adamw");
    let mut pf = cu.copy(&xf).unwrap();
    assert_bf16_rejected(cu.adamw_step(&mut pf, &xb, &mut m, &mut v, &hp), "adamw");
}
