//! Attention through the shared suite of `dflash-tests` (its masks, inputs and dense f64
//! oracle, every output NaN-poisoned first): the WGSL kernel `wgpu-tiled` on every suite mask
//! in layouts covering GQA 1..4 and head dims 32..256 (and 40 and 22, padded; 22 read as
//! scalars, the others as vec4), the large-score cases, the large masks (several query and
//! key tiles), the NaN-propagation cases; a host kernel through the round trip; clean errors
//! for unsupported head dims. `F32_KERNEL` bounds (an f32 online softmax against f64).
//!
//! Skips cleanly without an adapter.

mod common;

use common::*;
use dflash_core::AttentionOps;
use dflash_core::mask::BlockMask;
use dflash_tests::{
    F16_PRODUCTS_FORWARD, F16_PRODUCTS_FORWARD_F16_FED, F32_KERNEL, Layout, cases_on,
    large_score_cases,
};

/// (q heads, kv heads, head_dim): GQA 1, 2, 4; head dims 32, 40, 64, 128, 256 (q, k, v read
/// as vec4) and 22 (as scalars: rows start inside a vec4).
const LAYOUTS: [Layout; 6] = [
    Layout::new(4, 2, 64),
    Layout::new(2, 2, 32),
    Layout::new(4, 1, 40),
    Layout::new(4, 2, 128),
    Layout::new(2, 1, 256),
    Layout::new(2, 2, 22),
];

#[test]
fn tiled_attention_matches_the_oracle_on_every_mask() {
    let Some(be) = wgpu_with("wgpu-tiled", None) else {
        return;
    };
    let masks = dflash_tests::suite_masks().expect("suite masks");
    let mut cases = cases_on(&masks, &LAYOUTS);
    cases.extend(large_score_cases(LAYOUTS[0]).unwrap());
    run_suite(&be, "wgpu-tiled", &cases, &F32_KERNEL);
}

/// The suite at head dim 128 with subgroups off: where the adapter's subgroups take the
/// forward's softmax (attention_fwd_sg.wgsl: 32+ lanes, so the H200 but not lavapipe), this
/// is the plain forward's check; elsewhere it repeats the plain path.
#[test]
fn tiled_attention_without_subgroups_matches_the_oracle() {
    let Some(be) = wgpu_tiled_without_subgroups() else {
        return;
    };
    let masks = dflash_tests::suite_masks().expect("suite masks");
    let layout = Layout::new(4, 2, 128);
    let mut cases = cases_on(&masks, &[layout]);
    cases.extend(large_score_cases(layout).unwrap());
    run_suite(&be, "wgpu-tiled (no subgroups)", &cases, &F32_KERNEL);
    run_nan_cases(&be, "wgpu-tiled (no subgroups)", layout);
}

#[test]
fn tiled_attention_on_large_masks() {
    let Some(be) = wgpu_with("wgpu-tiled", None) else {
        return;
    };
    let large = dflash_tests::large_masks().expect("large masks");
    let cases = cases_on(&large, &[Layout::new(4, 1, 64)]);
    run_suite(&be, "wgpu-tiled (large masks)", &cases, &F32_KERNEL);
}

