//! Error paths: every bad input is a typed error whose message names the op, the shapes
//! or names involved and the device; nothing panics.

mod common;

use std::any::Any;

use common::*;
use dflash_backend_reference::{ReferenceBackend, host_slice};
use dflash_core::mask::BlockMask;
use dflash_core::registry::{self, BackendOptions};
use dflash_core::{
    AdamWParams, AttentionOps, BackendInfo, EmbeddingOps, Error, GemmOps, LossOps, MemoryOps,
    NormOps, OptimizerOps, RopeOps, Storage, Tensor, Transpose,
};

/// A buffer from some other backend.
#[derive(Debug)]
struct FakeStorage;
impl Storage for FakeStorage {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
    fn backend_name(&self) -> &'static str {
        "fakegpu"
    }
    fn read_host(&self, _n: usize) -> dflash_core::Result<Vec<f32>> {
        Err(Error::Unavailable {
            name: "fakegpu".into(),
            reason: "a fake buffer has no values".into(),
        })
    }
}

fn msg<T: std::fmt::Debug>(r: dflash_core::Result<T>) -> (Error, String) {
    let e = r.unwrap_err();
    let s = e.to_string();
    (e, s)
}

#[test]
fn matmul_shape_mismatch_names_op_shapes_and_device() {
    let be = backend();
    let a = up(&be, &[0.5; 12], &[3, 4]);
    let b = up(&be, &[0.5; 10], &[5, 2]);
    let (e, s) = msg(be.matmul(&a, Transpose::No, &b, Transpose::No));
    assert!(matches!(e, Error::Shape { .. }));
    for needle in ["matmul", "[3, 4]", "[5, 2]", "cpu"] {
        assert!(s.contains(needle), "{needle:?} missing from {s:?}");
    }
    let mut c = up(&be, &[0.0; 6], &[2, 3]);
    let b = up(&be, &[0.5; 8], &[4, 2]);
    let (_, s) = msg(be.matmul_acc(&mut c, &a, Transpose::No, &b, Transpose::No, 1.0));
    for needle in ["matmul_acc", "[2, 3]", "[3, 4]", "[4, 2]", "cpu"] {
        assert!(s.contains(needle), "{needle:?} missing from {s:?}");
    }
}

#[test]
fn foreign_tensor_is_an_error_not_a_panic() {
    let be = backend();
    let foreign = Tensor::from_storage(Box::new(FakeStorage), [2, 2]);
    let mine = up(&be, &[0.5; 4], &[2, 2]);
    let (e, s) = msg(be.add(&mine, &foreign));
    assert!(matches!(e, Error::ForeignTensor { .. }), "{e:?}");
    assert!(
        s.contains("add") && s.contains("fakegpu") && s.contains("cpu"),
        "{s}"
    );
    let (_, s) = msg(be.matmul(&foreign, Transpose::No, &mine, Transpose::No));
    assert!(s.contains("matmul") && s.contains("fakegpu"), "{s}");
    assert!(matches!(
        host_slice(&foreign),
        Err(Error::ForeignTensor { .. })
    ));
    let (_, s) = msg(be.download(&foreign));
    assert!(s.contains("download"), "{s}");
}

#[test]
fn unknown_attention_kernel_lists_registered_ones() {
    let opts = BackendOptions {
        attention: "flashy".into(),
        ..BackendOptions::default()
    };
    let e = match ReferenceBackend::new(&opts) {
        Ok(_) => panic!("unknown kernel accepted"),
        Err(e) => e,
    };
    let s = e.to_string();
    assert!(matches!(e, Error::UnknownName { .. }));
    assert!(s.contains("flashy") && s.contains("reference"), "{s}");
}

#[test]
fn registry_builds_the_reference_backend() {
    assert!(registry::backend_names().contains(&"reference".to_string()));
    assert!(registry::attention_kernel_names().contains(&"reference".to_string()));
    let be = registry::create_backend("reference", &BackendOptions::default()).unwrap();
    assert_eq!(be.name(), "reference");
    assert_eq!(be.attention_kernel(), "reference");
    assert!(be.device().starts_with("cpu"));
    let s = match registry::create_backend("nope", &BackendOptions::default()) {
        Ok(_) => panic!("unknown backend accepted"),
        Err(e) => e.to_string(),
    };
    assert!(s.contains("nope") && s.contains("reference"), "{s}");
}

