//! The f32 <-> bf16 conversion kernels: bit-exact against the host, and their bandwidth.

use dflash_backend_cuda::DType;
use dflash_core::MemoryOps;
use rand::Rng;

use crate::common::*;

/// The conversion kernels against a host round-to-nearest-even (the `half` crate): every
/// length class of the 8-wide vector path and its tail, bit-exact on NaN (quieted, sign and
/// high payload kept), infinities, signed zeros, denormals, exact ties (to even), values next
/// to ties, overflow to infinity; every bf16 bit pattern with each kind of low half; and
/// random bit patterns. bf16 -> f32 must be the exact widening.
#[test]
fn bf16_conversion_is_rne_bit_exact() {
    let Some(cu) = cuda() else { return };
    let mut r = rng(102);
    let specials: Vec<u32> = vec![
        0x7fc0_0000,
        0xffc0_0000,
        0x7f80_0001,
        0xff80_0001,
        0x7f80_8000,
        0x7fbf_ffff,
        0x7fff_ffff,
        0xffff_ffff,
        0x7fa0_0000, // NaNs: quiet, signalling, payloads
        0x7f80_0000,
        0xff80_0000,
        0x0000_0000,
        0x8000_0000, // +-inf, +-0
        0x0000_0001,
        0x8000_0001,
        0x0000_8000,
        0x0001_8000,
        0x0000_7fff,
        0x0000_8001,
        0x007f_ffff,
        0x807f_ffff,
        0x0040_0000,
        0x007f_8000, // denormals (ties included)
        0x3f80_8000,
        0x3f81_8000,
        0xbf80_8000,
        0xbf81_8000, // ties: to even (down / up)
        0x3f80_7fff,
        0x3f80_8001,
        0x3f81_7fff,
        0x3f81_8001, // next to ties
        0x7f7f_ffff,
        0xff7f_ffff,
        0x7f7f_8000,
        0x7f7e_8000,
        0x7f7f_7fff, // overflow to inf
        0x0080_0000,
        0x3f80_0000,
        0x4049_0fdb, // min normal, 1, pi
    ];
    let mut bits: Vec<u32> = specials.clone();
    // Every bf16 pattern with low halves 0 (exact), 0x8000 (a tie), 0x7fff, 0x8001.
    for low in [0u32, 0x8000, 0x7fff, 0x8001] {
        bits.extend((0..=0xffffu32).map(|h| (h << 16) | low));
    }
    bits.extend((0..1_000_003).map(|_| r.random::<u32>()));
    // Specials also at the end, in the scalar tail of the vector path.
    bits.extend(&specials);
    let x: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b)).collect();
    let host = |v: &[f32]| -> Vec<u32> {
        v.iter()
            .map(|&f| (half::bf16::from_f32(f).to_bits() as u32) << 16)
            .collect()
    };
    let total = x.len();
    for n in [
        1,
        2,
        3,
        7,
        8,
        9,
        15,
        16,
        17,
        1001,
        4099,
        65_541,
        total - 1,
        total,
    ] {
        let v = &x[total - n..]; // tails end in the specials
        let t = up(&cu, v, &[n]);
        let b = cu.to_dtype(&t, DType::Bf16).unwrap();
        assert_eq!(dtype_of(&b), DType::Bf16);
        let want = host(v);
        // bf16 -> f32 (to_dtype) and download (which widens with the same kernel).
        let wide = cu.to_dtype(&b, DType::F32).unwrap();
        assert_eq!(dtype_of(&wide), DType::F32);
        for (what, got) in [
            ("to_dtype(F32)", down(&cu, &wide)),
            ("download", down(&cu, &b)),
        ] {
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    *w,
                    "n = {n}, {what}, element {i}: input {:#010x} -> {:#010x}, want {w:#010x}",
                    v[i].to_bits(),
                    g.to_bits()
                );
            }
        }
    }
    let nan_in = x.iter().filter(|v| v.is_nan()).count();
    println!(
        "  f32 -> bf16 -> f32 bit-exact vs host RNE        {total} values ({nan_in} NaN), 14 lengths"
    );
}

/// Informational: the f32 <-> bf16 conversions in GB/s (f32 -> bf16 moves 6 bytes per
/// element: 4 read, 2 written), against a device-to-device copy of the f32 tensor measured
/// here (and the H200's nominal 4.22 TB/s copy ceiling). Poison off.
#[test]
fn bf16_conversion_bandwidth() {
    use dflash_backend_cuda::{CudaBackend, CudaOptions, GemmPrecision};
    use dflash_core::registry::BackendOptions;
    let Some(_) = cuda() else { return };
    let opts = BackendOptions {
        attention: "cuda-simple".into(),
        threads: 0,
        device: 0,
    };
    let cu = CudaBackend::with_options(
        &opts,
        CudaOptions {
            gemm: GemmPrecision::Tf32,
            activations: DType::F32,
            poison: false,
            attn_forward_ctas: None,
        },
    )
    .unwrap();
    let n = 256usize << 20; // 1 GiB of f32
    let x = cu.random_normal(&[n], 1.0, 7).unwrap();
    let xb = cu.to_dtype(&x, DType::Bf16).unwrap();
    let iters = 10;
    let time = |f: &dyn Fn()| {
        f(); // warm-up (pool growth)
        cu.synchronize().unwrap();
        let t0 = std::time::Instant::now();
        for _ in 0..iters {
            f();
        }
        cu.synchronize().unwrap();
        t0.elapsed().as_secs_f64() / iters as f64
    };
    let t_copy = time(&|| drop(cu.copy(&x).unwrap()));
    let t_down = time(&|| drop(cu.to_dtype(&x, DType::Bf16).unwrap()));
    let t_up = time(&|| drop(cu.to_dtype(&xb, DType::F32).unwrap()));
    let gbs = |bytes: usize, t: f64| bytes as f64 / t / 1e9;
    let copy = gbs(8 * n, t_copy);
    for (name, t) in [("f32 -> bf16", t_down), ("bf16 -> f32", t_up)] {
        let bw = gbs(6 * n, t);
        println!(
            "  {name} {n} elements: {:.3} ms, {bw:.0} GB/s = {:.2} of this run's D2D copy \
             ({copy:.0} GB/s), {:.2} of 4220 GB/s",
            t * 1e3,
            bw / copy,
            bw / 4220.0
        );
    }
}
