//! Availability, NVRTC compilation, error messages, use from many threads, device-side
//! random weights with memory accounting, and an information-only timing report.
//!
//! Skips cleanly without CUDA; inputs, poisoning and the tolerance scheme: `common`.

mod common;

use std::sync::Arc;

use rand::Rng;

use common::*;
use dflash_backend_cuda::{CudaBackend, GemmPrecision};
use dflash_core::mask::BlockMask;
use dflash_core::registry::{BackendOptions, create_backend};
use dflash_core::{
    AdamWParams, AttentionOps, BackendInfo, EmbeddingOps, Error, GemmOps, LossOps, MemoryOps,
    NormOps, OptimizerOps, Tensor, Transpose,
};

// ---------------------------------------------------------------------------------------
// Availability and errors

#[test]
fn create_backend_cuda_is_clean() {
    dflash_backend_cuda::link();
    dflash_backend_reference::link();
    let opts = BackendOptions {
        attention: "cuda-simple".into(),
        threads: 0,
        device: 0,
    };
    match create_backend("cuda", &opts) {
        Ok(b) => {
            println!("cuda backend available: {}", b.device());
            assert!(b.device().starts_with("cuda:0 ("), "{}", b.device());
            assert_eq!(b.name(), "cuda");
            // A device that does not exist is Unavailable too, not a panic.
            let far = BackendOptions {
                device: 999,
                ..opts.clone()
            };
            match create_backend("cuda", &far) {
                Err(Error::Unavailable { reason, .. }) => println!("device 999: {reason}"),
                other => panic!(
                    "device 999 should be Unavailable, got {:?}",
                    other.map(|b| b.device())
                ),
            }
            // An unknown attention kernel lists the device and host kernels.
            let bad = BackendOptions {
                attention: "nope".into(),
                ..opts
            };
            let e = create_backend("cuda", &bad)
                .err()
                .expect("unknown kernel is an error");
            assert!(e.to_string().contains("cuda-simple"), "{e}");
            assert!(e.to_string().contains("cuda-flash"), "{e}");
        }
        Err(Error::Unavailable { name, reason }) => {
            assert_eq!(name, "cuda");
            println!(
                "skipped: no CUDA device ({reason}); create_backend(\"cuda\") returned a clean Unavailable error"
            );
        }
        Err(e) => panic!("expected a backend or Unavailable, got {e}"),
    }
}

/// Every kernel file compiles with NVRTC for compute_90 wherever NVRTC can be loaded (it
/// needs no GPU), and a broken source is a typed error carrying NVRTC's log.
/// `attention.cu` is split into parts that NVRTC cannot read from disk: `flash_source` must
/// splice in every `#include "attention/..."` of the root, each part must be a file of
/// `kernels/attention/` and every such file a listed part (a new part cannot be forgotten).
/// Needs no GPU.
#[test]
fn flash_source_splices_every_part() {
    use dflash_backend_cuda::kernels::{FLASH_PARTS, flash_source};
    let (file, src) = flash_source();
    assert_eq!(file, "attention.cu");
    assert!(
        !src.contains("#include \"attention/"),
        "an include was left unexpanded"
    );
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels");
    let root = std::fs::read_to_string(dir.join("attention.cu")).unwrap();
    let includes = root
        .lines()
        .filter(|l| l.starts_with("#include \"attention/"))
        .count();
    assert_eq!(includes, FLASH_PARTS.len(), "root includes vs listed parts");
    let mut on_disk: Vec<String> = std::fs::read_dir(dir.join("attention"))
        .unwrap()
        .map(|e| format!("attention/{}", e.unwrap().file_name().to_string_lossy()))
        .collect();
    on_disk.sort();
    let mut listed: Vec<String> = FLASH_PARTS.iter().map(|(n, _)| n.to_string()).collect();
    listed.sort();
    assert_eq!(on_disk, listed);
    let mut at = 0;
    for (name, part) in FLASH_PARTS {
        let marker = format!("#line 1 \"{name}\"\n");
        let pos = src[at..]
            .find(&marker)
            .unwrap_or_else(|| panic!("{name} missing or out of order"))
            + at;
        assert!(
            src[pos + marker.len()..].starts_with(part),
            "{name} spliced whole"
        );
        at = pos + marker.len() + part.len();
    }
    println!(
        "  attention.cu: {} parts spliced in order, {} bytes",
        FLASH_PARTS.len(),
        src.len()
    );
}