#[test]
fn bad_inputs_to_other_ops() {
    let be = backend();
    let (_, s) = msg(be.upload(&[1.0; 5], &[2, 3]));
    assert!(
        s.contains("upload") && s.contains("[2, 3]") && s.contains('5'),
        "{s}"
    );

    let table = up(&be, &[0.5; 12], &[4, 3]);
    let (_, s) = msg(be.embedding(&table, &[1, 4]));
    assert!(
        s.contains("embedding") && s.contains("id 4") && s.contains("V = 4"),
        "{s}"
    );

    let t = up(&be, &[0.5; 12], &[4, 3]);
    let (_, s) = msg(be.narrow_rows(&t, 3, 2));
    assert!(s.contains("narrow_rows") && s.contains("[4, 3]"), "{s}");
    let (_, s) = msg(be.concat_rows(&[&t, &up(&be, &[0.5; 4], &[2, 2])]));
    assert!(s.contains("concat_rows") && s.contains("[2, 2]"), "{s}");
    let (_, s) = msg(be.add(&t, &up(&be, &[0.5; 12], &[3, 4])));
    assert!(s.contains("add") && s.contains("[3, 4]"), "{s}");

    let (_, s) = msg(be.rms_norm(&t, &up(&be, &[1.0; 4], &[4]), 1e-6));
    assert!(s.contains("rms_norm") && s.contains("[4]"), "{s}");
    let (_, s) = msg(be.rope(&up(&be, &[0.5; 12], &[2, 2, 3]), &[0, 1], 1e4));
    assert!(s.contains("rope") && s.contains("D even"), "{s}");
    let (_, s) = msg(be.rope(&up(&be, &[0.5; 8], &[2, 1, 4]), &[0, 1, 2], 1e4));
    assert!(s.contains("3 positions"), "{s}");

    // Attention: mask geometry must match q/k.
    let mask = BlockMask::causal(5).unwrap();
    let q = up(&be, &[0.5; 4 * 2 * 8], &[4, 2, 8]);
    let k = up(&be, &[0.5; 4 * 8], &[4, 1, 8]);
    let (_, s) = msg(be.attention(&q, &k, &k, &mask, 1.0));
    assert!(
        s.contains("attention") && s.contains("[4, 2, 8]") && s.contains("mask"),
        "{s}"
    );
    let mask = BlockMask::causal(4).unwrap();
    let k3 = up(&be, &[0.5; 4 * 3 * 8], &[4, 3, 8]);
    let (_, s) = msg(be.attention(&q, &k3, &k3, &mask, 1.0));
    assert!(s.contains("multiple of kv_heads"), "{s}");
}

