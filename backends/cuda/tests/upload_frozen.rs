//! `upload_frozen`: a host tensor in its file dtype (f32, bf16, f16 bytes, unaligned as in a
//! memory map) into the compute format, chunk by chunk, with the same values as
//! `to_compute_format(upload(widened))` and as the reference backend gives.
//!
//! Skips cleanly without CUDA (`common`).

mod common;

use common::*;
use dflash_backend_cuda::{CudaBackend, CudaStorage, DType, GemmPrecision};
use dflash_core::{HostSlice, MemoryOps, Tensor};
use rand::Rng;

fn dtype_of(t: &Tensor) -> DType {
    t.storage()
        .as_any()
        .downcast_ref::<CudaStorage>()
        .expect("a CUDA tensor")
        .dtype()
}

/// `bytes` one byte past an allocation's start, as a tensor in a memory map may lie.
fn unaligned(bytes: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(bytes.len() + 1);
    v.push(0xA5);
    v.extend_from_slice(bytes);
    v
}

/// Values that exercise the conversions: random ones over a wide range, signed zeros,
/// infinities, subnormals of every dtype, and halfway cases of bf16 rounding.
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut r = rng(seed);
    let special = [
        0.0f32,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        1.0e-40,
        -3.0e-42,
        6.0e-8,
        65504.0,
        f32::from_bits(0x3F80_8000), // 1 + 2^-8: a bf16 tie, rounds to even
        f32::from_bits(0x3F81_8000), // a tie that rounds up
        f32::from_bits(0x3F80_8001), // just above a tie
    ];
    (0..n)
        .map(|i| match special.get(i % 97) {
            Some(&s) => s,
            None => r.random_range(-4.0f32..4.0) * 10f32.powi(r.random_range(-6..6)),
        })
        .collect()
}

/// A bf16 file's bits (every pattern but NaN, so every exponent and subnormal occurs).
fn bf16_bits(n: usize, seed: u64) -> Vec<u8> {
    let mut r = rng(seed);
    (0..n)
        .flat_map(|_| {
            let b = loop {
                let b: u16 = r.random();
                if (b & 0x7fff) <= 0x7f80 {
                    break b;
                }
            };
            b.to_le_bytes()
        })
        .collect()
}

fn file_bytes(x: &[f32], dtype: &str) -> Vec<u8> {
    match dtype {
        "f32" => x.iter().flat_map(|v| v.to_le_bytes()).collect(),
        "f16" => x
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
            .collect(),
        other => panic!("no dtype {other}"),
    }
}

fn slice<'a>(dtype: &str, bytes: &'a [u8]) -> HostSlice<'a> {
    match dtype {
        "f32" => HostSlice::F32(bytes),
        "bf16" => HostSlice::Bf16(bytes),
        "f16" => HostSlice::F16(bytes),
        other => panic!("no dtype {other}"),
    }
}

/// The compute format's values of `widened`: bf16 rounded to nearest even with bf16 GEMMs,
/// else the f32 values themselves.
fn in_format(cu: &CudaBackend, widened: &[f32]) -> Vec<f32> {
    match cu.compute_format() {
        DType::Bf16 => widened
            .iter()
            .map(|&v| half::bf16::from_f32(v).to_f32())
            .collect(),
        DType::F32 => widened.to_vec(),
    }
}

/// Every (GEMM precision, file dtype, chunk size) combination on an odd element count: chunks
/// of 1000 and 7 elements (boundaries off the kernels' 8-element vectors), and one chunk.
#[test]
fn upload_frozen_converts_every_dtype_chunk_by_chunk() {
    let rf = reference();
    let (rows, cols) = (37, 111); // 4107 elements, odd
    let n = rows * cols;
    let x = values(n, 3);
    for gemm in [
        GemmPrecision::Bf16,
        GemmPrecision::Tf32,
        GemmPrecision::Fp32,
    ] {
        let Some(cu) = cuda_with(gemm) else { return };
        let want_dtype = match gemm {
            GemmPrecision::Bf16 => DType::Bf16,
            _ => DType::F32,
        };
        assert_eq!(cu.compute_format(), want_dtype, "{gemm:?}");
        for dtype in ["f32", "bf16", "f16"] {
            let bytes = match dtype {
                "bf16" => bf16_bits(n, 5),
                d => file_bytes(&x, d),
            };
            let bytes = unaligned(&bytes);
            let data = slice(dtype, &bytes[1..]);
            let widened = data.to_f32_vec();
            let want = in_format(&cu, &widened);
            // The contract: what converting an f32 upload gives, and the reference's values
            // rounded the same way.
            let via_f32 = cu
                .to_compute_format(up(&cu, &widened, &[rows, cols]))
                .unwrap();
            check_exact(
                &format!("{gemm:?} {dtype}: via f32"),
                &down(&cu, &via_f32),
                &want,
            );
            let rt = rf.upload_frozen(data, &[rows, cols]).unwrap();
            check_exact(
                &format!("{gemm:?} {dtype}: reference"),
                &in_format(&cu, &down(&rf, &rt)),
                &want,
            );
            for chunk in [1000, 7, n] {
                let t = cu
                    .upload_frozen_chunked(data, &[rows, cols], chunk)
                    .unwrap();
                assert_eq!(t.dims(), &[rows, cols]);
                assert_eq!(dtype_of(&t), want_dtype, "{gemm:?} {dtype} chunk {chunk}");
                check_exact(
                    &format!("{gemm:?} {dtype} chunk {chunk}"),
                    &down(&cu, &t),
                    &want,
                );
            }
            let t = cu.upload_frozen(data, &[rows, cols]).unwrap();
            check_exact(
                &format!("{gemm:?} {dtype}: default chunks"),
                &down(&cu, &t),
                &want,
            );
        }
        let e = cu
            .upload_frozen(HostSlice::Bf16(&[0u8; 10]), &[2, 3])
            .expect_err("10 bytes are not 6 bf16 elements")
            .to_string();
        assert!(
            e.contains("upload_frozen on cuda:0") && e.contains("[2, 3]") && e.contains("bf16"),
            "{e}"
        );
        let empty = cu.upload_frozen(HostSlice::F16(&[]), &[0, 5]).unwrap();
        assert_eq!(empty.dims(), &[0, 5]);
        assert!(down(&cu, &empty).is_empty());
    }
}

/// A bf16 tensor of more than two default chunks and an odd element count, with bf16 GEMMs:
/// the file's bits land on the device unchanged (downloaded: the exact widening).
#[test]
fn upload_frozen_bf16_spanning_chunks_keeps_the_files_bits() {
    let Some(cu) = cuda_with(GemmPrecision::Bf16) else {
        return;
    };
    let n = 2 * CudaBackend::FROZEN_CHUNK + 4097;
    let bytes = unaligned(&bf16_bits(n, 11));
    let data = HostSlice::Bf16(&bytes[1..]);
    let t = cu.upload_frozen(data, &[n]).unwrap();
    assert_eq!(dtype_of(&t), DType::Bf16);
    let got = down(&cu, &t);
    let want = data.to_f32_vec();
    assert_eq!(got.len(), n);
    let bad = got
        .iter()
        .zip(&want)
        .position(|(g, w)| g.to_bits() != w.to_bits());
    assert_eq!(bad, None, "first differing element (of {n})");
}