/// The tensor-core forward (`WgpuOptions::attn_coop`, attention_fwd_coop.wgsl) where the
/// adapter has cooperative matrices: head dims 128 and 96 (the DP 128 class it takes), GQA 2
/// and 4, on every suite mask and the large masks; the large-score cases (its lazy rescale)
/// fed f16-representable inputs (see `F16_PRODUCTS_FORWARD`'s note); all of them against its
/// CPU twin (`dflash_tests::f16_products`) at the bounds of summation order alone;
/// a NaN in k or q row-wise as every kernel, one in v at tile granularity (the P V product).
/// Elsewhere a skip line naming what the adapter lacks (lavapipe: cooperative matrices).
#[test]
fn coop_forward_matches_the_oracle() {
    let Some(be) = wgpu_coop_attention() else {
        return;
    };
    let layouts = [Layout::new(4, 2, 128), Layout::new(4, 1, 96)];
    for l in layouts {
        let [fwd, ..] = be.tiled_kernels(l.head_dim).unwrap();
        assert!(fwd.starts_with("attention_fwd_coop.wgsl"), "{fwd}");
    }
    let masks = dflash_tests::suite_masks().expect("suite masks");
    let mut cases = cases_on(&masks, &layouts);
    let large = dflash_tests::large_masks().expect("large masks");
    cases.extend(cases_on(&large, &layouts[..1]));
    run_suite(
        &be,
        "wgpu-tiled, coop forward",
        &cases,
        &F16_PRODUCTS_FORWARD,
    );
    // Against its CPU twin (the same roundings at the same points): only summation order
    // may differ, where the oracle's bound has to allow for the roundings themselves; the
    // large-score cases are where the lazy rescale runs.
    let twin_cases = [cases.clone(), large_score_cases(layouts[0]).unwrap()].concat();
    let twin = dflash_tests::check_backend_against_twin(
        &be,
        "wgpu-tiled, coop forward",
        Box::new(dflash_tests::f16_products::WGPU_COOP_FORWARD),
        &twin_cases,
        &dflash_tests::F16_PRODUCTS_TWIN,
    );
    println!("{twin}");
    if let Err(e) = twin.ensure_passed() {
        panic!("{e}");
    }
    run_suite(
        &be,
        "wgpu-tiled, coop forward (large scores, f16-fed)",
        &large_score_cases(layouts[0]).unwrap(),
        &F16_PRODUCTS_FORWARD_F16_FED,
    );
    let l = layouts[0];
    let nan: Vec<_> = [
        dflash_tests::nan_cases_on(l).unwrap(),
        dflash_tests::nan_q_cases_on(l).unwrap(),
        dflash_tests::nan_v_cases_on(l)
            .unwrap()
            .into_iter()
            .map(dflash_tests::NanCase::within_tiles)
            .collect(),
    ]
    .concat();
    let report = dflash_tests::check_backend_attention_nan(&be, "wgpu-tiled, coop forward", &nan);
    println!("{report}");
    if let Err(e) = report.ensure_passed() {
        panic!("{e}");
    }
}

/// Long tile lists: on a CPU adapter each kernel's tile loop is split over several dispatches
/// (llvmpipe caps an invocation's loop iterations), with the softmax state and accumulators
/// carried between them; on a GPU one dispatch.
#[test]
fn tiled_attention_on_a_long_causal_mask() {
    let Some(be) = wgpu_with("wgpu-tiled", None) else {
        return;
    };
    let mask = BlockMask::causal(1024).unwrap();
    let cases = cases_on(&[("causal_1024", mask)], &[Layout::new(2, 1, 64)]);
    run_suite(&be, "wgpu-tiled (long lists)", &cases, &F32_KERNEL);
    // The same split on any adapter: passes of at most 3 list iterations (a GPU runs one
    // pass otherwise, and a CPU adapter's split depends on its tile sizes), on a mask with
    // full, partial and empty tiles and at the head dim the models use.
    let opts = dflash_backend_wgpu::WgpuOptions {
        attn_pass_tiles: Some(3),
        ..be.options()
    };
    let backend = dflash_core::registry::BackendOptions {
        attention: "wgpu-tiled".into(),
        ..Default::default()
    };
    let split = dflash_backend_wgpu::WgpuBackend::with_options(&backend, opts).unwrap();
    let masks = dflash_tests::suite_masks().expect("suite masks");
    let mut cases = cases_on(
        &[("causal_1024", BlockMask::causal(1024).unwrap())],
        &[Layout::new(2, 1, 64)],
    );
    cases.extend(cases_on(&masks, &[Layout::new(4, 2, 128)]));
    run_suite(&split, "wgpu-tiled (passes of 3)", &cases, &F32_KERNEL);
}

