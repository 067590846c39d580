//! Memory ops against the reference backend: transfers, copies, narrowing, concatenation,
//! elementwise glue and the reductions, on the adapter's bindings and on 4 KiB bindings (the
//! chunked paths). Errors on malformed calls carry the reference's message.
//!
//! Skips cleanly without an adapter; inputs, poisoning and tolerances: `common`.

mod common;

use common::*;
use dflash_backend_wgpu::DType;
use dflash_core::{HostSlice, MemoryOps, Tensor};
use rand::Rng;

/// Sizes around the small-binding chunk (1024 elements), and the empty tensor.
const SIZES: [usize; 6] = [1, 7, 1023, 1024, 5000, 0];

#[test]
fn transfers_copies_and_elementwise_match_reference() {
    let rf = reference();
    let mut r = rng(1);
    for (label, be) in wgpu_both() {
        println!("[{label}]");
        for &n in &SIZES {
            let a = rand_vec(&mut r, n, 2.0);
            let b = rand_vec(&mut r, n, 2.0);
            let (ta, tb) = (up(&be, &a, &[n]), up(&be, &b, &[n]));
            check_exact(&format!("upload/download {n}"), &down(&be, &ta), &a);
            check_exact(&format!("copy {n}"), &down(&be, &be.copy(&ta).unwrap()), &a);
            let z = be.zeros(&[n, 1]).unwrap();
            assert_eq!(z.dims(), &[n, 1]);
            check_exact(&format!("zeros {n}"), &down(&be, &z), &vec![0.0; n]);
            let want = down(
                &rf,
                &rf.add(&up(&rf, &a, &[n]), &up(&rf, &b, &[n])).unwrap(),
            );
            check_exact(
                &format!("add {n}"),
                &down(&be, &be.add(&ta, &tb).unwrap()),
                &want,
            );
            let mut acc = be.copy(&ta).unwrap();
            be.add_assign(&mut acc, &tb).unwrap();
            check_exact(&format!("add_assign {n}"), &down(&be, &acc), &want);
            let mut sc = be.copy(&ta).unwrap();
            be.scale_assign(&mut sc, -0.37).unwrap();
            let mut sr = up(&rf, &a, &[n]);
            rf.scale_assign(&mut sr, -0.37).unwrap();
            check_exact(
                &format!("scale_assign {n}"),
                &down(&be, &sc),
                &down(&rf, &sr),
            );
        }
    }
}

#[test]
fn narrow_and_concat_match_reference() {
    let rf = reference();
    let mut r = rng(2);
    for (label, be) in wgpu_both() {
        println!("[{label}]");
        for &(rows, cols) in &[(13, 7), (300, 33), (5, 1000), (1, 1)] {
            let x = rand_vec(&mut r, rows * cols, 1.0);
            let (tw, tr) = (up(&be, &x, &[rows, cols]), up(&rf, &x, &[rows, cols]));
            for (start, len) in [
                (0, rows),
                (rows / 3, rows - rows / 3),
                (rows - 1, 1),
                (0, 0),
            ] {
                let nw = be.narrow_rows(&tw, start, len).unwrap();
                let nr = rf.narrow_rows(&tr, start, len).unwrap();
                assert_eq!(nw.dims(), nr.dims());
                check_exact(
                    &format!("narrow_rows {rows}x{cols} [{start}, +{len})"),
                    &down(&be, &nw),
                    &down(&rf, &nr),
                );
            }
            // Parts of different row counts (rows) and column counts (cols).
            let extra: Vec<usize> = vec![rows + 2, 1, 17];
            let parts: Vec<Vec<f32>> = extra
                .iter()
                .map(|&k| rand_vec(&mut r, k * cols, 1.0))
                .collect();
            let pw: Vec<Tensor> = parts
                .iter()
                .zip(&extra)
                .map(|(p, &k)| up(&be, p, &[k, cols]))
                .collect();
            let pr: Vec<Tensor> = parts
                .iter()
                .zip(&extra)
                .map(|(p, &k)| up(&rf, p, &[k, cols]))
                .collect();
            let cw = be.concat_rows(&pw.iter().collect::<Vec<_>>()).unwrap();
            let cr = rf.concat_rows(&pr.iter().collect::<Vec<_>>()).unwrap();
            assert_eq!(cw.dims(), cr.dims());
            check_exact("concat_rows", &down(&be, &cw), &down(&rf, &cr));
            let widths = [cols, 3, 2 * cols + 1];
            let parts: Vec<Vec<f32>> = widths
                .iter()
                .map(|&c| rand_vec(&mut r, rows * c, 1.0))
                .collect();
            let pw: Vec<Tensor> = parts
                .iter()
                .zip(&widths)
                .map(|(p, &c)| up(&be, p, &[rows, c]))
                .collect();
            let pr: Vec<Tensor> = parts
                .iter()
                .zip(&widths)
                .map(|(p, &c)| up(&rf, p, &[rows, c]))
                .collect();
            let cw = be.concat_cols(&pw.iter().collect::<Vec<_>>()).unwrap();
            let cr = rf.concat_cols(&pr.iter().collect::<Vec<_>>()).unwrap();
            assert_eq!(cw.dims(), cr.dims());
            check_exact(
                &format!("concat_cols {rows} rows, widths {widths:?}"),
                &down(&be, &cw),
                &down(&rf, &cr),
            );
        }
    }
}

