//! RMSNorm, RoPE, SwiGLU, embedding and AdamW against the reference backend, through the
//! shared op suite (`dflash_tests::ops`), each on the adapter's bindings and on 4 KiB bindings
//! (the chunked paths); the row reductions also without subgroups.
//!
//! Skips cleanly without an adapter; inputs, poisoning and tolerances: `common`.

mod common;

use common::*;
use dflash_core::{ActivationOps, NormOps};
use dflash_tests::ops::{elementwise, storage};

#[test]
fn norm_ops_match_reference() {
    for p in paths(wgpu_reduction_variants()) {
        elementwise::rms_norm(&p);
    }
}

#[test]
fn rope_ops_match_reference() {
    for p in paths(wgpu_both()) {
        elementwise::rope(&p);
    }
}

#[test]
fn rope_table_cache_never_serves_stale_values() {
    if let Some(be) = wgpu() {
        elementwise::rope_cache(&WgpuPath::new("full bindings", be));
    }
}

#[test]
fn activation_ops_match_reference() {
    for p in paths(wgpu_both()) {
        elementwise::swiglu(&p);
    }
}

#[test]
fn embedding_ops_match_reference() {
    for p in paths(wgpu_both()) {
        elementwise::embedding(&p);
    }
}

#[test]
fn optimizer_ops_match_reference() {
    for p in paths(wgpu_both()) {
        elementwise::adamw(&p);
    }
}

/// f16 tensors (frozen weights in the compute format): read exactly where an op takes them,
/// refused by name where it computes in f32 only.
#[test]
fn f16_tensors_read_exactly_or_refused() {
    for p in paths(wgpu_f16_both()) {
        storage::compute_format(&p);
    }
}

/// Activation ops, which take f32 only on this backend (the compute format holds read-only
/// tensors), refuse an f16 operand by name, shape, format and device.
#[test]
fn activation_ops_refuse_f16() {
    let Some(be) = wgpu_f16() else { return };
    let (x, _) = up_f16(&be, &rand_vec(&mut rng(16), 12, 1.0), &[3, 4]);
    let w = up(&be, &[1.0; 4], &[4]);
    let e = assert_err(
        be.rms_norm(&x, &w, 1e-6),
        &["rms_norm", "[3, 4]", "f16", "wgpu:0"],
    );
    println!("  {e}");
    assert_err(be.swiglu(&x, &x), &["swiglu", "f16", "wgpu:0"]);
}
