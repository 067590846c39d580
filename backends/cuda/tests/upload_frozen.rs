//! `upload_frozen`: a host tensor in its file dtype (f32, bf16, f16 bytes, unaligned as in a
//! memory map) into the compute format, chunk by chunk, with the same values as
//! `to_compute_format(upload(widened))` and as the reference backend gives.
//!
//! Skips cleanly without CUDA (`common`).

mod common;

use common::*;
use dflash_backend_cuda::{CudaBackend, DType, GemmPrecision};
use dflash_core::{HostSlice, MemoryOps};
use dflash_tests::ops::storage::half_bits;

/// `bytes` one byte past an allocation's start, as a tensor in a memory map may lie.
fn unaligned(bytes: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(bytes.len() + 1);
    v.push(0xA5);
    v.extend_from_slice(bytes);
    v
}

/// The shared body (`storage::upload_frozen`: f32, bf16 and f16 files, unaligned, chunks of
/// 1000, 7 and all elements) in every GEMM precision: bf16 GEMMs keep frozen tensors in bf16,
/// the others in f32.
#[test]
fn upload_frozen_converts_every_dtype_chunk_by_chunk() {
    for (gemm, want) in [
        (GemmPrecision::Bf16, DType::Bf16),
        (GemmPrecision::Tf32, DType::F32),
        (GemmPrecision::Fp32, DType::F32),
    ] {
        let Some(cu) = cuda_with(gemm) else { return };
        assert_eq!(cu.compute_format(), want, "{gemm:?}");
        let p = CudaPath::new(&format!("{gemm:?} GEMMs"), cu, DType::F32);
        dflash_tests::ops::storage::upload_frozen(&p);
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
    let bytes = unaligned(&half_bits(Format::Bf16, n, 11));
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
