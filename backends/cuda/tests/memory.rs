//! Memory ops (upload/download, copies, gathers, adds, scales) against the reference backend.
//!
//! Skips cleanly without CUDA; inputs, poisoning and the tolerance scheme: `common`.

mod common;

use rand::Rng;

use common::*;
use dflash_backend_cuda::DType;
use dflash_core::{GemmOps, MemoryOps, Transpose};

// ---------------------------------------------------------------------------------------
// Memory and elementwise

#[test]
fn memory_ops_match_reference() {
    let Some(cu) = cuda() else { return };
    let rf = reference();
    let mut r = rng(1);
    let (rows, cols) = (37, 29);
    let x = rand_vec(&mut r, rows * cols, 1.0);
    let y = rand_vec(&mut r, rows * cols, 1.0);
    let (xc, xr) = (up(&cu, &x, &[rows, cols]), up(&rf, &x, &[rows, cols]));
    let (yc, yr) = (up(&cu, &y, &[rows, cols]), up(&rf, &y, &[rows, cols]));
    check_exact("upload/download", &down(&cu, &xc), &x);
    let z = cu.zeros(&[5, 3]).unwrap();
    assert_eq!(z.dims(), &[5, 3]);
    check_exact("zeros", &down(&cu, &z), &[0.0; 15]);
    check_exact("copy", &down(&cu, &cu.copy(&xc).unwrap()), &x);
    // The side-stream read of a fresh copy sees the copy's values (it waits for that write),
    // also from another thread and with the main stream still busy with later work.
    let snap = cu.copy(&xc).unwrap();
    let busy = cu
        .matmul(&xc, Transpose::No, &cu.copy(&yc).unwrap(), Transpose::Yes)
        .unwrap();
    let side = std::thread::scope(|s| {
        s.spawn(|| cu.download_detached(&snap).unwrap())
            .join()
            .unwrap()
    });
    check_exact("download_detached of a copy", &side, &x);
    assert_eq!(busy.dims(), &[rows, rows]);
    // Snapshots of checkpoint size go through the 32 MB pinned buffers in chunks: one chunk
    // exactly, two (both buffers, no refill), five and a tail (refills and the plain tail).
    const CHUNK_F32: usize = (32 << 20) / 4;
    for n in [CHUNK_F32, 2 * CHUNK_F32, 5 * CHUNK_F32 + 12_345] {
        let big = rand_vec(&mut r, n, 1.0);
        let snap = cu.copy(&up(&cu, &big, &[n])).unwrap();
        let side = std::thread::scope(|s| {
            s.spawn(|| cu.download_detached(&snap).unwrap())
                .join()
                .unwrap()
        });
        assert_eq!(side.len(), n);
        check_exact(&format!("download_detached of {n} values"), &side, &big);
    }
    for (s, l) in [(0, rows), (3, 10), (rows - 1, 1), (5, 0)] {
        check_exact(
            &format!("narrow_rows({s}, {l})"),
            &down(&cu, &cu.narrow_rows(&xc, s, l).unwrap()),
            &down(&rf, &rf.narrow_rows(&xr, s, l).unwrap()),
        );
    }
    let p3 = rand_vec(&mut r, 4 * cols, 1.0);
    let (p3c, p3r) = (up(&cu, &p3, &[4, cols]), up(&rf, &p3, &[4, cols]));
    let cr = cu.concat_rows(&[&xc, &p3c, &yc]).unwrap();
    assert_eq!(cr.dims(), &[2 * rows + 4, cols]);
    check_exact(
        "concat_rows",
        &down(&cu, &cr),
        &down(&rf, &rf.concat_rows(&[&xr, &p3r, &yr]).unwrap()),
    );
    let q = rand_vec(&mut r, rows * 7, 1.0);
    let (qc, qr) = (up(&cu, &q, &[rows, 7]), up(&rf, &q, &[rows, 7]));
    let cc = cu.concat_cols(&[&xc, &qc, &yc]).unwrap();
    assert_eq!(cc.dims(), &[rows, 2 * cols + 7]);
    check_exact(
        "concat_cols",
        &down(&cu, &cc),
        &down(&rf, &rf.concat_cols(&[&xr, &qr, &yr]).unwrap()),
    );
    check_exact(
        "add",
        &down(&cu, &cu.add(&xc, &yc).unwrap()),
        &down(&rf, &rf.add(&xr, &yr).unwrap()),
    );
    let (mut ac, mut ar) = (cu.copy(&xc).unwrap(), rf.copy(&xr).unwrap());
    cu.add_assign(&mut ac, &yc).unwrap();
    rf.add_assign(&mut ar, &yr).unwrap();
    check_exact("add_assign", &down(&cu, &ac), &down(&rf, &ar));
    cu.scale_assign(&mut ac, -0.37).unwrap();
    rf.scale_assign(&mut ar, -0.37).unwrap();
    check_exact("scale_assign", &down(&cu, &ac), &down(&rf, &ar));
    // Large enough for many reduction blocks.
    let big = rand_vec(&mut r, 3_000_017, 2.0);
    let (bc, br) = (up(&cu, &big, &[big.len()]), up(&rf, &big, &[big.len()]));
    let (sc, sr) = (cu.sum_squares(&bc).unwrap(), rf.sum_squares(&br).unwrap());
    assert_close(
        "sum_squares (3M elements)",
        &[sc],
        &[sr],
        &Tolerance {
            atol: 0.0,
            rtol: 1e-10,
            atol_unit: AtolUnit::Absolute,
            why: "f64 sums in a different order",
        },
    );
    assert_eq!(
        cu.sum_squares(&bc).unwrap().to_bits(),
        sc.to_bits(),
        "sum_squares is deterministic"
    );
    // The batched form reads every sum back at once; each must be the single-tensor sum, bit
    // for bit (same kernels, same order), empty tensors included.
    let empty = up(&cu, &[], &[0]);
    let many = cu.sum_squares_many(&[&bc, &xc, &empty, &bc]).unwrap();
    let one = [sc, cu.sum_squares(&xc).unwrap(), 0.0, sc];
    assert_eq!(
        many.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        one.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        "sum_squares_many {many:?} vs sum_squares {one:?}"
    );
    assert!(cu.all_finite(&bc).unwrap());
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut b2 = big.clone();
        b2[2_999_999] = bad;
        assert!(
            !cu.all_finite(&up(&cu, &b2, &[b2.len()])).unwrap(),
            "all_finite missed {bad}"
        );
    }
    println!("  all_finite detects NaN/+inf/-inf at the end of 3M elements: ok");
    // bf16 conversion (the future activation path): round to nearest even, exact back.
    let bf = cu.to_dtype(&xc, DType::Bf16).unwrap();
    let back = down(&cu, &bf);
    let want: Vec<f32> = x
        .iter()
        .map(|&v| half::bf16::from_f32(v).to_f32())
        .collect();
    check_exact("to_dtype f32 -> bf16 -> f32", &back, &want);
    // bf16 inputs are read by the arithmetic ops (formerly an error here): with f32
    // activations, bf16 + bf16 is the exact f32 sum of the widened values.
    let s2 = cu.add(&bf, &bf).unwrap();
    assert_eq!(dtype_of(&s2), DType::F32);
    check_exact(
        "add(bf16, bf16), f32 activations",
        &down(&cu, &s2),
        &want.iter().map(|v| v + v).collect::<Vec<_>>(),
    );
    // Shape errors match the reference's.
    let e1 = cu.narrow_rows(&xc, 30, 10).err().unwrap().to_string();
    let e2 = rf.narrow_rows(&xr, 30, 10).err().unwrap().to_string();
    assert_eq!(e1.replace("cuda:0", "cpu"), e2);
}

