//! Attention ("cuda-simple" and the bf16 "cuda-flash") through the shared attention suite of
//! `dflash-tests` (its masks on each kernel's layouts, against the dense f64 oracle), plus the
//! CUDA-specific checks: the persistent forward capped at 3 CTAs, clean errors for unsupported
//! head dims, bf16 inputs and bf16 activations.
//!
//! Skips cleanly without CUDA; inputs, poisoning and the tolerance scheme: `common`.

mod common;

use common::*;
use dflash_backend_cuda::{CudaBackend, GemmPrecision, key_query_runs};
use dflash_core::mask::BlockMask;
use dflash_core::registry::BackendOptions;
use dflash_core::{AttentionOps, Backend, BackendInfo};
use dflash_tests::{
    AttentionChecks, BF16_KERNEL, Case, F32_KERNEL, Layout, cases_on, check_backend_attention,
    large_score_cases,
};

// ---------------------------------------------------------------------------------------
// The shared attention suite (dflash-tests): cases, inputs, oracle and comparison are the
// host kernels'; only the layouts (head dims a kernel supports) and the bounds differ.

/// cuda-simple's layouts (q heads, kv heads, head_dim): any head_dim up to its limit.
const SIMPLE_LAYOUTS: [Layout; 5] = [
    Layout::new(4, 2, 64),
    Layout::new(8, 2, 128),
    Layout::new(2, 1, 256),
    Layout::new(3, 3, 8),
    Layout::new(4, 1, 40),
];

/// cuda-flash's layouts: head_dim 64, 128, 256 only.
const FLASH_LAYOUTS: [Layout; 6] = [
    Layout::new(4, 2, 64),
    Layout::new(4, 1, 64),
    Layout::new(8, 2, 128),
    Layout::new(3, 3, 128),
    Layout::new(2, 1, 256),
    Layout::new(4, 2, 256),
];

/// The layouts on which the large (several 128-row tile) masks run.
const LARGE_LAYOUTS: [Layout; 3] = [
    Layout::new(4, 1, 64),
    Layout::new(8, 2, 128),
    Layout::new(2, 1, 256),
];

/// Runs `cases` on `be` under `checks`, prints the report and asserts it passed.
fn run_suite(be: &dyn Backend, label: &str, cases: &[Case], checks: &AttentionChecks) {
    let report = check_backend_attention(be, label, cases, checks);
    println!("{report}");
    if let Err(e) = report.ensure_passed() {
        panic!("{e}");
    }
}

fn suite_masks() -> Vec<(&'static str, BlockMask)> {
    dflash_tests::suite_masks().expect("suite masks")
}

fn large_masks() -> Vec<(&'static str, BlockMask)> {
    dflash_tests::large_masks().expect("large masks")
}

/// The backward's key -> query-run index (built on the host) against the dense mask, on
/// every mask family. Needs no GPU.
#[test]
fn key_query_runs_match_dense_mask() {
    let masks = [
        BlockMask::dflash(20, 4, &[2, 3, 9, 15, -1]).unwrap(),
        BlockMask::dflash(20, 4, &[-1, 0, 3, 3, 19]).unwrap(),
        BlockMask::dflash_sliding(40, 4, &[3, 9, 10, 30, -1], 7).unwrap(),
        BlockMask::causal(33).unwrap(),
        BlockMask::document(&[10, 1, 17, 9]).unwrap(),
        BlockMask::sliding_window(50, 8).unwrap(),
    ];
    for m in &masks {
        let (off, rs, re) = key_query_runs(m);
        let dense = m.to_dense_oracle();
        assert_eq!(off.len(), m.kv_len() + 1);
        for j in 0..m.kv_len() {
            let mut from_runs = vec![false; m.q_len()];
            let mut last_end = -1;
            for r in off[j] as usize..off[j + 1] as usize {
                assert!(
                    rs[r] < re[r] && rs[r] > last_end,
                    "runs of key {j} are maximal and ascending"
                );
                last_end = re[r];
                for i in rs[r]..re[r] {
                    from_runs[i as usize] = true;
                }
            }
            let col: Vec<bool> = (0..m.q_len()).map(|i| dense[i][j]).collect();
            assert_eq!(from_runs, col, "key {j}");
        }
    }
    println!(
        "  key -> query runs match the dense masks of {} mask families",
        masks.len()
    );
}

