//! bf16 storage: `to_compute_format` and the dtype-generic memory ops.

use dflash_backend_cuda::DType;
use dflash_core::MemoryOps;

use crate::common::*;

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