// ---------------------------------------------------------------------------------------
// bf16 storage: to_compute_format and the dtype-generic memory ops

/// With bf16 GEMMs `to_compute_format` stores bf16; `download`, `copy`, `narrow_rows`,
/// `concat_rows` and `concat_cols` keep bf16 and match the reference on the same bf16-rounded
/// values bit-exactly (pure copies; `download` widens exactly). The arithmetic memory ops
/// reject bf16 by name.
#[test]
fn bf16_memory_ops_match_reference() {
    use dflash_backend_cuda::GemmPrecision;
    let Some(cu) = cuda_with(GemmPrecision::Bf16) else {
        return;
    };
    let rf = reference();
    let mut r = rng(101);
    // Odd column counts: rows of 2-byte elements at every alignment.
    let (rows, cols) = (37, 29);
    let x = rand_vec(&mut r, rows * cols, 3.0);
    let y = rand_vec(&mut r, rows * cols, 3.0);
    let (xb, yb) = (bf16_rounded(&x), bf16_rounded(&y));
    assert!(x != xb, "the inputs must not be bf16-representable already");
    let xc = cu.to_compute_format(up(&cu, &x, &[rows, cols])).unwrap();
    let yc = cu.to_compute_format(up(&cu, &y, &[rows, cols])).unwrap();
    assert_eq!(dtype_of(&xc), DType::Bf16);
    assert_eq!(xc.dims(), &[rows, cols]);
    let (xr, yr) = (up(&rf, &xb, &[rows, cols]), up(&rf, &yb, &[rows, cols]));
    check_exact("bf16 download (widened)", &down(&cu, &xc), &xb);
    // Already bf16: returned as it is.
    let again = cu.to_compute_format(cu.copy(&xc).unwrap()).unwrap();
    assert_eq!(dtype_of(&again), DType::Bf16);
    check_exact("bf16 to_compute_format(bf16)", &down(&cu, &again), &xb);
    let cp = cu.copy(&xc).unwrap();
    assert_eq!(dtype_of(&cp), DType::Bf16);
    check_exact(
        "bf16 copy",
        &down(&cu, &cp),
        &down(&rf, &rf.copy(&xr).unwrap()),
    );
    for (s, l) in [(0, rows), (3, 10), (1, 1), (rows - 1, 1), (5, 0)] {
        let n = cu.narrow_rows(&xc, s, l).unwrap();
        assert_eq!(dtype_of(&n), DType::Bf16);
        check_exact(
            &format!("bf16 narrow_rows({s}, {l})"),
            &down(&cu, &n),
            &down(&rf, &rf.narrow_rows(&xr, s, l).unwrap()),
        );
    }
    let p = rand_vec(&mut r, 3 * cols, 3.0);
    let (pc, pr) = (
        up_bf16(&cu, &p, &[3, cols]),
        up(&rf, &bf16_rounded(&p), &[3, cols]),
    );
    let cr = cu.concat_rows(&[&xc, &pc, &yc]).unwrap();
    assert_eq!(
        (dtype_of(&cr), cr.dims()),
        (DType::Bf16, &[2 * rows + 3, cols][..])
    );
    check_exact(
        "bf16 concat_rows",
        &down(&cu, &cr),
        &down(&rf, &rf.concat_rows(&[&xr, &pr, &yr]).unwrap()),
    );
    let q = rand_vec(&mut r, rows * 7, 3.0);
    let (qc, qr) = (
        up_bf16(&cu, &q, &[rows, 7]),
        up(&rf, &bf16_rounded(&q), &[rows, 7]),
    );
    let cc = cu.concat_cols(&[&xc, &qc, &yc]).unwrap();
    assert_eq!(
        (dtype_of(&cc), cc.dims()),
        (DType::Bf16, &[rows, 2 * cols + 7][..])
    );
    check_exact(
        "bf16 concat_cols",
        &down(&cu, &cc),
        &down(&rf, &rf.concat_cols(&[&xr, &qr, &yr]).unwrap()),
    );
    // Mixed dtypes are an error, not a reinterpretation.
    let xf = up(&cu, &x, &[rows, cols]);
    for e in [
        cu.concat_rows(&[&xc, &xf]).err(),
        cu.concat_cols(&[&xc, &xf]).err(),
    ] {
        let e = e.expect("mixed-dtype concatenation must fail").to_string();
        assert!(e.contains("bf16") && e.contains("f32"), "{e}");
    }
    // TF32 / FP32 GEMMs: to_compute_format keeps f32 (and keeps a bf16 tensor as it is).
    let cu32 = cuda().unwrap();
    let kept = cu32
        .to_compute_format(up(&cu32, &x, &[rows, cols]))
        .unwrap();
    assert_eq!(dtype_of(&kept), DType::F32);
    check_exact(
        "tf32 mode: to_compute_format keeps f32",
        &down(&cu32, &kept),
        &x,
    );
    // The arithmetic memory ops take bf16 inputs too (formerly rejected; checked in detail,
    // with bf16 activations, by `bf16_activation_memory_ops_match_reference`). With f32
    // activations (`cuda_with`) `add` of a bf16 and an f32 input is f32 and exact here: the
    // bf16 value widens exactly and the f32 add rounds once, like the reference.
    let s = cu.add(&xc, &xf).unwrap();
    assert_eq!(dtype_of(&s), DType::F32);
    let xr32 = up(&rf, &x, &[rows, cols]);
    check_exact(
        "add(bf16, f32), f32 activations",
        &down(&cu, &s),
        &down(&rf, &rf.add(&xr, &xr32).unwrap()),
    );
    let mut acc = cu.copy(&xf).unwrap();
    cu.add_assign(&mut acc, &xc).unwrap();
    assert_eq!(dtype_of(&acc), DType::F32, "add_assign keeps acc's dtype");
    let mut xcm = cu.copy(&xc).unwrap();
    cu.scale_assign(&mut xcm, 2.0).unwrap();
    assert_eq!(dtype_of(&xcm), DType::Bf16, "scale_assign keeps the dtype");
    check_exact(
        "scale_assign(bf16, 2) (exact: a power of two)",
        &down(&cu, &xcm),
        &xb.iter().map(|v| v * 2.0).collect::<Vec<_>>(),
    );
    let want: f64 = xb.iter().map(|&v| (v as f64) * (v as f64)).sum();
    assert_close(
        "sum_squares(bf16)",
        &[cu.sum_squares(&xc).unwrap()],
        &[want],
        &Tolerance {
            atol: 0.0,
            rtol: 1e-10,
            atol_unit: AtolUnit::Absolute,
            why: "f64 sums of exactly widened values, other order",
        },
    );
    assert!(cu.all_finite(&xc).unwrap());
}

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