#[test]
fn attention_ops_match_reference() {
    let Some(cu) = cuda() else { return };
    // Every suite mask on every cuda-simple layout, the large-score cases, and the large
    // DFlash mask (several 128-row query and key tiles).
    let mut cases = cases_on(&suite_masks(), &SIMPLE_LAYOUTS);
    cases.extend(large_score_cases(SIMPLE_LAYOUTS[0]).unwrap());
    cases.extend(cases_on(&large_masks()[..1], &[Layout::new(8, 2, 128)]));
    run_suite(&cu, "cuda-simple", &cases, &F32_KERNEL);
    // head_dim above the kernel's limit is a clean error.
    let q = up(&cu, &vec![0.1; 2 * 288], &[2, 1, 288]);
    let m2 = BlockMask::causal(2).unwrap();
    let e = cu
        .attention(&q, &q, &q, &m2, 1.0)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("head_dim 288") && e.contains("cuda-simple"),
        "{e}"
    );
    // A host kernel by name runs through a host round trip and agrees too.
    let host = CudaBackend::with_options(
        &BackendOptions {
            attention: "reference".into(),
            threads: 0,
            device: 0,
        },
        dflash_backend_cuda::CudaOptions {
            gemm: GemmPrecision::Tf32,
            activations: dflash_backend_cuda::DType::F32,
            poison: true,
            attn_forward_ctas: None,
        },
    )
    .unwrap();
    assert_eq!(host.attention_kernel(), "reference");
    let dflash: Vec<_> = suite_masks()
        .into_iter()
        .filter(|(name, _)| *name == "dflash_s40")
        .collect();
    let via_host = cases_on(&dflash, &[Layout::new(4, 2, 64)]);
    run_suite(&host, "cuda, via host 'reference'", &via_host, &F32_KERNEL);
}

// ---------------------------------------------------------------------------------------
// Attention, "cuda-flash" (bf16 tensor-core kernel): bounds and their reasons in
// `dflash_tests::BF16_KERNEL`.

#[test]
fn attention_cuda_flash_matches_reference() {
    let Some(cu) = cuda_attn("cuda-flash", GemmPrecision::Tf32) else {
        return;
    };
    assert_eq!(cu.attention_kernel(), "cuda-flash");
    // Every suite mask on every flash layout; the large DFlash and causal masks on the large
    // layouts (several 128-row query tiles and key tiles).
    let mut cases = cases_on(&suite_masks(), &FLASH_LAYOUTS);
    cases.extend(cases_on(&large_masks()[..2], &LARGE_LAYOUTS));
    run_suite(&cu, "cuda-flash", &cases, &BF16_KERNEL);
    // The persistent forward on 3 CTAs: every CTA runs several (query tile, head) items one
    // after another (their K/V rings, summaries and Q reloads carried over), empty items
    // included (the DFlash masks' padding blocks, the large padding mask's whole second
    // query tile); head_dim 256 keeps one CTA per item.
    let capped = cuda_attn_opts(
        "cuda-flash",
        dflash_backend_cuda::CudaOptions {
            gemm: GemmPrecision::Tf32,
            activations: dflash_backend_cuda::DType::F32,
            poison: true,
            attn_forward_ctas: Some(3),
        },
    )
    .expect("the backend started above");
    let capped_layouts = [
        Layout::new(8, 2, 128),
        Layout::new(4, 1, 64),
        Layout::new(2, 1, 256),
    ];
    let mut masks = suite_masks();
    masks.extend(large_masks());
    let capped_cases = cases_on(&masks, &capped_layouts);
    run_suite(&capped, "cuda-flash, 3 CTAs", &capped_cases, &BF16_KERNEL);
    // Head dims other than 64/128/256 are a clean error naming the supported set.
    for bad_d in [40usize, 288] {
        let q = up(&cu, &vec![0.1; 2 * bad_d], &[2, 1, bad_d]);
        let m2 = BlockMask::causal(2).unwrap();
        let e = cu
            .attention(&q, &q, &q, &m2, 1.0)
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains(&format!("head_dim {bad_d}"))
                && e.contains("64, 128, 256")
                && e.contains("cuda-flash"),
            "{e}"
        );
        let e = cu
            .attention_backward(&q, &q, &q, &q, &up(&cu, &[0.0; 2], &[2, 1]), &q, &m2, 1.0)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains(&format!("head_dim {bad_d}")), "{e}");
    }
    println!("  unsupported head dims: clean errors");
}