/// q, out, lse, d_out and dq larger than one storage binding: the call is split by query
/// rows (chunks of 256 bound from their first row, the mask sliced to them; dk and dv summed
/// over the chunks). A 160 KiB binding cap makes 1024 query rows of 4 heads x 32 (512 KiB)
/// four chunks and the DFlash mask's 640 three, while k and v (at most 155 KiB) fit; an
/// adapter's real limit would need gigabytes. k and v over the cap are a clean error.
#[test]
fn tiled_attention_splits_query_rows_past_one_binding() {
    let Some(be) = wgpu_with("wgpu-tiled", Some(160 * 1024)) else {
        return;
    };
    let anchors: Vec<i32> = (0..40).map(|i| 13 * i + 5).collect();
    let masks = [
        ("causal_1024", BlockMask::causal(1024).unwrap()),
        (
            "dflash_600_640",
            BlockMask::dflash(600, 16, &anchors).unwrap(),
        ),
    ];
    assert_eq!(masks[1].1.q_len(), 640);
    let cases = cases_on(&masks, &[Layout::new(4, 1, 32)]);
    run_suite(
        &be,
        "wgpu-tiled (query rows in chunks)",
        &cases,
        &F32_KERNEL,
    );
    // k and v of 2048 keys x 2 heads x 32 (512 KiB) do not fit the cap.
    let q = up(&be, &vec![0.1; 8 * 2 * 32], &[8, 2, 32]);
    let kv = up(&be, &vec![0.1; 2048 * 2 * 32], &[2048, 2, 32]);
    let m = BlockMask::dflash(2040, 8, &[100]).unwrap();
    let e = be
        .attention(&q, &kv, &kv, &m, 1.0)
        .err()
        .unwrap()
        .to_string();
    assert!(
        e.contains("k and v") && e.contains("storage binding"),
        "{e}"
    );
    println!("  {e}");
}

#[test]
fn tiled_attention_propagates_nan() {
    let Some(be) = wgpu_with("wgpu-tiled", None) else {
        return;
    };
    for layout in [Layout::new(4, 2, 16), Layout::new(4, 2, 128)] {
        run_nan_cases(&be, "wgpu-tiled", layout);
    }
}

/// A host kernel behind the backend (download, host kernel, upload) passes the same suite.
#[test]
fn host_kernel_round_trip_matches_the_oracle() {
    let Some(be) = wgpu() else { return };
    let masks = dflash_tests::suite_masks().expect("suite masks");
    let cases = cases_on(&masks[..2], &[Layout::new(4, 2, 16)]);
    run_suite(&be, "reference (host round trip)", &cases, &F32_KERNEL);
}

#[test]
fn unsupported_head_dims_are_clean_errors() {
    let Some(be) = wgpu_with("wgpu-tiled", None) else {
        return;
    };
    let q = up(&be, &vec![0.1; 2 * 288], &[2, 1, 288]);
    let m = BlockMask::causal(2).unwrap();
    let e = be.attention(&q, &q, &q, &m, 1.0).err().unwrap().to_string();
    assert!(
        e.contains("head_dim") && e.contains("288") && e.contains("wgpu:0"),
        "{e}"
    );
    println!("  {e}");
}

/// f16 q, k, v (the compute format; out and d_out too for the backward) through `wgpu-tiled`
/// (widened into f32 copies on the device first) and through the host round trip (widened on
/// the host): bit for bit the f32 path ([`check_f16_inputs_exact`]). Head dims 64 and 40 read
/// as vec4, 21 per element, its rows starting at odd f16 offsets.
#[test]
fn attention_f16_qkv_match_the_f32_path_bit_exact() {
    let mut r = rng(21);
    for attention in ["wgpu-tiled", "reference"] {
        let Some(be) = wgpu_f16_with(attention, None) else {
            return;
        };
        for (s, hq, hk, d) in [(37, 4, 2, 64), (20, 2, 1, 40), (19, 3, 1, 21)] {
            check_f16_inputs_exact(&be, attention, &mut r, (s, hq, hk, d));
        }
    }
}
