//! The `DFLASH_WGPU_ROBUSTNESS=off` measurement switch (src/robustness.rs): the Vulkan device it
//! opens by hand, without robust buffer access, runs the kernels as the device wgpu opens does,
//! so the GPU runs that time the driver's bounds checks measure working kernels. Its own test
//! executable: the switch is read when a process first opens its device. Skips without a Vulkan
//! adapter (the switch is Vulkan's).

mod common;

use common::*;
use dflash_core::{GemmOps, Transpose};

#[test]
fn a_device_without_robust_buffer_access_computes_the_products() {
    let names = dflash_backend_wgpu::device::adapter_names();
    if !names.first().is_some_and(|n| n.contains("Vulkan")) {
        skip(&format!("no Vulkan adapter first (adapters: {names:?})"));
        return;
    }
    // SAFETY: set before this process opens its device or starts a thread that reads the
    // environment (the only test of this executable).
    unsafe { std::env::set_var("DFLASH_WGPU_ROBUSTNESS", "off") };
    let Some(be) = wgpu() else { return };
    assert!(
        be.summary().contains("robust buffer access off"),
        "the switch was not applied: {}",
        be.summary()
    );
    let mut r = rng(11);
    // Edge tiles in every dimension of the 128 x 128 kernel, both transposes of b.
    let (m, k, n) = (130, 257, 67);
    for tb in [false, true] {
        let a = rand_vec(&mut r, m * k, 1.0);
        let b = rand_vec(&mut r, k * n, 1.0);
        let bsh = if tb { [n, k] } else { [k, n] };
        let (wa, wb) = (up(&be, &a, &[m, k]), up(&be, &b, &bsh));
        let tr = if tb { Transpose::Yes } else { Transpose::No };
        let c = be.matmul(&wa, Transpose::No, &wb, tr).expect("matmul");
        let (want, scale) = naive(&a, false, &b, tb, (m, k, n));
        let name = format!("matmul {m}x{k}x{n} tb={tb}, no robust buffer access");
        let worst = check_gemm(&name, &down(&be, &c), &want, &scale);
        println!("  {name}: worst err/sum|a||b| {worst:.2e} (tol {GEMM_TOL:e})");
    }
}
