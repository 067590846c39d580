//! Memory ops against the reference backend through the shared op suite
//! (`dflash_tests::ops::memory`: transfers, copies, narrowing, concatenation, elementwise glue,
//! the reductions, malformed calls), on the adapter's bindings and on 4 KiB bindings (the
//! chunked paths); then the 2-D grid, the f16 compute format and `upload_frozen`.
//!
//! Skips cleanly without an adapter; inputs, poisoning and tolerances: `common`.

mod common;

use common::*;
use dflash_backend_wgpu::DType;
use dflash_core::{HostSlice, MemoryOps};
use dflash_tests::ops::memory;

#[test]
fn transfers_copies_and_elementwise_match_reference() {
    for p in paths(wgpu_both()) {
        memory::transfers_and_elementwise(&p);
    }
}

#[test]
fn narrow_and_concat_match_reference() {
    for p in paths(wgpu_both()) {
        memory::narrow_and_concat(&p);
    }
}

#[test]
fn reductions_match_reference() {
    for p in paths(wgpu_reduction_variants()) {
        memory::reductions(&p);
    }
}

#[test]
fn malformed_calls_fail_like_the_reference() {
    if let Some(be) = wgpu() {
        memory::malformed_calls(&WgpuPath::new("full bindings", be));
    }
}

/// More than 65535 workgroups of 256 elements: the elementwise kernels run on a 2-D grid.
#[test]
fn more_than_65535_workgroups_use_a_2d_grid() {
    let Some(be) = wgpu() else { return };
    let n = 65_535 * 256 + 300; // 65537 workgroups
    let a: Vec<f32> = (0..n).map(|i| (i % 977) as f32).collect();
    let b: Vec<f32> = (0..n).map(|i| (i % 13) as f32 * 0.5).collect();
    let s = be.add(&up(&be, &a, &[n]), &up(&be, &b, &[n])).unwrap();
    let got = down(&be, &s);
    let want: Vec<f32> = a.iter().zip(&b).map(|(x, y)| x + y).collect();
    check_exact(&format!("add over {n} elements (2-D grid)"), &got, &want);
}

/// The f16 compute format through the moves that must take it: `to_compute_format` rounds
/// (checked per element by `up_f16`), and download, copy, narrow_rows, concat_rows and
/// concat_cols keep f16 and its values bit for bit, at odd element offsets and lengths (one
/// f16 is half a word: the kernel path) and even ones (buffer copies), on both binding sizes.
#[test]
fn f16_moves_keep_the_values_bit_exact() {
    for p in paths(wgpu_f16_both()) {
        dflash_tests::ops::storage::compute_format_moves(&p);
    }
}

/// Rounding into f16 at the edges of its range (round to nearest even; what WGSL leaves
/// undefined, spelled out), parts of two dtypes, the ops that read f32 only (each an error
/// naming the op, the dtype and the device, never garbage), and `DFLASH_WGPU_F16`'s off
/// switch (`WgpuOptions::f16 = false`: the compute format stays f32).
#[test]
fn f16_rounding_edges_and_clean_errors() {
    let Some(f32_be) = wgpu() else { return };
    assert_eq!(f32_be.compute_format(), DType::F32);
    let t = f32_be
        .to_compute_format(up(&f32_be, &[0.1, -3.0], &[2]))
        .unwrap();
    assert_eq!(dtype(&t), DType::F32);
    check_exact(
        "to_compute_format with f16 off",
        &down(&f32_be, &t),
        &[0.1, -3.0],
    );
    let Some(be) = wgpu_f16() else { return };
    let x = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        70000.0,
        65520.0,
        65519.0,
        -65510.0,
        65504.0,
        1.0 + 2f32.powi(-11),       // a tie: to even (1.0)
        1.0 + 3.0 * 2f32.powi(-11), // a tie: to even (1 + 2^-9)
        2f32.powi(-24),             // the smallest subnormal
        2f32.powi(-26),             // below half of it: 0
        -0.0,
    ];
    let t = be.to_compute_format(up(&be, &x, &[x.len()])).unwrap();
    let got = down(&be, &t);
    let want = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::INFINITY,
        f32::INFINITY,
        65504.0,
        -65504.0,
        65504.0,
        1.0,
        1.0 + 2f32.powi(-9),
        2f32.powi(-24),
        0.0,
        -0.0,
    ];
    assert!(got[0].is_nan(), "NaN rounds to NaN, got {}", got[0]);
    check_exact("f16 rounding at the range's edges", &got[1..], &want[1..]);
    let (a, _) = up_f16(&be, &[1.0; 6], &[2, 3]);
    let b = up(&be, &[1.0; 6], &[2, 3]);
    assert_err(
        be.concat_rows(&[&a, &b]),
        &["concat_rows", "f16", "f32", "wgpu:0"],
    );
    let e = assert_err(be.add(&a, &b), &["add", "[2, 3]", "f16", "wgpu:0"]);
    println!("  {e}");
    assert_err(be.sum_squares(&a), &["sum_squares", "f16", "wgpu:0"]);
    let mut acc = be.copy(&a).unwrap();
    assert_err(
        be.scale_assign(&mut acc, 2.0),
        &["scale_assign", "f16", "wgpu:0"],
    );
}

