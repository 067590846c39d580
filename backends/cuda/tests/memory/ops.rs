//! Memory and elementwise: the shared op suite's memory bodies (`dflash_tests::ops::memory`:
//! transfers, copies, narrowing, concatenation, adds, scales, reductions, malformed calls),
//! then what only this backend has: the side-stream download (pinned chunks) and the bf16
//! conversion.

use dflash_backend_cuda::DType;
use dflash_core::{GemmOps, MemoryOps, Transpose};
use dflash_tests::ops::memory;

use crate::common::*;

#[test]
fn memory_ops_match_reference() {
    let Some(cu) = cuda() else { return };
    let p = CudaPath::new("f32 activations", cu, DType::F32);
    memory::transfers_and_elementwise(&p);
    memory::narrow_and_concat(&p);
    memory::reductions(&p);
    memory::malformed_calls(&p);
}

/// The side-stream read of a fresh copy sees the copy's values (it waits for that write), also
/// from another thread and with the main stream still busy with later work; snapshots of
/// checkpoint size go through the 32 MB pinned buffers in chunks. Then the bf16 conversion.
#[test]
fn detached_downloads_and_bf16_conversion() {
    let Some(cu) = cuda() else { return };
    let mut r = rng(1);
    let (rows, cols) = (37, 29);
    let x = rand_vec(&mut r, rows * cols, 1.0);
    let y = rand_vec(&mut r, rows * cols, 1.0);
    let (xc, yc) = (up(&cu, &x, &[rows, cols]), up(&cu, &y, &[rows, cols]));
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
}
