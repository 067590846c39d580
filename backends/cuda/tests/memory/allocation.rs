//! Allocations: the bytes a bf16 activation output takes, and running out of device memory.

use dflash_backend_cuda::DType;
use dflash_core::MemoryOps;

use crate::common::*;

/// Peak memory: a `linear` whose output is a bf16 activation allocates half the output bytes
/// of the f32 one (operands bf16, read in place by the bf16 GEMM: the output is the only
/// allocation). Reads the device pool's peak, so it needs `--test-threads 1` (as run_all.sh
/// runs it).
#[test]
fn linear_bf16_activations_halve_the_output_allocation() {
    use dflash_backend_cuda::GemmPrecision;
    use dflash_core::{BackendInfo, GemmOps};
    let (Some(c32), Some(c16)) = (
        cuda_act(GemmPrecision::Bf16, DType::F32),
        cuda_act(GemmPrecision::Bf16, DType::Bf16),
    ) else {
        return;
    };
    let (t, k, n) = (4096usize, 256usize, 4096usize); // output 64 MiB f32, 32 MiB bf16
    let mut r = rng(212);
    let x = rand_vec(&mut r, t * k, 1.0);
    let w = rand_vec(&mut r, n * k, 1.0);
    let mut growth = Vec::new();
    for cu in [&c32, &c16] {
        let xb = up_bf16(cu, &x, &[t, k]);
        let wb = up_bf16(cu, &w, &[n, k]);
        // Warm the plan cache (the heuristic query) outside the measurement.
        drop(cu.linear(&xb, &wb).unwrap());
        cu.synchronize().unwrap();
        cu.reset_peak_memory();
        let Some(before) = cu.memory_stats() else {
            println!("  memory_stats: not available on this device");
            return;
        };
        let y = cu.linear(&xb, &wb).unwrap();
        cu.synchronize().unwrap();
        let after = cu.memory_stats().unwrap();
        let g = after.peak_bytes.saturating_sub(before.in_use_bytes);
        println!(
            "  linear {t}x{k}x{n}, {} activations: pool peak grew by {:.2} MiB",
            dtype_of(&y).name(),
            g as f64 / (1 << 20) as f64
        );
        growth.push(g);
        drop(y);
    }
    let out32 = (t * n * 4) as u64;
    assert!(
        growth[0] >= out32,
        "f32 output must be allocated: {growth:?}"
    );
    assert!(
        growth[1] >= out32 / 2 && growth[1] <= out32 / 2 + (2 << 20),
        "bf16 output must take half the bytes (+ <= 2 MiB pool granularity): {growth:?}"
    );
    assert!(growth[1] * 2 <= growth[0] + (4 << 20), "{growth:?}");
}

/// An allocation the device cannot hold is `Error::OutOfMemory` naming op, device, size and
/// the device's free/total memory (so a job can name its knobs), not a generic driver error;
/// the backend stays usable afterwards.
#[test]
fn allocation_beyond_the_device_is_out_of_memory() {
    let Some(cu) = cuda() else { return };
    let n: usize = 1 << 40; // 4 TiB of f32: more than any GPU has
    match cu.zeros(&[n]) {
        Err(dflash_core::Error::OutOfMemory {
            op,
            device,
            requested,
            free,
            total,
        }) => {
            assert_eq!(op, "zeros");
            assert_eq!(device, "cuda:0");
            assert_eq!(requested, 4 * n as u64);
            let (free, total) = (free.expect("free bytes"), total.expect("total bytes"));
            assert!(
                free <= total && total > 1 << 30,
                "free {free}, total {total}"
            );
            println!("  4 TiB zeros -> out of memory ({free} of {total} bytes free)");
        }
        Err(e) => panic!("expected OutOfMemory, got: {e}"),
        Ok(_) => panic!("allocated 4 TiB"),
    }
    let x = rand_vec(&mut rng(3), 1000, 1.0);
    assert_eq!(
        down(&cu, &up(&cu, &x, &[1000])),
        x,
        "usable after the failure"
    );
}

/// Memory freed into the device pool stays reserved for reuse (the pool keeps it), so the
/// device's free memory does not count it; `release_cached_memory` returns it, and a memory
/// plan made after earlier work sees it free again. Reads device-wide free memory, so it
/// needs `--test-threads 1` (as run_all.sh runs it).
#[test]
fn released_cache_counts_as_free() {
    use dflash_core::BackendInfo;
    let Some(cu) = cuda() else { return };
    if cu.memory_stats().is_none() {
        println!("  no stream-ordered pool on this device: nothing is cached");
        return;
    }
    let bytes: u64 = 2 << 30;
    let t = cu.zeros(&[(bytes / 4) as usize]).unwrap();
    cu.synchronize().unwrap();
    let held = cu
        .memory_capacity()
        .expect("the CUDA backend reports capacity")
        .free;
    drop(t);
    cu.synchronize().unwrap();
    let cached = cu.memory_capacity().unwrap().free;
    cu.release_cached_memory();
    let released = cu.memory_capacity().unwrap().free;
    println!(
        "  free: {held} with 2 GiB live, {cached} after the drop, {released} after the release"
    );
    // The pool's chunks are coarser than one allocation: allow 64 MiB either way.
    let slack: u64 = 64 << 20;
    assert!(
        cached < held + slack,
        "the pool keeps a dropped tensor: {cached} vs {held}"
    );
    assert!(
        released + slack >= held + bytes,
        "the release returns it: {released} vs {held} + {bytes}"
    );
}
