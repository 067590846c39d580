//! bf16 activations: the arithmetic memory ops on every input dtype combination.

use dflash_backend_cuda::DType;
use dflash_core::MemoryOps;

use crate::common::*;

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