#[test]
fn kernels_compile_with_nvrtc() {
    if unsafe { !dflash_backend_cuda::cudarc::nvrtc::sys::is_culib_present() } {
        println!(
            "skipped: no CUDA device (NVRTC library not found, so the kernels cannot be compiled here)"
        );
        return;
    }
    let (flash_file, flash_src) = dflash_backend_cuda::kernels::flash_source();
    let files: Vec<(&'static str, &str)> = dflash_backend_cuda::kernels::SOURCES
        .iter()
        .copied()
        .chain(std::iter::once((flash_file, flash_src.as_str())))
        .collect();
    let mut one_by_one = std::collections::HashMap::new();
    let mut sum = 0.0;
    for &(file, src) in &files {
        let t = std::time::Instant::now();
        let ptx = dflash_backend_cuda::kernels::compile(file, src, "compute_90")
            .unwrap_or_else(|e| panic!("{e}"));
        let ms = t.elapsed().as_secs_f64() * 1e3;
        sum += ms;
        println!("  {file:<22} compiles for compute_90 ({ms:.0} ms)");
        one_by_one.insert(file, ptx.to_src());
    }
    // What a device's start-up runs: every file at once, one thread each. The same PTX.
    let t = std::time::Instant::now();
    let all = dflash_backend_cuda::kernels::compile_all(&files, "compute_90");
    println!(
        "  all {} files in parallel: {:.0} ms (one at a time: {sum:.0} ms)",
        files.len(),
        t.elapsed().as_secs_f64() * 1e3
    );
    for (file, ptx) in all {
        let ptx = ptx.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(ptx.to_src(), one_by_one[file], "{file}");
    }
    let e = dflash_backend_cuda::kernels::compile(
        "broken.cu",
        "extern \"C\" __global__ void f() { undefined_thing(); }",
        "compute_90",
    )
    .expect_err("a broken kernel must not compile");
    let msg = e.to_string();
    assert!(matches!(e, dflash_backend_cuda::CudaError::Compile { .. }));
    assert!(
        msg.contains("broken.cu") && msg.contains("undefined_thing"),
        "{msg}"
    );
}

#[test]
fn errors_name_op_shapes_and_device() {
    let Some(cu) = cuda() else { return };
    let a = up(&cu, &[0.5; 12], &[3, 4]);
    let b = up(&cu, &[0.5; 10], &[5, 2]);
    let e = cu
        .matmul(&a, Transpose::No, &b, Transpose::No)
        .err()
        .unwrap();
    let s = e.to_string();
    assert!(matches!(e, Error::Shape { .. }));
    for needle in ["matmul", "[3, 4]", "[5, 2]", "cuda:0"] {
        assert!(s.contains(needle), "{needle:?} missing from {s:?}");
    }
    // Shapes whose element count overflows usize are shape errors, not wrapped allocations.
    let huge = [1usize << 32, 1 << 32];
    for (what, r) in [
        ("zeros", cu.zeros(&huge).map(drop)),
        ("random_normal", cu.random_normal(&huge, 1.0, 7).map(drop)),
        (
            "uninit",
            cu.uninit(&huge, dflash_backend_cuda::DType::F32).map(drop),
        ),
        ("upload", cu.upload(&[], &huge).map(drop)),
    ] {
        let e = r
            .err()
            .unwrap_or_else(|| panic!("{what} of {huge:?} succeeded"));
        assert!(matches!(e, Error::Shape { .. }), "{what}: {e}");
        assert!(e.to_string().contains("cuda:0"), "{what}: {e}");
    }
    let table = up(&cu, &[0.5; 8], &[4, 2]);
    let s = cu.embedding(&table, &[1, 7]).err().unwrap().to_string();
    for needle in ["embedding", "token id 7", "position 1", "V = 4", "cuda:0"] {
        assert!(s.contains(needle), "{needle:?} missing from {s:?}");
    }
    // A reference tensor given to the CUDA backend.
    let rf = reference();
    let host = up(&rf, &[0.5; 4], &[2, 2]);
    let e = cu.add(&host, &host).err().unwrap();
    assert!(matches!(e, Error::ForeignTensor { .. }), "{e}");
    assert!(e.to_string().contains("reference"), "{e}");
    let mut w = up(&cu, &[1.0; 4], &[4]);
    let e = cu
        .linear_cross_entropy(&a, &table, &[0, 1, 2], &[1.0, -1.0, 1.0], 1.0)
        .err()
        .unwrap();
    assert!(e.to_string().contains("must be (V, 4)"), "{e}");
    let e = cu
        .linear_cross_entropy(
            &a,
            &up(&cu, &[0.1; 8], &[2, 4]),
            &[0, 1, 2],
            &[1.0, -1.0, 1.0],
            1.0,
        )
        .err()
        .unwrap();
    assert!(e.to_string().contains("row 1: weight -1"), "{e}");
    let hp = AdamWParams {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
        step: 0,
        grad_scale: 1.0,
    };
    let (g, mut m, mut v) = (
        up(&cu, &[0.1; 4], &[4]),
        cu.zeros(&[4]).unwrap(),
        cu.zeros(&[4]).unwrap(),
    );
    let e = cu
        .adamw_step(&mut w, &g, &mut m, &mut v, &hp)
        .err()
        .unwrap();
    assert!(e.to_string().contains("1-based"), "{e}");
    println!("  error messages name op, shapes and device: ok");
}

// ---------------------------------------------------------------------------------------
// Threads

#[test]
fn backend_is_usable_from_many_threads() {
    let Some(cu) = cuda() else { return };
    let cu = Arc::new(cu);
    let rf = reference();
    let mut r = rng(12);
    let (m, k) = (64, 48);
    let a = rand_vec(&mut r, m * k, 1.0);
    let want = down(
        &rf,
        &rf.matmul(
            &up(&rf, &a, &[m, k]),
            Transpose::No,
            &up(&rf, &a, &[m, k]),
            Transpose::Yes,
        )
        .unwrap(),
    );
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let (cu, a) = (cu.clone(), a.clone());
            std::thread::spawn(move || {
                // A second backend on the same device shares the compiled kernels.
                let mine = CudaBackend::new(&BackendOptions {
                    attention: "cuda-simple".into(),
                    threads: 0,
                    device: 0,
                })
                .unwrap();
                let mut out = Vec::new();
                for be in [cu.as_ref(), &mine] {
                    let t: Tensor = be.upload(&a, &[m, k]).unwrap();
                    out.push(
                        be.download(&be.matmul(&t, Transpose::No, &t, Transpose::Yes).unwrap())
                            .unwrap(),
                    );
                }
                out
            })
        })
        .collect();
    for h in handles {
        for got in h.join().unwrap() {
            assert_close(
                "matmul from 8 threads x 2 backends",
                &got,
                &want,
                &Tolerance {
                    atol: 1e-2,
                    rtol: 1e-2,
                    atol_unit: AtolUnit::MaxWant,
                    why: "TF32 and the env-selected default (bf16: |err| <= 2^-8 * sum|a||b| ~ 0.05)",
                },
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// Timing (information only; no assertion beyond correctness elsewhere)

/// `n` values: 1M seeded random ones repeated (cheap to make at GB sizes; never zeros).
fn tiled(r: &mut rand_chacha::ChaCha8Rng, n: usize, s: f32) -> Vec<f32> {
    let base = rand_vec(r, n.min(1 << 20), s);
    base.iter().copied().cycle().take(n).collect()
}

/// Median wall time of `f` over `reps` runs after one warm-up, with the stream synchronised.
fn time_ms(cu: &CudaBackend, reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    cu.synchronize().unwrap();
    let mut ts: Vec<f64> = (0..reps)
        .map(|_| {
            let t = std::time::Instant::now();
            f();
            cu.synchronize().unwrap();
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    ts.sort_by(f64::total_cmp);
    ts[reps / 2]
}

#[test]
fn timing_report() {
    if cuda().is_none() {
        return;
    }
    // Poison off for timing (it adds a fill per allocation).
    let cu = CudaBackend::with_options(
        &BackendOptions {
            attention: "cuda-simple".into(),
            threads: 0,
            device: 0,
        },
        dflash_backend_cuda::CudaOptions {
            gemm: GemmPrecision::Tf32,
            activations: dflash_backend_cuda::DType::F32,
            poison: false,
            attn_forward_ctas: None,
        },
    )
    .unwrap();
    let mut r = rng(99);
    println!("timings on {} (median of 5, synchronised):", cu.device());
    // Qwen3-8B drafter shapes: 8192 query tokens, H 4096.
    let (t, h, i) = (8192, 4096, 12288);
    let x = up(&cu, &tiled(&mut r, t * h, 1.0), &[t, h]);
    let w = up(&cu, &tiled(&mut r, i * h, 0.02), &[i, h]);
    let ms = time_ms(&cu, 5, || {
        cu.linear(&x, &w).unwrap();
    });
    println!(
        "  linear {t}x{h} @ ({i}x{h})^T  TF32: {ms:8.2} ms  {:7.1} TFLOP/s",
        2.0 * (t * h * i) as f64 / ms / 1e9
    );
    let wn = up(&cu, &tiled(&mut r, h, 1.0), &[h]);
    let ms = time_ms(&cu, 5, || {
        cu.rms_norm(&x, &wn, 1e-6).unwrap();
    });
    println!(
        "  rms_norm {t}x{h}: {ms:8.3} ms  {:7.1} GB/s",
        (2 * t * h * 4) as f64 / ms / 1e6
    );
    let ms = time_ms(&cu, 5, || {
        cu.add(&x, &x).unwrap();
    });
    println!(
        "  add {t}x{h}: {ms:8.3} ms  {:7.1} GB/s",
        (3 * t * h * 4) as f64 / ms / 1e6
    );
    // Fused CE over a 151936 vocabulary, 2048 rows (~1700 active).
    let (tl, v) = (2048, 151_936);
    let xl = up(&cu, &tiled(&mut r, tl * h, 1.0), &[tl, h]);
    let wl = up(&cu, &tiled(&mut r, v * h, 0.02), &[v, h]);
    let labels: Vec<u32> = (0..tl).map(|_| r.random_range(0..v as u32)).collect();
    let weights: Vec<f32> = (0..tl)
        .map(|k| if k % 16 == 0 { 0.0 } else { 1.0 })
        .collect();
    let ms = time_ms(&cu, 3, || {
        cu.linear_cross_entropy(&xl, &wl, &labels, &weights, 1.0)
            .unwrap();
    });
    let act = weights.iter().filter(|&&w| w > 0.0).count();
    println!(
        "  linear_cross_entropy {tl} rows ({act} active), V {v}: {ms:8.2} ms  {:7.1} TFLOP/s (2 GEMMs)",
        4.0 * (act * h * v) as f64 / ms / 1e9
    );
    // The same GEMM-bound ops with bf16 GEMM operands (the default; includes the f32 -> bf16
    // conversions of both operands per GEMM). Tensors cross backends (event tracking).
    let cub = CudaBackend::with_options(
        &BackendOptions {
            attention: "cuda-simple".into(),
            threads: 0,
            device: 0,
        },
        dflash_backend_cuda::CudaOptions {
            gemm: GemmPrecision::Bf16,
            activations: dflash_backend_cuda::DType::F32,
            poison: false,
            attn_forward_ctas: None,
        },
    )
    .unwrap();
    let ms = time_ms(&cub, 5, || {
        cub.linear(&x, &w).unwrap();
    });
    println!(
        "  linear {t}x{h} @ ({i}x{h})^T  bf16: {ms:8.2} ms  {:7.1} TFLOP/s (with operand conversion)",
        2.0 * (t * h * i) as f64 / ms / 1e9
    );
    let ms = time_ms(&cub, 3, || {
        cub.linear_cross_entropy(&xl, &wl, &labels, &weights, 1.0)
            .unwrap();
    });
    println!(
        "  linear_cross_entropy bf16 GEMMs, {tl} rows ({act} active), V {v}: {ms:8.2} ms  {:7.1} TFLOP/s (2 GEMMs)",
        4.0 * (act * h * v) as f64 / ms / 1e9
    );
    drop(cub);
    drop((xl, wl, x, w));
    // Attention on the DFlash mask: ctx 2048 + 128 blocks of 16, 32/8 heads, d 128.
    let (s, nb, bs, hq, hkv, d) = (2048usize, 128usize, 16usize, 32usize, 8usize, 128usize);
    let mut anchors: Vec<i32> = (0..nb).map(|_| r.random_range(1..s as i32 - 1)).collect();
    anchors.sort();
    let mask = BlockMask::dflash(s, bs, &anchors).unwrap();
    let (tq, tk) = (nb * bs, s + nb * bs);
    let q = up(&cu, &tiled(&mut r, tq * hq * d, 1.0), &[tq, hq, d]);
    let k = up(&cu, &tiled(&mut r, tk * hkv * d, 1.0), &[tk, hkv, d]);
    let vv = up(&cu, &tiled(&mut r, tk * hkv * d, 1.0), &[tk, hkv, d]);
    let pairs = mask.visible_pairs() as f64;
    let mut fwd = None;
    let ms = time_ms(&cu, 3, || {
        fwd = Some(cu.attention(&q, &k, &vv, &mask, 0.088).unwrap());
    });
    println!(
        "  attention fwd cuda-simple, DFlash ctx {s} + {nb}x{bs}, {hq}/{hkv} heads d{d}: {ms:8.2} ms  {:6.2} TFLOP/s (anchor: flex 107)",
        4.0 * pairs * (hq * d) as f64 / ms / 1e9
    );
    let (o, l) = fwd.unwrap();
    let ms_b = time_ms(&cu, 3, || {
        cu.attention_backward(&q, &k, &vv, &o, &l, &q, &mask, 0.088)
            .unwrap();
    });
    println!(
        "  attention bwd cuda-simple: {ms_b:8.2} ms; fwd+bwd {:6.2} TFLOP/s (anchor: flex 88)",
        3.5 * 4.0 * pairs * (hq * d) as f64 / (ms + ms_b) / 1e9
    );
    let n = 100_000_000;
    let mut p = up(&cu, &tiled(&mut r, n, 1.0), &[n]);
    let g = cu.copy(&p).unwrap();
    let (mut m, mut v2) = (cu.zeros(&[n]).unwrap(), cu.zeros(&[n]).unwrap());
    let mut step = 0;
    let ms = time_ms(&cu, 5, || {
        step += 1;
        let hp = AdamWParams {
            lr: 1e-4,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.0,
            step,
            grad_scale: 1.0,
        };
        cu.adamw_step(&mut p, &g, &mut m, &mut v2, &hp).unwrap();
    });
    println!(
        "  adamw 1e8 params: {ms:8.2} ms  {:7.1} GB/s (28 B/param)",
        28.0 * n as f64 / ms / 1e6
    );
}

// ---------------------------------------------------------------------------------------
// Device-side random weights and memory accounting (used by the benchmarks)

#[test]
fn random_normal_matches_the_host_generator_and_memory_is_tracked() {
    let Some(cu) = cuda() else { return };
    let rf = reference();
    // Odd length: the last pair is half-written. Same counter-based stream on both sides;
    // only the last ulp of f64 log/sincos may differ, so 1e-6 relative after rounding to f32.
    let (n, std, seed) = (100_001usize, 0.02f32, 42u64);
    let dev = down(&cu, &cu.random_normal(&[n], std, seed).unwrap());
    let host = down(&rf, &rf.random_normal(&[n], std, seed).unwrap());
    let worst = dev
        .iter()
        .zip(&host)
        .map(|(a, b)| ((a - b).abs() / b.abs().max(1e-3 * std)) as f64)
        .fold(0.0, f64::max);
    assert!(
        worst <= 1e-6,
        "random_normal: worst relative difference {worst:e}"
    );
    assert!(cu.random_normal(&[4], f32::NAN, 1).is_err());
    println!("  random_normal vs host generator: worst rel {worst:.2e} (tol 1e-6)");

    // Peak memory follows a 256 MiB allocation and resets to what is live.
    let Some(before) = cu.memory_stats() else {
        println!("  memory_stats: not available on this device");
        return;
    };
    cu.reset_peak_memory();
    let big = cu.zeros(&[64 << 20]).unwrap(); // 256 MiB of f32
    cu.synchronize().unwrap();
    let during = cu.memory_stats().unwrap();
    assert!(
        during.peak_bytes >= before.in_use_bytes + (256 << 20),
        "{before:?} -> {during:?}"
    );
    drop(big);
    cu.synchronize().unwrap();
    cu.reset_peak_memory();
    let after = cu.memory_stats().unwrap();
    assert!(
        after.peak_bytes < during.peak_bytes,
        "{during:?} -> {after:?}"
    );
    println!(
        "  memory_stats: peak {} MiB with the buffer, {} MiB after reset",
        during.peak_bytes >> 20,
        after.peak_bytes >> 20
    );
}