/// `upload_frozen` (the checkpoint loader): the shared body (`storage::upload_frozen`: f32,
/// bf16 and f16 files, unaligned, chunked), with the f16 compute format and without.
#[test]
fn upload_frozen_matches_the_compute_format_of_the_widened_data() {
    let mut backends = Vec::new();
    if let Some(b) = wgpu() {
        backends.push(("f32 compute format", b));
    }
    if let Some(b) = wgpu_f16() {
        backends.push(("f16 compute format", b));
    }
    for p in paths(backends) {
        dflash_tests::ops::storage::upload_frozen(&p);
    }
}

/// Round to nearest even into f16, over its whole range: every finite f16 value (normal,
/// subnormal, both signs) comes back as itself; the exact midpoint between two neighbours goes
/// to the one with an even mantissa; one f32 ulp below / above it goes down / up (past 65504,
/// "up" is infinity).
#[test]
fn f16_rounding_is_nearest_even_over_the_whole_range() {
    let Some(be) = wgpu_f16() else { return };
    let widen = |bits: &[u16]| {
        let bytes: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
        HostSlice::F16(&bytes).to_f32_vec()
    };
    let finite: Vec<u16> = (0..0x7c00u16).chain(0x8000..0xfc00).collect();
    let vals = widen(&finite);
    let t = be.to_compute_format(up(&be, &vals, &[vals.len()])).unwrap();
    check_exact("every finite f16 value", &down(&be, &t), &vals);
    // Neighbours (h, h + 1) over the positive range, up to (65504, infinity).
    let lo: Vec<u16> = (0..0x7bffu16 + 1).collect();
    let hi: Vec<u16> = lo.iter().map(|h| h + 1).collect();
    let (a, b) = (widen(&lo), widen(&hi));
    // Past 65504 the next step would be 65536: the midpoint there is 65520.
    let mid: Vec<f32> = a
        .iter()
        .zip(&b)
        .map(|(&x, &y)| ((x as f64 + if y.is_finite() { y as f64 } else { 65536.0 }) / 2.0) as f32)
        .collect();
    let below: Vec<f32> = mid
        .iter()
        .map(|m| f32::from_bits(m.to_bits() - 1))
        .collect();
    let above: Vec<f32> = mid
        .iter()
        .map(|m| f32::from_bits(m.to_bits() + 1))
        .collect();
    let even: Vec<f32> = lo
        .iter()
        .zip(a.iter().zip(&b))
        .map(|(h, (&x, &y))| if h % 2 == 0 { x } else { y })
        .collect();
    for (name, input, want) in [
        ("midpoints: to even", &mid, &even),
        ("one ulp below the midpoints: down", &below, &a),
        ("one ulp above the midpoints: up", &above, &b),
    ] {
        let t = be
            .to_compute_format(up(&be, input, &[input.len()]))
            .unwrap();
        check_exact(name, &down(&be, &t), want);
    }
}
