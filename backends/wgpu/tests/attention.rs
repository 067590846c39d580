//! Attention through the shared suite of `dflash-tests` (its masks, inputs and dense f64
//! oracle, every output NaN-poisoned first): the WGSL kernel `wgpu-tiled` on every suite mask
//! in layouts covering GQA 1..4 and head dims 32..256 (and an odd 40), the large-score cases,
//! the large masks (several query and key tiles), the NaN-propagation cases; a host kernel
//! through the round trip; clean errors for unsupported head dims. `F32_KERNEL` bounds (an
//! f32 online softmax against f64).
//!
//! Skips cleanly without an adapter.

mod common;

use common::*;
use dflash_core::AttentionOps;
use dflash_core::mask::BlockMask;
use dflash_tests::{
    AttentionChecks, Case, F32_KERNEL, Layout, cases_on, check_backend_attention,
    check_backend_attention_nan, large_score_cases, nan_cases_on,
};

/// (q heads, kv heads, head_dim): GQA 1, 2, 4; head dims 32, 40, 64, 128, 256.
const LAYOUTS: [Layout; 5] = [
    Layout::new(4, 2, 64),
    Layout::new(2, 2, 32),
    Layout::new(4, 1, 40),
    Layout::new(4, 2, 128),
    Layout::new(2, 1, 256),
];

fn run_suite(be: &dyn dflash_core::Backend, label: &str, cases: &[Case], checks: &AttentionChecks) {
    let report = check_backend_attention(be, label, cases, checks);
    println!("{report}");
    if let Err(e) = report.ensure_passed() {
        panic!("{e}");
    }
}

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

#[test]
fn tiled_attention_on_large_masks() {
    let Some(be) = wgpu_with("wgpu-tiled", None) else {
        return;
    };
    let large = dflash_tests::large_masks().expect("large masks");
    let cases = cases_on(&large, &[Layout::new(4, 1, 64)]);
    run_suite(&be, "wgpu-tiled (large masks)", &cases, &F32_KERNEL);
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
}

#[test]
fn tiled_attention_propagates_nan() {
    let Some(be) = wgpu_with("wgpu-tiled", None) else {
        return;
    };
    for layout in [Layout::new(4, 2, 16), Layout::new(4, 2, 128)] {
        let report = check_backend_attention_nan(&be, "wgpu-tiled", &nan_cases_on(layout).unwrap());
        println!("{report}");
        if let Err(e) = report.ensure_passed() {
            panic!("{e}");
        }
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