/// Regression: shape products were unchecked, so `upload(&[], &[2^32, 2^32])` passed in
/// release (the product wraps to 0) and panicked in debug, as did `zeros`. Now every one is a
/// shape error naming op, shape and device.
#[test]
fn overflowing_shapes_are_errors_not_panics() {
    let be = backend();
    let huge = [1usize << 32, 1 << 32];
    let want = |s: &str, op: &str| {
        assert!(
            s.starts_with(&format!("{op} on cpu:"))
                && s.contains("[4294967296, 4294967296]")
                && s.contains("usize::MAX"),
            "{s}"
        );
    };
    let (e, s) = msg(be.upload(&[], &huge));
    assert!(matches!(e, Error::Shape { .. }), "{s}");
    want(&s, "upload");
    let (e, s) = msg(be.zeros(&huge));
    assert!(matches!(e, Error::Shape { .. }), "{s}");
    want(&s, "zeros");
    let (_, s) = msg(be.upload_frozen(dflash_core::HostSlice::F32(&[]), &huge));
    want(&s, "upload_frozen");
    // Inherited from the trait's default, which now names this backend's device.
    let (_, s) = msg(be.random_normal(&huge, 1.0, 3));
    assert!(
        s.contains("random_normal") && s.contains("usize::MAX"),
        "{s}"
    );
    let (_, s) = msg(be.random_normal(&[2], f32::NAN, 3));
    assert!(
        s.starts_with(&format!("random_normal on {}:", be.device())),
        "{s}"
    );
    // A zero dim does not excuse an unrepresentable row length.
    let (_, s) = msg(be.zeros(&[0, 1 << 32, 1 << 32]));
    assert!(s.contains("zeros on cpu:"), "{s}");
    // Shapes that fit still work, zero-sized ones included.
    assert_eq!(be.zeros(&[0, 1 << 32]).unwrap().numel(), 0);

    // Regression: matmul checked only the inner dims, so two legal empty operands with
    // K = 0 made an (M, N) result whose count wraps to 0 in release (sgemm then wrote M*N
    // zeros through a dangling pointer) and panicked in debug. Every product checks it now.
    let a = be.zeros(&[1 << 32, 0]).unwrap();
    let b = be.zeros(&[0, 1 << 32]).unwrap();
    let bt = be.zeros(&[1 << 32, 0]).unwrap();
    for (op, r) in [
        ("matmul", be.matmul(&a, Transpose::No, &b, Transpose::No)),
        ("matmul", be.linear(&a, &bt)),
        ("matmul", be.matmul(&b, Transpose::Yes, &bt, Transpose::Yes)),
    ] {
        let (e, s) = msg(r);
        assert!(matches!(e, Error::Shape { .. }), "{s}");
        assert!(
            s.starts_with(&format!("{op} on cpu:"))
                && s.contains("(4294967296, 4294967296)")
                && s.contains("usize::MAX"),
            "{s}"
        );
    }
    let mut c = be.zeros(&[1, 1]).unwrap();
    let (e, s) = msg(be.matmul_acc(&mut c, &a, Transpose::No, &b, Transpose::No, 1.0));
    assert!(matches!(e, Error::Shape { .. }), "{s}");
    assert!(
        s.starts_with("matmul_acc on cpu:") && s.contains("usize::MAX"),
        "{s}"
    );
    // An empty product that fits is still fine (a K = 0 product is all zeros).
    let a = be.zeros(&[2, 0]).unwrap();
    let ok = be.matmul(
        &a,
        Transpose::No,
        &be.zeros(&[0, 3]).unwrap(),
        Transpose::No,
    );
    assert_eq!(host_slice(&ok.unwrap()).unwrap(), &[0.0; 6]);
}

/// Regression: the fused loss head bounded T*H (x) and V*H (w_head) but never T*V, which is
/// unbounded when H = 0; its logits chunk `n * V` wrapped (release: sgemm through a dangling
/// pointer) or panicked (debug). Now both ops refuse such shapes up front.
#[test]
fn fused_loss_with_unrepresentable_logits_is_a_shape_error() {
    let be = backend();
    let x = be.zeros(&[4, 0]).unwrap();
    let w = be.zeros(&[1 << 62, 0]).unwrap();
    let (e, s) = msg(be.linear_argmax(&x, &w));
    assert!(matches!(e, Error::Shape { .. }), "{s}");
    assert!(
        s.starts_with("linear_argmax on cpu:")
            && s.contains("[4, 0]")
            && s.contains("[4611686018427387904, 0]")
            && s.contains("usize::MAX"),
        "{s}"
    );
    let x = be.zeros(&[64, 0]).unwrap();
    let w = be.zeros(&[1 << 58, 0]).unwrap();
    let (labels, weights) = (vec![0u32; 64], vec![1.0f32; 64]);
    let (e, s) = msg(be.linear_cross_entropy(&x, &w, &labels, &weights, 1.0));
    assert!(matches!(e, Error::Shape { .. }), "{s}");
    assert!(
        s.starts_with("linear_cross_entropy on cpu:") && s.contains("usize::MAX"),
        "{s}"
    );
    // With H = 0 and a representable (T, V) the ops still work: every logit is 0.
    let x = be.zeros(&[3, 0]).unwrap();
    let w = be.zeros(&[5, 0]).unwrap();
    assert_eq!(be.linear_argmax(&x, &w).unwrap(), vec![0, 0, 0]);
}

/// Regression: the reference embedding reserved `T * H` before checking the ids, so a
/// `(0, 2^61)` table (no valid id, yet a legal tensor) panicked with "capacity overflow".
#[test]
fn embedding_checks_ids_and_size_before_allocating() {
    let be = backend();
    let table = be.zeros(&[0, 1 << 61]).unwrap();
    let (e, s) = msg(be.embedding(&table, &[0, 0]));
    assert!(matches!(e, Error::Op { .. }), "{s}");
    assert!(
        s.starts_with("embedding on cpu:") && s.contains("token id 0 at position 0"),
        "{s}"
    );
    // No ids: an empty (0, H) result, however wide.
    assert_eq!(be.embedding(&table, &[]).unwrap().dims(), &[0, 1 << 61]);
}