/// No keys at all (k and v of 0 rows): every row sees none, so `out` is exactly 0 and `lse`
/// -inf, as on the reference, on both kernels and at every flash head dim (the Hopper
/// forward's tensor maps cannot describe a 0-row operand, so it must not get that far).
#[test]
fn attention_without_keys_is_zero_with_lse_minus_infinity() {
    for kernel in ["cuda-simple", "cuda-flash"] {
        let Some(cu) = cuda_attn(kernel, GemmPrecision::Tf32) else {
            return;
        };
        for d in [64usize, 128, 256] {
            let (rows, hq, hkv) = (5usize, 4usize, 2usize);
            let mask = BlockMask::from_intervals(
                0,
                vec![dflash_core::mask::Interval::EMPTY; rows],
                vec![dflash_core::mask::Interval::EMPTY; rows],
            )
            .unwrap();
            let q = up(
                &cu,
                &rand_vec(&mut rng(d as u64), rows * hq * d, 2.0),
                &[rows, hq, d],
            );
            let kv = up(&cu, &[], &[0, hkv, d]);
            let (out, lse) = cu.attention(&q, &kv, &kv, &mask, 0.125).unwrap();
            let (out, lse) = (down(&cu, &out), down(&cu, &lse));
            assert_eq!(out.len(), rows * hq * d);
            assert!(out.iter().all(|&x| x == 0.0), "{kernel} d {d}: out != 0");
            assert_eq!(lse.len(), rows * hq);
            assert!(
                lse.iter().all(|&x| x == f32::NEG_INFINITY),
                "{kernel} d {d}: lse {lse:?}"
            );
        }
        println!("  {kernel}: no keys gives out 0, lse -inf");
    }
}

