//! `DFLASH_WGPU_PROFILE=1`: the per-kernel device-time report counts every dispatch of a
//! kernel, gives it a positive time, and starts from zero after each report. Its own test
//! binary: the switch is read once per process, before the device opens. Skips cleanly
//! without an adapter, or where the adapter writes no timestamps.

mod common;

use dflash_core::{GemmOps, MemoryOps, Transpose};

#[test]
fn profile_counts_each_dispatch_of_a_kernel() {
    // SAFETY: set before any backend exists, in the only test of this binary.
    unsafe { std::env::set_var("DFLASH_WGPU_PROFILE", "1") };
    let Some(be) = common::wgpu() else {
        return;
    };
    if !be.profiling() {
        println!("skipped: the adapter writes no timestamps (TIMESTAMP_QUERY)");
        return;
    }
    let _ = be.take_profile(); // whatever set-up ran
    let a = be
        .upload(
            &common::rand_vec(&mut common::rng(7), 96 * 80, 1.0),
            &[96, 80],
        )
        .unwrap();
    for _ in 0..3 {
        be.matmul(&a, Transpose::No, &a, Transpose::Yes).unwrap();
    }
    let report = be.take_profile().expect("a report after three products");
    println!("{report}");
    let line = report
        .lines()
        .find(|l| l.trim_start().starts_with("matmul128 "))
        .unwrap_or_else(|| panic!("no matmul128 line in\n{report}"));
    // `matmul128 96x96x80 t01 f32/32   <ms> ms <share>% <n> dispatches ...`: the GEMM's
    // shape is part of its label.
    assert!(line.contains(" 96x96x80 t01 f32/32 "), "{line}");
    let fields: Vec<&str> = line.split_whitespace().collect();
    assert!(line.contains(" 3 dispatches"), "{line}");
    let at_ms = fields.iter().position(|&f| f == "ms").unwrap();
    let ms: f64 = fields[at_ms - 1].parse().unwrap();
    assert!(ms > 0.0, "{line}");
    assert_eq!(
        be.take_profile(),
        None,
        "the totals start again after a report"
    );
}
