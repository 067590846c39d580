//! The CPU twin of wgpu's tensor-core attention forward (`dflash_tests::f16_products`): held
//! to the same bounds against the f64 oracle as the device kernel (so those bounds are the
//! numerics' and not the kernel's luck), shown to round (it is not the reference under
//! another name), and run through a whole drafter step at head_dim 128, which measures on any
//! machine what f16 products in the attention forward do to a step's loss and gradients.

use std::sync::Arc;

use dflash_backend_reference::ReferenceBackend;
use dflash_core::registry::BackendOptions;
use dflash_core::{AttnDims, Backend};
use dflash_tests::drafter_step::{
    ALL_PROBLEMS, HEAD_DIM_128, StepTolerance, drafter_step_matches_reference,
};
use dflash_tests::f16_products::WGPU_COOP_FORWARD;
use dflash_tests::tolerance::rel_l2;
use dflash_tests::{
    F16_PRODUCTS_FORWARD, F16_PRODUCTS_FORWARD_F16_FED, Layout, cases_on, check_backend_attention,
    check_backend_attention_nan, large_masks, large_score_cases, nan_cases_on, nan_q_cases_on,
    reference_with, suite_masks,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn twin() -> ReferenceBackend {
    ReferenceBackend::with_attention_kernel(&BackendOptions::default(), Box::new(WGPU_COOP_FORWARD))
        .expect("the reference backend around the twin")
}

/// The device kernel's layouts and cases (`backends/wgpu/tests/attention.rs`,
/// `coop_forward_matches_the_oracle`): the same bounds, the same NaN rules for q and k.
#[test]
fn twin_meets_the_tensor_core_forward_bounds() {
    let be = twin();
    let layouts = [Layout::new(4, 2, 128), Layout::new(4, 1, 96)];
    let mut cases = cases_on(&suite_masks().unwrap(), &layouts);
    cases.extend(cases_on(&large_masks().unwrap(), &layouts[..1]));
    let mut failures = Vec::new();
    for report in [
        check_backend_attention(&be, "f16-products twin", &cases, &F16_PRODUCTS_FORWARD),
        check_backend_attention(
            &be,
            "f16-products twin (large scores, f16-fed)",
            &large_score_cases(layouts[0]).unwrap(),
            &F16_PRODUCTS_FORWARD_F16_FED,
        ),
        check_backend_attention_nan(
            &be,
            "f16-products twin",
            &[
                nan_cases_on(layouts[0]).unwrap(),
                nan_q_cases_on(layouts[0]).unwrap(),
            ]
            .concat(),
        ),
    ] {
        println!("{report}");
        failures.extend(report.ensure_passed().err());
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// The twin's out departs from the f32 reference's by the f16 roundings: more than f32
/// arithmetic could (rel-L2 > 1e-5; the two f64/f32 references agree to ~1e-7) and less than
/// the oracle bound (2e-2).
#[test]
fn twin_rounds_where_the_reference_does_not() {
    let (masks, layout) = (suite_masks().unwrap(), Layout::new(4, 2, 128));
    let (_, mask) = masks.iter().find(|(n, _)| *n == "dflash_random").unwrap();
    let dims = AttnDims {
        q_rows: mask.q_len(),
        kv_rows: mask.kv_len(),
        q_heads: layout.q_heads,
        kv_heads: layout.kv_heads,
        head_dim: layout.head_dim,
    };
    let mut r = ChaCha8Rng::seed_from_u64(0xF16);
    let mut draw = |n: usize| -> Vec<f32> { (0..n).map(|_| r.random_range(-2.0..2.0)).collect() };
    let qn = dims.q_rows * dims.q_heads * dims.head_dim;
    let kn = dims.kv_rows * dims.kv_heads * dims.head_dim;
    let (q, k, v) = (draw(qn), draw(kn), draw(kn));
    let scale = 1.0 / (dims.head_dim as f32).sqrt();
    let out = |be: &dyn Backend| -> Vec<f32> {
        let qs = [dims.q_rows, dims.q_heads, dims.head_dim];
        let ks = [dims.kv_rows, dims.kv_heads, dims.head_dim];
        let (qt, kt, vt) = (
            be.upload(&q, &qs).unwrap(),
            be.upload(&k, &ks).unwrap(),
            be.upload(&v, &ks).unwrap(),
        );
        let (o, _) = be.attention(&qt, &kt, &vt, mask, scale).unwrap();
        be.download(&o).unwrap()
    };
    let (rounded, exact) = (out(&twin()), out(reference_with("reference").as_ref()));
    let (rel, _) = rel_l2(&rounded, &exact).unwrap();
    println!("twin against the reference: rel-L2 {rel:.3e}");
    assert!(rel > 1e-5 && rel < 2e-2, "rel-L2 {rel:.3e}");
}

/// A whole drafter step with f16 products in the attention forward, against the reference
/// step: head_dim 128 (the tensor-core forward's) and the shared problems.
#[test]
fn a_drafter_step_with_f16_product_attention_stays_within_its_bounds() {
    drafter_step_matches_reference(
        Arc::new(twin()),
        "reference + f16-products attention twin",
        &[HEAD_DIM_128.as_slice(), &ALL_PROBLEMS].concat(),
        &StepTolerance::F16_PRODUCTS_ATTENTION,
    );
}
