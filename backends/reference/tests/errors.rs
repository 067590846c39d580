//! Error paths: every bad input is a typed error whose message names the op, the shapes
//! or names involved and the device; nothing panics.

mod common;

use std::any::Any;

use common::*;
use dflash_backend_reference::{ReferenceBackend, host_slice};
use dflash_core::mask::BlockMask;
use dflash_core::registry::{self, BackendOptions};
use dflash_core::{
    AttentionOps, BackendInfo, EmbeddingOps, Error, GemmOps, MemoryOps, NormOps, RopeOps, Storage,
    Tensor, Transpose,
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
}