#[test]
fn reductions_match_reference() {
    let rf = reference();
    let mut r = rng(3);
    // f32 partials of 4096 squares (tree-summed) added in f64 on the host, against f64
    // throughout: ~1e-7 relative expected.
    let tol = Tolerance {
        atol: 0.0,
        rtol: 1e-5,
        atol_unit: AtolUnit::Absolute,
        why: "f32 partial sums of 4096 squares vs f64",
    };
    for (label, be) in wgpu_reduction_variants() {
        println!("[{label}]");
        let xs: Vec<Vec<f32>> = [1usize, 4095, 4097, 20_000, 3]
            .iter()
            .map(|&n| rand_vec(&mut r, n, 3.0))
            .collect();
        let tw: Vec<Tensor> = xs.iter().map(|x| up(&be, x, &[x.len()])).collect();
        let tr: Vec<Tensor> = xs.iter().map(|x| up(&rf, x, &[x.len()])).collect();
        let many = be.sum_squares_many(&tw.iter().collect::<Vec<_>>()).unwrap();
        for (i, (t, x)) in tw.iter().zip(&xs).enumerate() {
            let want = rf.sum_squares(&tr[i]).unwrap();
            let got = be.sum_squares(t).unwrap();
            assert_close(&format!("sum_squares {}", x.len()), &[got], &[want], &tol);
            assert_eq!(many[i].to_bits(), got.to_bits(), "sum_squares_many[{i}]");
            assert!(be.all_finite(t).unwrap());
        }
        assert_eq!(be.sum_squares(&be.zeros(&[0]).unwrap()).unwrap(), 0.0);
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            for at in [0, 4096, 9_999] {
                let mut x = rand_vec(&mut r, 10_000, 1.0);
                x[at] = bad;
                assert!(
                    !be.all_finite(&up(&be, &x, &[10_000])).unwrap(),
                    "{bad} at {at}"
                );
            }
        }
        // Large finite values are finite (a sum of squares would overflow).
        assert!(
            be.all_finite(&up(&be, &[f32::MAX, -f32::MAX], &[2]))
                .unwrap()
        );
        println!("  all_finite: NaN / +-inf found at chunk edges, f32::MAX is finite");
    }
}

