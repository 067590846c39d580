//! Every registered host attention kernel on the DFlash training mask, forward and
//! forward+backward. Throughput is reported over *visible* pairs (the unit of docs/design.md §4):
//! 4 * Hq * D FLOPs per pair forward, 3.5x that forward + backward.
//!
//! `cargo bench -p dflash-tests --bench attention`

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use dflash_core::mask::BlockMask;
use dflash_core::{AttnBackward, AttnDims, AttnForward, registry};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn random(seed: u64, n: usize) -> Vec<f32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

fn bench(c: &mut Criterion) {
    dflash_backend_reference::link();
    dflash_attention_tiled::link();
    // A training-like shape scaled to a CPU: ctx 1024 + 64 blocks of 16, 8 q / 2 kv heads, D 64.
    let (s, n, bs, hq, hkv, d) = (1024usize, 64usize, 16usize, 8usize, 2usize, 64usize);
    let anchors: Vec<i32> = (0..n as i32).map(|b| 15 * b + 7).collect();
    let mask = BlockMask::dflash(s, bs, &anchors).expect("valid geometry");
    let dims = AttnDims {
        q_rows: mask.q_len(),
        kv_rows: mask.kv_len(),
        q_heads: hq,
        kv_heads: hkv,
        head_dim: d,
    };
    let (nq, nk) = (dims.q_rows * hq * d, dims.kv_rows * hkv * d);
    let (q, k, v, d_out) = (random(1, nq), random(2, nk), random(3, nk), random(4, nq));
    let scale = (d as f32).powf(-0.5);
    let fwd_flops = mask.visible_pairs() * 4 * (hq * d) as u64;

    let mut group = c.benchmark_group("dflash_s1024_n64_hq8_hkv2_d64");
    group.sample_size(10);
    for name in registry::attention_kernel_names() {
        let kernel = registry::create_host_attention(&name).expect("registered");
        let mut out = vec![0f32; nq];
        let mut lse = vec![0f32; dims.q_rows * hq];
        group.throughput(Throughput::Elements(fwd_flops));
        group.bench_function(format!("{name}/fwd"), |b| {
            b.iter(|| {
                let call =
                    AttnForward::new(&dims, &mask, scale, [&q, &k, &v], [&mut out, &mut lse]);
                kernel.forward(call.unwrap()).unwrap()
            })
        });
        let (mut dq, mut dk, mut dv) = (vec![0f32; nq], vec![0f32; nk], vec![0f32; nk]);
        group.throughput(Throughput::Elements(fwd_flops * 7 / 2));
        group.bench_function(format!("{name}/fwd+bwd"), |b| {
            b.iter(|| {
                let call =
                    AttnForward::new(&dims, &mask, scale, [&q, &k, &v], [&mut out, &mut lse]);
                kernel.forward(call.unwrap()).unwrap();
                let call = AttnBackward::new(
                    &dims,
                    &mask,
                    scale,
                    [&q, &k, &v, &out, &lse, &d_out],
                    [&mut dq, &mut dk, &mut dv],
                );
                kernel.backward(call.unwrap()).unwrap()
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
