//! The subgroup kernels of `wgpu-tiled` on any adapter with subgroups: the forward
//! (attention_fwd_sg.wgsl) with the query tile staged, with the query rows in registers
//! (`attn_qreg`), and on key tiles twice as wide, two keys a lane (`attn_wide_tiles`); dq with
//! q and d_out rows in registers (`attn_dq_subgroups`, attention_dq_sg.wgsl), dk/dv with k
//! and v rows in registers (`attn_dkdv_subgroups`, attention_dkdv_sg.wgsl); and what ships,
//! all of them together. `WgpuOptions::attn_subgroup_tiles` puts them on their tiles (BK =
//! DP / 4 keys, one a lane) wherever the adapter's subgroups hold BK lanes. The suite runs
//! forward and backward, so each variant's dq and dk/dv are checked too.
//!
//! On lavapipe the subgroup width follows the LLVM vector width, so this file runs it 512
//! bits wide where the CPU has AVX-512, the widest that works (at 1024 Mesa 22.3 reports 32
//! lanes but runs 16: its shuffles across 16 return 0). With 16-lane subgroups head dims 32
//! (8-key tiles, two row groups a subgroup) and 64 (16-key tiles: two key groups and two
//! register columns a lane with query registers) take the kernels; 128 needs 32 lanes (a GPU
//! such as the H200 runs all three here). Every suite mask, the large masks, the k and v NaN
//! cases, one pass and passes of 3 list iterations (the softmax state carried between
//! dispatches), vec4 and scalar reads, against the f64 oracle; and the shipped subgroup
//! kernels on f16 inputs against f32 ones holding the same values, bit for bit.
//!
//! One test in this file: it sets the environment before the adapter starts.

mod common;

use common::*;
use dflash_backend_wgpu::{WgpuBackend, WgpuOptions};
use dflash_core::registry::BackendOptions;
use dflash_tests::{F32_KERNEL, Layout, cases_on, large_score_cases};

/// Head dims 32 (BK 8), 22 (padded to 32, scalar reads), 64 (BK 16), 128 (BK 32).
const LAYOUTS: [Layout; 4] = [
    Layout::new(4, 2, 32),
    Layout::new(2, 1, 22),
    Layout::new(4, 2, 64),
    Layout::new(4, 2, 128),
];

fn check(be: &WgpuBackend, label: &str, layout: Layout) {
    let masks = dflash_tests::suite_masks().expect("suite masks");
    let mut cases = cases_on(&masks, &[layout]);
    let large = dflash_tests::large_masks().expect("large masks");
    cases.extend(cases_on(&large, &[layout]));
    cases.extend(large_score_cases(layout).unwrap());
    run_suite(be, label, &cases, &F32_KERNEL);
    if layout.kv_heads >= 2 {
        run_nan_cases(be, label, layout);
    }
}