/// Malformed calls fail with the reference's message (device name aside), never a panic.
#[test]
fn malformed_calls_fail_like_the_reference() {
    let rf = reference();
    let Some(be) = wgpu() else { return };
    let same = |what: &str, w: dflash_core::Result<Tensor>, r: dflash_core::Result<Tensor>| {
        let (w, r) = (w.unwrap_err().to_string(), r.unwrap_err().to_string());
        assert_eq!(w.replace("wgpu:0", "cpu"), r, "{what}");
        println!("  {what:<30} {w}");
    };
    let (a3, b4) = (up(&be, &[1.0; 6], &[2, 3]), up(&be, &[1.0; 8], &[2, 4]));
    let (ra3, rb4) = (up(&rf, &[1.0; 6], &[2, 3]), up(&rf, &[1.0; 8], &[2, 4]));
    same(
        "upload",
        be.upload(&[1.0; 5], &[2, 3]),
        rf.upload(&[1.0; 5], &[2, 3]),
    );
    same("add", be.add(&a3, &b4), rf.add(&ra3, &rb4));
    same(
        "narrow_rows",
        be.narrow_rows(&a3, 1, 2),
        rf.narrow_rows(&ra3, 1, 2),
    );
    same(
        "concat_rows",
        be.concat_rows(&[&a3, &b4]),
        rf.concat_rows(&[&ra3, &rb4]),
    );
    let c = up(&be, &[1.0; 3], &[3, 1]);
    let rc = up(&rf, &[1.0; 3], &[3, 1]);
    same(
        "concat_cols",
        be.concat_cols(&[&a3, &c]),
        rf.concat_cols(&[&ra3, &rc]),
    );
    same("concat_rows []", be.concat_rows(&[]), rf.concat_rows(&[]));
    let mut acc = be.copy(&a3).unwrap();
    let e = be.add_assign(&mut acc, &b4).unwrap_err().to_string();
    assert!(e.contains("add_assign") && e.contains("wgpu:0"), "{e}");
    // A reference tensor given to wgpu is a typed error naming both backends.
    let e = be.copy(&ra3).unwrap_err().to_string();
    assert!(e.contains("\"reference\"") && e.contains("\"wgpu\""), "{e}");
    assert!(!be.is_local(&ra3) && be.is_local(&a3));
    // import goes through the host, values intact.
    check_exact("import", &down(&be, &be.import(&ra3).unwrap()), &[1.0; 6]);
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
    let rf = reference();
    let mut r = rng(12);
    for (label, be) in wgpu_f16_both() {
        println!("[{label}]");
        for &(rows, cols) in &[(13, 7), (300, 33), (6, 1000), (1, 1), (40, 2)] {
            let x = rand_vec(&mut r, rows * cols, 3.0);
            let (tw, held) = up_f16(&be, &x, &[rows, cols]);
            let tr = up(&rf, &held, &[rows, cols]);
            let c = be.copy(&tw).unwrap();
            assert_eq!(dtype(&c), DType::F16);
            check_exact(&format!("f16 copy {rows}x{cols}"), &down(&be, &c), &held);
            for (start, len) in [
                (0, rows),
                (rows / 3, rows - rows / 3),
                (rows - 1, 1),
                (0, 0),
            ] {
                let nw = be.narrow_rows(&tw, start, len).unwrap();
                assert_eq!(dtype(&nw), DType::F16);
                check_exact(
                    &format!("f16 narrow_rows {rows}x{cols} [{start}, +{len})"),
                    &down(&be, &nw),
                    &down(&rf, &rf.narrow_rows(&tr, start, len).unwrap()),
                );
            }
            let extra = [rows + 2, 1, 17];
            let parts: Vec<(Tensor, Vec<f32>)> = extra
                .iter()
                .map(|&k| up_f16(&be, &rand_vec(&mut r, k * cols, 1.0), &[k, cols]))
                .collect();
            let pr: Vec<Tensor> = parts
                .iter()
                .zip(&extra)
                .map(|((_, h), &k)| up(&rf, h, &[k, cols]))
                .collect();
            let cw = be
                .concat_rows(&parts.iter().map(|(t, _)| t).collect::<Vec<_>>())
                .unwrap();
            assert_eq!(dtype(&cw), DType::F16);
            let cr = rf.concat_rows(&pr.iter().collect::<Vec<_>>()).unwrap();
            check_exact("f16 concat_rows", &down(&be, &cw), &down(&rf, &cr));
            let widths = [cols, 3, 2 * cols + 1];
            let parts: Vec<(Tensor, Vec<f32>)> = widths
                .iter()
                .map(|&c| up_f16(&be, &rand_vec(&mut r, rows * c, 1.0), &[rows, c]))
                .collect();
            let pr: Vec<Tensor> = parts
                .iter()
                .zip(&widths)
                .map(|((_, h), &c)| up(&rf, h, &[rows, c]))
                .collect();
            let cw = be
                .concat_cols(&parts.iter().map(|(t, _)| t).collect::<Vec<_>>())
                .unwrap();
            assert_eq!(dtype(&cw), DType::F16);
            let cr = rf.concat_cols(&pr.iter().collect::<Vec<_>>()).unwrap();
            check_exact(
                &format!("f16 concat_cols {rows} rows, widths {widths:?}"),
                &down(&be, &cw),
                &down(&rf, &cr),
            );
        }
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

/// `upload_frozen` (the checkpoint loader) gives exactly `to_compute_format(upload(widened
/// data))` for f32, bf16 and f16 files, in the compute format, across host chunk boundaries
/// (odd lengths, chunks of 6 and 1000 elements and one chunk), with f16 on and off; a byte
/// count that does not match the shape is an error naming the op and the device.
#[test]
fn upload_frozen_matches_the_compute_format_of_the_widened_data() {
    let mut r = rng(23);
    let mut backends: Vec<(&str, dflash_backend_wgpu::WgpuBackend)> = Vec::new();
    if let Some(b) = wgpu() {
        backends.push(("f32", b));
    }
    if let Some(b) = wgpu_f16() {
        backends.push(("f16", b));
    }
    for (label, be) in backends {
        for n in [1usize, 1001, 4000] {
            let x = rand_vec(&mut r, n, 3.0);
            let f32b: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
            // bf16: the top half of each f32 (a valid bf16 value).
            let bf16b: Vec<u8> = x
                .iter()
                .flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes())
                .collect();
            // f16: finite values of every exponent (never NaN or infinity).
            let f16b: Vec<u8> = (0..n)
                .flat_map(|_| {
                    let bits: u16 = r.random_range(0..0x7c00u16) | (r.random_range(0..2u16) << 15);
                    bits.to_le_bytes()
                })
                .collect();
            for data in [
                HostSlice::F32(&f32b),
                HostSlice::Bf16(&bf16b),
                HostSlice::F16(&f16b),
            ] {
                let want = be
                    .to_compute_format(up(&be, &data.to_f32_vec(), &[n]))
                    .unwrap();
                for chunk in [6, 1000, 1 << 20] {
                    let got = be.upload_frozen_chunked(data, &[n], chunk).unwrap();
                    assert_eq!(dtype(&got), be.compute_format());
                    check_exact(
                        &format!(
                            "[{label}] upload_frozen {} n={n} chunk={chunk}",
                            data.dtype_name()
                        ),
                        &down(&be, &got),
                        &down(&be, &want),
                    );
                }
            }
        }
        let short = [0u8; 6];
        assert_err(
            be.upload_frozen(HostSlice::F16(&short), &[2, 2]),
            &["upload_frozen", "wgpu:0", "[2, 2]"],
        );
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
