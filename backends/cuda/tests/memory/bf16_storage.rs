//! bf16 storage: `to_compute_format` and the dtype-generic memory ops.

use dflash_backend_cuda::DType;
use dflash_core::MemoryOps;

use crate::common::*;

/// With bf16 GEMMs `to_compute_format` stores bf16, and the moves keep it bit for bit (the
/// shared suite's `storage::compute_format_moves`); with TF32 GEMMs it keeps f32; the
/// arithmetic memory ops read bf16 inputs, widened exactly.
#[test]
fn bf16_memory_ops_match_reference() {
    use dflash_backend_cuda::GemmPrecision;
    let Some(cu) = cuda_with(GemmPrecision::Bf16) else {
        return;
    };
    let p = CudaPath::new("bf16 GEMMs, f32 activations", cu, DType::F32);
    dflash_tests::ops::storage::compute_format_moves(&p);
    let (cu, rf) = (&p.cu, reference());
    let mut r = rng(101);
    let (rows, cols) = (37, 29);
    let x = rand_vec(&mut r, rows * cols, 3.0);
    let xb = bf16_rounded(&x);
    let xc = cu.to_compute_format(up(cu, &x, &[rows, cols])).unwrap();
    let xr = up(&rf, &xb, &[rows, cols]);
    let xf = up(cu, &x, &[rows, cols]);
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
        &down(cu, &s),
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
        &down(cu, &xcm),
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