// ---------------------------------------------------------------------------------------
// bf16 activations

/// With bf16 activations: `add` of every input dtype combination writes bf16; `add_assign`
/// and `scale_assign` keep the accumulator's dtype; `sum_squares` / `all_finite` read bf16.
/// All bit-exact: the device computes the same single f32 operation as the reference (on the
/// same, bf16-widened, values) and rounds it once (RNE) when storing bf16, which the host
/// reproduces with the `half` crate. Outputs are poisoned first; the poison of a bf16 buffer
/// is the bf16 quiet NaN 0x7FC0.
#[test]
fn bf16_activation_memory_ops_match_reference() {
    use dflash_backend_cuda::GemmPrecision;
    let Some(cu) = cuda_act(GemmPrecision::Tf32, DType::Bf16) else {
        return;
    };
    let rf = reference();
    let mut r = rng(211);
    let (rows, cols) = (37, 29);
    let s = [rows, cols];
    let x = rand_vec(&mut r, rows * cols, 3.0);
    let y = rand_vec(&mut r, rows * cols, 3.0);
    // Poison: an unwritten bf16 element reads back as NaN (0x7FC0 widened: 0x7FC00000).
    let un = cu.uninit(&[1000], DType::Bf16).unwrap();
    assert!(
        down(&cu, &un).iter().all(|v| v.to_bits() == 0x7fc0_0000),
        "bf16 poison must be 0x7FC0"
    );
    println!("  bf16 poison: 1000 of 1000 elements are 0x7FC0");
    for ad in DTYPES {
        for bd in DTYPES {
            let (ac, av) = up_as(&cu, &x, &s, ad);
            let (bc, bv) = up_as(&cu, &y, &s, bd);
            let (ar, br) = (up(&rf, &av, &s), up(&rf, &bv, &s));
            let sum = cu.add(&ac, &bc).unwrap();
            assert_dtype("add", &sum, DType::Bf16);
            let want = down(&rf, &rf.add(&ar, &br).unwrap());
            check_exact(
                &format!("bf16 add({}, {})", ad.name(), bd.name()),
                &down(&cu, &sum),
                &bf16_rounded(&want),
            );
            // acc keeps its dtype.
            let mut acc = cu.copy(&ac).unwrap();
            cu.add_assign(&mut acc, &bc).unwrap();
            assert_dtype("add_assign", &acc, ad);
            let want_acc = match ad {
                DType::F32 => want.clone(),
                DType::Bf16 => bf16_rounded(&want),
            };
            check_exact(
                &format!("add_assign(acc {}, x {})", ad.name(), bd.name()),
                &down(&cu, &acc),
                &want_acc,
            );
        }
        let (mut t, tv) = up_as(&cu, &x, &s, ad);
        cu.scale_assign(&mut t, 0.3).unwrap();
        assert_dtype("scale_assign", &t, ad);
        let mut tr = up(&rf, &tv, &s);
        rf.scale_assign(&mut tr, 0.3).unwrap();
        let want = down(&rf, &tr);
        let want = if ad == DType::Bf16 {
            bf16_rounded(&want)
        } else {
            want
        };
        check_exact(
            &format!("scale_assign({}, 0.3)", ad.name()),
            &down(&cu, &t),
            &want,
        );
    }
    // Reductions over bf16, f64 sums.
    let (xc, xv) = up_as(&cu, &x, &s, DType::Bf16);
    assert_close(
        "sum_squares(bf16)",
        &[cu.sum_squares(&xc).unwrap()],
        &[rf.sum_squares(&up(&rf, &xv, &s)).unwrap()],
        &Tolerance {
            atol: 0.0,
            rtol: 1e-10,
            atol_unit: AtolUnit::Absolute,
            why: "f64 sums of the same values, other order",
        },
    );
    assert!(cu.all_finite(&xc).unwrap());
    let mut bad = x.clone();
    bad[500] = f32::INFINITY;
    let (bc, _) = up_as(&cu, &bad, &s, DType::Bf16);
    assert!(!cu.all_finite(&bc).unwrap(), "an infinite bf16 element");
    // What stays f32: upload, zeros, random_normal.
    assert_dtype("upload", &up(&cu, &x, &s), DType::F32);
    assert_dtype("zeros", &cu.zeros(&s).unwrap(), DType::F32);
    assert_dtype(
        "random_normal",
        &cu.random_normal(&s, 1.0, 3).unwrap(),
        DType::F32,
    );
}

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