/// `cuda-flash` takes bf16 q, k, v (and the backward's out and d_out) as they are: the
/// kernel rounds f32 inputs to bf16 itself, so feeding the same values already in bf16 must
/// give bit-identical out, lse, dq, dk, dv (any difference would mean a wrong buffer or
/// dtype reached the kernel). `cuda-simple` computes in f32 and refuses bf16 by name.
#[test]
fn attention_cuda_flash_takes_bf16_inputs_bit_identically() {
    let Some(cu) = cuda_attn("cuda-flash", GemmPrecision::Bf16) else {
        return;
    };
    let mut r = rng(41);
    let (s, bs, hq, hkv) = (96, 8, 4, 2);
    let anchors = [3, 17, 40, 41, 77, -1];
    let mask = BlockMask::dflash(s, bs, &anchors).unwrap();
    for d in dflash_backend_cuda::FLASH_HEAD_DIMS {
        let (tq, tk) = (mask.q_len(), mask.kv_len());
        let (qs, ks) = ([tq, hq, d], [tk, hkv, d]);
        let q = bf16_rounded(&rand_vec(&mut r, tq * hq * d, 2.0));
        let k = bf16_rounded(&rand_vec(&mut r, tk * hkv * d, 2.0));
        let v = bf16_rounded(&rand_vec(&mut r, tk * hkv * d, 1.0));
        let d_out = bf16_rounded(&rand_vec(&mut r, tq * hq * d, 1.0));
        let scale = (d as f32).powf(-0.5);
        let f32_in = [up(&cu, &q, &qs), up(&cu, &k, &ks), up(&cu, &v, &ks)];
        let bf_in = [
            up_bf16(&cu, &q, &qs),
            up_bf16(&cu, &k, &ks),
            up_bf16(&cu, &v, &ks),
        ];
        let (o32, l32) = cu
            .attention(&f32_in[0], &f32_in[1], &f32_in[2], &mask, scale)
            .unwrap();
        let (obf, lbf) = cu
            .attention(&bf_in[0], &bf_in[1], &bf_in[2], &mask, scale)
            .unwrap();
        check_exact(
            &format!("flash bf16-in out D{d}"),
            &down(&cu, &obf),
            &down(&cu, &o32),
        );
        check_exact(
            &format!("flash bf16-in lse D{d}"),
            &down(&cu, &lbf),
            &down(&cu, &l32),
        );
        // The forward's out is bf16-valued, so its bf16 copy is exact.
        let o_bf = cu.to_dtype(&o32, dflash_backend_cuda::DType::Bf16).unwrap();
        let (d32, dbf) = (up(&cu, &d_out, &qs), up_bf16(&cu, &d_out, &qs));
        let g32 = cu
            .attention_backward(
                &f32_in[0], &f32_in[1], &f32_in[2], &o32, &l32, &d32, &mask, scale,
            )
            .unwrap();
        let gbf = cu
            .attention_backward(
                &bf_in[0], &bf_in[1], &bf_in[2], &o_bf, &l32, &dbf, &mask, scale,
            )
            .unwrap();
        // dq accumulates with f32 atomics (order not fixed): equal to rounding, not bits.
        assert_close(
            &format!("flash bf16-in dq D{d}"),
            &down(&cu, &gbf.0),
            &down(&cu, &g32.0),
            &Tolerance::F32_ATOMIC_ORDER,
        );
        check_exact(
            &format!("flash bf16-in dk D{d}"),
            &down(&cu, &gbf.1),
            &down(&cu, &g32.1),
        );
        check_exact(
            &format!("flash bf16-in dv D{d}"),
            &down(&cu, &gbf.2),
            &down(&cu, &g32.2),
        );
    }
    // With bf16 activations the kernel's bf16 results come back as they are (no widening):
    // the same values the f32 mode returns widened, so equal bit for bit (dq: atomics).
    let Some(act) = cuda_attn_act(
        "cuda-flash",
        GemmPrecision::Bf16,
        dflash_backend_cuda::DType::Bf16,
    ) else {
        return;
    };
    let d = 128;
    let (tq, tk) = (mask.q_len(), mask.kv_len());
    let (qs, ks) = ([tq, hq, d], [tk, hkv, d]);
    let inputs = [
        rand_vec(&mut r, tq * hq * d, 2.0),
        rand_vec(&mut r, tk * hkv * d, 2.0),
        rand_vec(&mut r, tk * hkv * d, 1.0),
        rand_vec(&mut r, tq * hq * d, 1.0),
    ];
    let run = |be: &CudaBackend| {
        let q = up(be, &inputs[0], &qs);
        let k = up(be, &inputs[1], &ks);
        let v = up(be, &inputs[2], &ks);
        let d_out = up(be, &inputs[3], &qs);
        let (o, l) = be.attention(&q, &k, &v, &mask, 0.09).unwrap();
        let (dq, dk, dv) = be
            .attention_backward(&q, &k, &v, &o, &l, &d_out, &mask, 0.09)
            .unwrap();
        let dtypes = [&o, &dq, &dk, &dv].map(dtype_of);
        let vals = [&o, &l, &dq, &dk, &dv].map(|t| down(be, t));
        (dtypes, vals)
    };
    let (t32, v32) = run(&cu);
    let (tbf, vbf) = run(&act);
    assert_eq!(t32, [dflash_backend_cuda::DType::F32; 4]);
    assert_eq!(tbf, [dflash_backend_cuda::DType::Bf16; 4]);
    for (i, name) in ["out", "lse", "dq", "dk", "dv"].iter().enumerate() {
        if *name == "dq" {
            let why = "dq: f32 atomic accumulation order";
            assert_close(
                "flash bf16-activation dq",
                &vbf[i],
                &v32[i],
                &Tolerance {
                    atol: 1e-5,
                    rtol: 1e-2,
                    atol_unit: AtolUnit::MaxWant,
                    why,
                },
            );
        } else {
            check_exact(&format!("flash bf16-activation {name}"), &vbf[i], &v32[i]);
        }
    }
    let Some(simple) = cuda_attn("cuda-simple", GemmPrecision::Bf16) else {
        return;
    };
    let (tq, tk) = (mask.q_len(), mask.kv_len());
    let q = up_bf16(&simple, &rand_vec(&mut r, tq * hq * 64, 1.0), &[tq, hq, 64]);
    let k = up(
        &simple,
        &rand_vec(&mut r, tk * hkv * 64, 1.0),
        &[tk, hkv, 64],
    );
    // cuda-simple reads bf16 (and mixed) inputs too (formerly rejected here); checked
    // against the reference by `attention_cuda_simple_bf16_activations_match_reference`.
    let (o, l) = simple.attention(&q, &k, &k, &mask, 0.125).unwrap();
    assert_eq!(dtype_of(&o), dflash_backend_cuda::DType::F32);
    assert_eq!(dtype_of(&l), dflash_backend_cuda::DType::F32);
}

