//! Memory and elementwise: f32 uploads, downloads (the side-stream one included), copies,
//! row/column gathers, adds, scales, reductions and the bf16 conversion.

use dflash_backend_cuda::DType;
use dflash_core::{GemmOps, MemoryOps, Transpose};

use crate::common::*;

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