/// Regression: `concat_cols` never checked the summed width, so two legal zero-row parts of
/// width 2^63 panicked in debug and made a wrongly shaped tensor in release.
#[test]
fn concat_cols_with_overflowing_width_is_a_shape_error() {
    let be = backend();
    let p = be.zeros(&[0, 1 << 63]).unwrap();
    let (e, s) = msg(be.concat_cols(&[&p, &p]));
    assert!(matches!(e, Error::Shape { .. }), "{s}");
    assert!(
        s.starts_with("concat_cols on cpu:") && s.contains("usize::MAX"),
        "{s}"
    );
    // Zero rows with a total width that fits is an empty result.
    let q = be.zeros(&[0, 1 << 62]).unwrap();
    assert_eq!(be.concat_cols(&[&q, &q]).unwrap().dims(), &[0, 1 << 63]);
}

/// Regression: `AdamWParams::validate` checked only step and grad_scale. A beta that is
/// below 1 in a config's f64 but rounds to 1.0 in f32 made `bc = 1 - beta^t` zero, and eps
/// = 0 made `0 / 0`: every parameter NaN after one step, silently. Now each is an error
/// naming the field and value, and nothing is written.
#[test]
fn adamw_rejects_hyper_parameters_that_would_make_nan() {
    let be = backend();
    let good = AdamWParams {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.1,
        step: 1,
        grad_scale: 1.0,
    };
    let almost_one = 0.999_999_99_f64 as f32; // < 1 in f64, exactly 1.0 in f32
    assert_eq!(almost_one, 1.0);
    let cases = [
        (
            AdamWParams {
                beta1: almost_one,
                ..good
            },
            "beta1",
            "got 1",
        ),
        (
            AdamWParams {
                beta2: almost_one,
                ..good
            },
            "beta2",
            "got 1",
        ),
        (
            AdamWParams {
                beta1: -0.1,
                ..good
            },
            "beta1",
            "got -0.1",
        ),
        (
            AdamWParams {
                beta2: f32::NAN,
                ..good
            },
            "beta2",
            "got NaN",
        ),
        (
            AdamWParams {
                eps: 1e-50_f64 as f32,
                ..good
            },
            "eps",
            "got 0",
        ),
        (
            AdamWParams {
                eps: f32::INFINITY,
                ..good
            },
            "eps",
            "got inf",
        ),
        (
            AdamWParams {
                lr: f32::NAN,
                ..good
            },
            "lr",
            "got NaN",
        ),
        (AdamWParams { lr: -1e-3, ..good }, "lr", "got -0.001"),
        (
            AdamWParams {
                weight_decay: -0.1,
                ..good
            },
            "weight_decay",
            "got -0.1",
        ),
        (
            AdamWParams {
                weight_decay: f32::INFINITY,
                ..good
            },
            "weight_decay",
            "got inf",
        ),
    ];
    let p0 = [0.5f32, -0.25, 1.0];
    let g = up(&be, &[0.0, 0.1, -0.2], &[3]);
    for (hp, field, value) in cases {
        let (mut p, mut m, mut v) = (
            up(&be, &p0, &[3]),
            be.zeros(&[3]).unwrap(),
            be.zeros(&[3]).unwrap(),
        );
        let (e, s) = msg(be.adamw_step(&mut p, &g, &mut m, &mut v, &hp));
        assert!(matches!(e, Error::Op { .. }), "{s}");
        assert!(
            s.starts_with("adamw_step on cpu:") && s.contains(field) && s.contains(value),
            "{field}: {s}"
        );
        assert_eq!(
            host_slice(&p).unwrap(),
            &p0,
            "{field}: param written on error"
        );
    }
    // Boundary values that are fine: beta 0, lr 0, weight decay 0; the result is finite.
    let edge = AdamWParams {
        beta1: 0.0,
        beta2: 0.0,
        lr: 0.0,
        weight_decay: 0.0,
        ..good
    };
    let (mut p, mut m, mut v) = (
        up(&be, &p0, &[3]),
        be.zeros(&[3]).unwrap(),
        be.zeros(&[3]).unwrap(),
    );
    be.adamw_step(&mut p, &g, &mut m, &mut v, &edge).unwrap();
    assert!(host_slice(&p).unwrap().iter().all(|x| x.is_finite()));
    be.adamw_step(&mut p, &g, &mut m, &mut v, &good).unwrap();
    assert!(host_slice(&p).unwrap().iter().all(|x| x.is_finite()));
}