// ---------------------------------------------------------------------------------------
// cuda-simple with bf16 activations

/// `"cuda-simple"` with bf16 activations: q/k/v/d_out in f32, bf16 and mixed (q and d_out bf16,
/// k and v f32: widened exactly), against the reference on the same values (bf16-rounded where
/// bf16); the backward gets, on both sides, the out the CUDA forward stored (bf16). out / dq /
/// dk / dv are bf16: the f32 tolerances of `attention_case` plus one bf16 rounding (2^-8 of
/// |ref|, `check_bf16`); lse stays f32 at its f32 tolerance.
#[test]
fn attention_cuda_simple_bf16_activations_match_reference() {
    use dflash_backend_cuda::DType;
    let Some(cu) = cuda_attn_act("cuda-simple", GemmPrecision::Tf32, DType::Bf16) else {
        return;
    };
    let rf = reference();
    let dflash = BlockMask::dflash(40, 4, &[1, 5, 6, 20, 37, -1, -1]).unwrap();
    let causal = BlockMask::causal(45).unwrap();
    let mut r = rng(215);
    for (name, mask, hq, hkv, d) in [
        ("dflash", &dflash, 4, 2, 64),
        ("causal", &causal, 8, 2, 128),
        ("dflash", &dflash, 3, 3, 40),
    ] {
        let (tq, tk) = (mask.q_len(), mask.kv_len());
        let q = rand_vec(&mut r, tq * hq * d, 2.0);
        let k = rand_vec(&mut r, tk * hkv * d, 2.0);
        let v = rand_vec(&mut r, tk * hkv * d, 1.0);
        let dout = rand_vec(&mut r, tq * hq * d, 1.0);
        let scale = (d as f32).powf(-0.5);
        let (qs, ks) = ([tq, hq, d], [tk, hkv, d]);
        for (qd, kd) in [
            (DType::F32, DType::F32),
            (DType::Bf16, DType::Bf16),
            (DType::Bf16, DType::F32),
        ] {
            let tag = format!(
                "{name} Hq{hq}/Hkv{hkv} D{d} q,dO {} k,v {}",
                qd.name(),
                kd.name()
            );
            let (qc, qv) = up_as(&cu, &q, &qs, qd);
            let (kc, kv) = up_as(&cu, &k, &ks, kd);
            let (vc, vv) = up_as(&cu, &v, &ks, kd);
            let (dc, dv) = up_as(&cu, &dout, &qs, qd);
            let (qr, kr, vr, dr) = (
                up(&rf, &qv, &qs),
                up(&rf, &kv, &ks),
                up(&rf, &vv, &ks),
                up(&rf, &dv, &qs),
            );
            let (oc, lc) = cu.attention(&qc, &kc, &vc, mask, scale).unwrap();
            let (or, lr) = rf.attention(&qr, &kr, &vr, mask, scale).unwrap();
            assert_dtype("attention out", &oc, DType::Bf16);
            assert_dtype("attention lse", &lc, DType::F32);
            check_bf16(
                &format!("bf16 attn out {tag}"),
                &down(&cu, &oc),
                &down(&rf, &or),
                &Tolerance::DEVICE_F32_ATTN_OUT,
            );
            assert_close(
                &format!("bf16 attn lse {tag}"),
                &down(&cu, &lc),
                &down(&rf, &lr),
                &Tolerance::F32_ATOMIC_ORDER,
            );
            // Both backwards see the out CUDA stored.
            let o_held = down(&cu, &oc);
            let orb = up(&rf, &o_held, &qs);
            let (gq, gk, gv) = cu
                .attention_backward(&qc, &kc, &vc, &oc, &lc, &dc, mask, scale)
                .unwrap();
            let (wq, wk, wv) = rf
                .attention_backward(&qr, &kr, &vr, &orb, &lr, &dr, mask, scale)
                .unwrap();
            for (n, g, w) in [("dq", &gq, &wq), ("dk", &gk, &wk), ("dv", &gv, &wv)] {
                assert_dtype(n, g, DType::Bf16);
                check_bf16(
                    &format!("bf16 attn {n} {tag}"),
                    &down(&cu, g),
                    &down(&rf, w),
                    &Tolerance::DEVICE_F32_ATTN_GRAD,
                );
            }
        }
    }
}

