//! What crossing the C ABI costs per call: the `tiled` kernel called directly and through the
//! loader and the Rust example plugin (same kernel, same inputs), on a call small enough
//! (4 rows, 1 head, D 16) that the kernel's own work is a few hundred nanoseconds and the
//! difference is the ABI path: describing the call as DLTensors and mask arrays, the workspace
//! query, the plugin's checks and its rebuilding of the mask. Goal: < 5 us per call.

use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use dflash_attention_loader::{Plugin, PluginKernel};
use dflash_attention_tiled::TiledAttention;
use dflash_core::mask::BlockMask;
use dflash_core::{AttnDims, AttnForward, HostAttentionKernel};

fn forward_once(kernel: &dyn HostAttentionKernel, mask: &BlockMask, bufs: &mut [Vec<f32>; 5]) {
    let dims = AttnDims {
        q_rows: mask.q_len(),
        kv_rows: mask.kv_len(),
        q_heads: 1,
        kv_heads: 1,
        head_dim: 16,
    };
    let [q, k, v, out, lse] = bufs;
    let call = AttnForward::new(&dims, mask, 0.25, [q, k, v], [out, lse]).expect("valid call");
    kernel.forward(call).expect("forward");
}

fn bench(c: &mut Criterion) {
    let mask = BlockMask::causal(4).expect("mask");
    let n = 4 * 16;
    let mut bufs = [n, n, n, n, 4].map(|len| vec![0.5f32; len]);
    let direct = TiledAttention::new();
    // SAFETY: the example's entry point is the header's.
    let plugin = unsafe {
        Plugin::from_entry(
            "rust-tiled",
            dflash_plugin_rust_tiled::dflash_attention_plugin,
        )
    }
    .expect("open");
    let through_abi = PluginKernel::new(Arc::new(plugin)).expect("cpu f32");
    let mut g = c.benchmark_group("attention_call_causal4_d16");
    g.bench_function("tiled_direct", |b| {
        b.iter(|| forward_once(&direct, &mask, &mut bufs))
    });
    g.bench_function("tiled_through_abi", |b| {
        b.iter(|| forward_once(&through_abi, &mask, &mut bufs))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