#[test]
fn subgroup_kernels_match_the_oracle_on_every_head_dim_they_take() {
    // 512-bit vectors only where the CPU has them (AVX-512): measured correct there; on a
    // narrower CPU lavapipe keeps its 8-lane subgroups and head dim 64 goes untested.
    let wide = std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|c| c.contains(" avx512f"));
    let set = wide && std::env::var_os("LP_NATIVE_VECTOR_WIDTH").is_none();
    if set {
        // SAFETY: the only test of this binary, before any adapter (or other thread that
        // could read the environment) starts.
        unsafe { std::env::set_var("LP_NATIVE_VECTOR_WIDTH", "512") };
    }
    let Some(be) = wgpu_with("wgpu-tiled", None) else {
        return;
    };
    if !be.subgroups() {
        skip("the adapter has no subgroup operations");
        return;
    }
    let (_, widest) = be.subgroup_sizes();
    if set && be.summary().contains("llvmpipe") {
        assert!(
            widest >= 16,
            "lavapipe ignored LP_NATIVE_VECTOR_WIDTH (subgroups of {widest} lanes): head dim 64 \
             would go untested"
        );
    }
    let backend = BackendOptions {
        attention: "wgpu-tiled".into(),
        ..Default::default()
    };
    let mut ran = Vec::new();
    // (query registers, two keys a lane, the backward's dq and dk/dv on subgroups)
    let variants = [
        (false, false, false),
        (true, false, false),
        (true, true, false),
        (false, false, true),
        (true, true, true),
    ];
    for (qreg, wide, bwd_sg) in variants {
        for passes in [None, Some(3)] {
            let opts = WgpuOptions {
                attn_subgroup_tiles: true,
                attn_qreg: qreg,
                attn_wide_tiles: wide,
                attn_dq_subgroups: bwd_sg,
                attn_dkdv_subgroups: bwd_sg,
                attn_pass_tiles: passes,
                ..be.options()
            };
            let sg = WgpuBackend::with_options(&backend, opts).unwrap();
            for layout in LAYOUTS {
                let [fwd, dq, dkdv] = sg.tiled_kernels(layout.head_dim).unwrap();
                if !fwd.starts_with("attention_fwd_sg.wgsl") {
                    println!(
                        "head dim {}: {fwd} (not the subgroup forward)",
                        layout.head_dim
                    );
                    continue;
                }
                assert_eq!(fwd.contains("q in registers"), qreg, "{fwd}");
                assert_eq!(fwd.contains("2 keys a lane"), wide, "{fwd}");
                assert_eq!(dq.starts_with("attention_dq_sg.wgsl"), bwd_sg, "{dq}");
                assert_eq!(dkdv.starts_with("attention_dkdv_sg.wgsl"), bwd_sg, "{dkdv}");
                let label = match bwd_sg {
                    true => format!("{fwd} with {dq} and {dkdv}, passes of {passes:?}"),
                    false => format!("{fwd}, passes of {passes:?}"),
                };
                check(&sg, &label, layout);
                ran.push(label);
            }
        }
    }
    println!("ran: {ran:#?}");
    check_f16_inputs_on_subgroups(&backend, widest);
    // Every adapter with subgroups of 8+ lanes takes head dim 32 both ways, 16+ lanes head
    // dim 64, 32-lane ones (NVIDIA) head dim 128.
    let took = |dp: &str, (qreg, wide, bwd_sg): (bool, bool, bool)| {
        ran.iter().any(|l| {
            l.starts_with(&format!("attention_fwd_sg.wgsl ({dp}"))
                && l.contains(", q in registers") == qreg
                && l.contains("2 keys a lane") == wide
                && l.contains("attention_dq_sg.wgsl") == bwd_sg
                && l.contains("attention_dkdv_sg.wgsl") == bwd_sg
        })
    };
    for v in variants {
        assert!(took("DP 32,", v), "{v:?}: {ran:?}");
        if widest >= 16 {
            assert!(took("DP 64,", v), "{v:?}: {ran:?}");
        }
        if widest >= 32 && v.0 {
            assert!(took("DP 128,", v), "{v:?}: {ran:?}");
        }
    }
}

/// Every subgroup kernel on f16 inputs (widened into f32 copies first), shipped
/// variants together: bit for bit the f32 path at head dims 32, 22 (scalar reads) and, with
/// 16+ lanes, 64.
fn check_f16_inputs_on_subgroups(backend: &BackendOptions, widest: u32) {
    let Some(f16) = wgpu_f16_with("wgpu-tiled", None) else {
        return;
    };
    let opts = WgpuOptions {
        attn_subgroup_tiles: true,
        ..f16.options()
    };
    let sg = WgpuBackend::with_options(backend, opts).unwrap();
    let mut r = rng(33);
    for (hq, hk, d) in [(4, 2, 32), (2, 1, 22), (4, 2, 64)] {
        if d == 64 && widest < 16 {
            continue;
        }
        let [fwd, dq, dkdv] = sg.tiled_kernels(d).unwrap();
        for k in [&fwd, &dq, &dkdv] {
            assert!(k.contains("_sg.wgsl"), "head dim {d}: {k}");
        }
        check_f16_inputs_exact(
            &sg,
            &format!("{fwd}, {dq}, {dkdv}"),
            &mut r,
            (45, hq, hk, d),
        );
    }
}