/// `cases` on both kernels (head_dim 64: one that both support), each report printed.
fn nan_cases_on_both_kernels(cases: &[dflash_tests::NanCase], what: &str) {
    for kernel in ["cuda-simple", "cuda-flash"] {
        let Some(cu) = cuda_attn(kernel, GemmPrecision::Fp32) else {
            return;
        };
        let report =
            dflash_tests::check_backend_attention_nan(&cu, &format!("{kernel}, {what}"), cases);
        println!("{report}");
        if let Err(e) = report.ensure_passed() {
            panic!("{e}");
        }
    }
}

/// NaN policy (ARCHITECTURE.md) for a NaN value, at tile granularity
/// (`NanCase::within_tiles`: the P V product is an MMA over whole tiles): rows that read it
/// have out[.., 0] and dq NaN, every lse stays finite, rows that see no key stay exactly 0,
/// the key's dk is NaN and its dv finite.
#[test]
fn attention_kernels_contain_nan_values() {
    let cases: Vec<_> = dflash_tests::nan_v_cases_on(Layout::new(4, 2, 64))
        .expect("NaN value cases")
        .into_iter()
        .map(dflash_tests::NanCase::within_tiles)
        .collect();
    nan_cases_on_both_kernels(&cases, "NaN values");
}

/// NaN policy (ARCHITECTURE.md): a NaN key comes out NaN in exactly the rows that read it
/// (out, lse, dq; dk and dv of that key), fully masked rows stay 0 and every other row's out
/// and lse finite; its dq at tile granularity (`NanCase::within_tiles`: dq = dS K is an MMA
/// over whole tiles). A NaN in q makes out, lse and dq of its (row, head) NaN, one in d_out
/// only its dq; either makes dk of the keys that (row, head) sees NaN, and their dv (all of
/// it for q, dim 0 for d_out); every other row's out, lse and dq stay finite (row-wise even
/// on tensor cores), and dk/dv of the keys it does not see in its kv head are checked at
/// tile granularity (0 x NaN inside the dS^T Q and P^T dO MMAs).
#[test]
fn attention_kernels_propagate_nan() {
    let layout = Layout::new(4, 2, 64);
    let cases: Vec<_> = [
        dflash_tests::nan_cases_on(layout).expect("NaN key cases"),
        dflash_tests::nan_q_cases_on(layout).expect("NaN query cases"),
        dflash_tests::nan_dout_cases_on(layout).expect("NaN d_out cases"),
    ]
    .concat()
    .into_iter()
    .map(dflash_tests::NanCase::within_tiles)
    .collect();
    nan_cases_on_both_kernels(&cases, "NaN inputs");
}
