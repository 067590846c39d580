//! Element counts of caller-supplied shapes are checked, never wrapped or panicked on, and the
//! default `MemoryOps` methods name the device of the backend that inherits them.
//!
//! `Mock` is the smallest backend that inherits every default: f32 values in a `Vec`.

use std::any::Any;

use dflash_core::ops::gemm::{matmul_acc_dims, matmul_dims};
use dflash_core::ops::loss::logits_chunk_rows;
use dflash_core::tensor::checked_numel;
use dflash_core::{
    AdamWParams, BackendInfo, Error, HostSlice, LossDims, MemoryOps, Result, Shape, Storage,
    Tensor, Transpose, concat_cols_dims, concat_rows_dims, embedding_dims, upload_numel,
};

/// What a `(1 << 32, 1 << 32)` shape's product wraps to on a 64-bit target: 0.
const HUGE: usize = 1 << 32;
const DEVICE: &str = "mock:3 (test device)";

#[derive(Debug)]
struct Buf(Vec<f32>);

impl Storage for Buf {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
    fn backend_name(&self) -> &'static str {
        "mock"
    }
    fn read_host(&self, n: usize) -> Result<Vec<f32>> {
        Ok(self.0[..n].to_vec())
    }
}

struct Mock;

fn data(t: &Tensor) -> &[f32] {
    &t.storage().as_any().downcast_ref::<Buf>().unwrap().0
}

impl BackendInfo for Mock {
    fn name(&self) -> &'static str {
        "mock"
    }
    fn device(&self) -> String {
        DEVICE.into()
    }
    fn attention_kernel(&self) -> &str {
        "none"
    }
}

impl MemoryOps for Mock {
    fn upload(&self, d: &[f32], shape: &[usize]) -> Result<Tensor> {
        upload_numel(d.len(), shape).map_err(|e| Error::shape("upload", DEVICE, e))?;
        Ok(Tensor::from_storage(Box::new(Buf(d.to_vec())), shape))
    }
    fn download(&self, t: &Tensor) -> Result<Vec<f32>> {
        Ok(data(t).to_vec())
    }
    fn zeros(&self, shape: &[usize]) -> Result<Tensor> {
        let n = checked_numel("zeros", DEVICE, shape)?;
        self.upload(&vec![0.0; n], shape)
    }
    fn copy(&self, t: &Tensor) -> Result<Tensor> {
        self.upload(data(t), t.dims())
    }
    fn narrow_rows(&self, _: &Tensor, _: usize, _: usize) -> Result<Tensor> {
        unimplemented!("not used by these tests")
    }
    fn concat_rows(&self, _: &[&Tensor]) -> Result<Tensor> {
        unimplemented!("not used by these tests")
    }
    fn concat_cols(&self, _: &[&Tensor]) -> Result<Tensor> {
        unimplemented!("not used by these tests")
    }
    fn add(&self, _: &Tensor, _: &Tensor) -> Result<Tensor> {
        unimplemented!("not used by these tests")
    }
    fn add_assign(&self, _: &mut Tensor, _: &Tensor) -> Result<()> {
        unimplemented!("not used by these tests")
    }
    fn scale_assign(&self, _: &mut Tensor, _: f32) -> Result<()> {
        unimplemented!("not used by these tests")
    }
    fn sum_squares(&self, _: &Tensor) -> Result<f64> {
        unimplemented!("not used by these tests")
    }
    fn all_finite(&self, _: &Tensor) -> Result<bool> {
        unimplemented!("not used by these tests")
    }
}

/// Asserts a shape error naming `op`, the device and (the start of) the offending shape.
fn assert_shape_err<T: std::fmt::Debug>(r: Result<T>, op: &str, device: &str, shape: &str) {
    let e = r.unwrap_err();
    let s = e.to_string();
    assert!(matches!(e, Error::Shape { .. }), "{s}");
    assert!(
        s.starts_with(&format!("{op} on {device}:")) && s.contains(shape),
        "{s}"
    );
}

#[test]
fn checked_numel_counts_and_rejects_overflow() {
    assert_eq!(checked_numel("op", "dev", &[]).unwrap(), 1);
    assert_eq!(checked_numel("op", "dev", &[3, 4, 5]).unwrap(), 60);
    assert_eq!(checked_numel("op", "dev", &[3, 0, 5]).unwrap(), 0);
    assert_eq!(
        checked_numel("op", "dev", &[usize::MAX]).unwrap(),
        usize::MAX
    );
    for bad in [
        vec![HUGE, HUGE],
        vec![usize::MAX, 2],
        vec![2, 3, usize::MAX / 4],
        // The whole count is 0, but the row length `HUGE * HUGE` of a matrix view is not
        // representable: rejected, so every sub-product of a checked shape fits.
        vec![0, HUGE, HUGE],
        vec![HUGE, HUGE, 0],
    ] {
        assert_shape_err(checked_numel("op", "dev", &bad), "op", "dev", "usize::MAX");
    }
}

/// Regression: `upload(&[], &[2^32, 2^32])` passed (the product wrapped to 0 in release,
/// panicked in debug), as did the matching `HostSlice::check`, `random_normal` and reshape.
#[test]
fn overflowing_shapes_are_shape_errors_not_panics() {
    let be = Mock;
    let huge = [HUGE, HUGE];
    assert!(upload_numel(0, &huge).unwrap_err().contains("usize::MAX"));
    assert_shape_err(
        be.upload(&[], &huge),
        "upload",
        DEVICE,
        "[4294967296, 4294967296]",
    );
    assert_shape_err(
        HostSlice::F32(&[]).check("upload_frozen", "dev", &huge),
        "upload_frozen",
        "dev",
        "[4294967296, 4294967296]",
    );
    assert_shape_err(
        be.upload_frozen(HostSlice::Bf16(&[]), &huge),
        "upload_frozen",
        DEVICE,
        "[4294967296, 4294967296]",
    );
    assert_shape_err(
        be.random_normal(&huge, 1.0, 7),
        "random_normal",
        DEVICE,
        "[4294967296, 4294967296]",
    );
    let mut t = be.zeros(&[0, 3]).unwrap();
    assert_shape_err(
        t.set_shape([0, HUGE, HUGE]),
        "set_shape",
        "mock",
        "[0, 4294967296",
    );
    assert_shape_err(t.reshape([HUGE, HUGE, 0]), "reshape", "mock", "[4294967296");
}

/// Rows of zero-width parts are not bounded by memory, so their sum can overflow.
#[test]
fn concat_rows_dims_rejects_an_overflowing_row_count() {
    let be = Mock;
    let t = be.zeros(&[usize::MAX / 2 + 1, 0]).unwrap();
    let e = concat_rows_dims(&[&t, &t]).unwrap_err();
    assert!(e.contains("usize::MAX"), "{e}");
    assert_eq!(concat_rows_dims(&[&t]).unwrap(), [usize::MAX / 2 + 1, 0]);
}

/// Regression: the defaults reported every error "on host", also for device backends that
/// inherit them.
#[test]
fn default_methods_name_the_inheriting_backends_device() {
    let be = Mock;
    let e = be.random_normal(&[2, 2], -1.0, 1).unwrap_err().to_string();
    assert!(e.starts_with(&format!("random_normal on {DEVICE}:")), "{e}");
    assert_shape_err(
        be.upload_frozen(HostSlice::F32(&[0; 12]), &[2, 2]),
        "upload_frozen",
        DEVICE,
        "[2, 2]",
    );
    let mut dst = be.zeros(&[3, 2]).unwrap();
    let src = be.upload(&[1.0, 2.0], &[1, 2]).unwrap();
    assert_shape_err(
        be.scatter_rows(&mut dst, &[3], &src),
        "scatter_rows",
        DEVICE,
        "row 3",
    );
    // And the defaults still work.
    be.scatter_rows(&mut dst, &[1], &src).unwrap();
    assert_eq!(data(&dst), [0.0, 0.0, 1.0, 2.0, 0.0, 0.0]);
    let f = be
        .upload_frozen(HostSlice::from_f32(&[1.5, -2.0]), &[2])
        .unwrap();
    assert_eq!(data(&f), [1.5, -2.0]);
    assert_eq!(be.random_normal(&[5], 1.0, 9).unwrap().dims(), [5]);
}

/// Regression: the shared validators bounded each operand but not results that multiply dims
/// of two operands. With a zero inner dim both operands are empty whatever the outer dims,
/// so the result's count (M*N of a matmul, T*V of the loss head's logits, T*H of an
/// embedding, the summed width of `concat_cols`) could wrap, and every backend sized a
/// buffer from the wrapped value.
#[test]
fn results_of_two_operands_have_checked_counts() {
    let be = Mock;
    let (a, b): (Shape, Shape) = ([HUGE, 0].into(), [0, HUGE].into());
    let e = matmul_dims(&a, Transpose::No, &b, Transpose::No).unwrap_err();
    assert!(
        e.contains("(4294967296, 4294967296)") && e.contains("usize::MAX"),
        "{e}"
    );
    let e = matmul_dims(&b, Transpose::Yes, &a, Transpose::Yes).unwrap_err();
    assert!(
        e.contains("a^T [0, 4294967296]") && e.contains("usize::MAX"),
        "{e}"
    );
    let c: Shape = [1, 1].into();
    let e = matmul_acc_dims(&c, &a, Transpose::No, &b, Transpose::No).unwrap_err();
    assert!(e.contains("usize::MAX"), "{e}");
    assert_eq!(
        matmul_dims(&a, Transpose::No, &[0, 3].into(), Transpose::No).unwrap(),
        (HUGE, 0, 3)
    );

    let x = be.zeros(&[4, 0]).unwrap();
    let w = be.zeros(&[1 << 62, 0]).unwrap();
    assert_shape_err(
        LossDims::of_argmax("linear_argmax", "dev", &x, &w),
        "linear_argmax",
        "dev",
        "[4, 0]",
    );
    let x = be.zeros(&[64, 0]).unwrap();
    let w = be.zeros(&[1 << 58, 0]).unwrap();
    assert_shape_err(
        LossDims::of_cross_entropy("linear_cross_entropy", "dev", &x, &w, &[0; 64], &[1.0; 64]),
        "linear_cross_entropy",
        "dev",
        "usize::MAX",
    );
    let x = be.zeros(&[1, 0]).unwrap();
    let dims = LossDims::of_argmax("linear_argmax", "dev", &x, &w).unwrap();
    assert_eq!((dims.rows, dims.vocab), (1, 1 << 58));

    let table = be.zeros(&[0, 1 << 61]).unwrap();
    let e = embedding_dims("embedding", "dev", &table, &[0, 0])
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with("embedding on dev:") && e.contains("token id 0 at position 0"),
        "{e}"
    );
    assert_eq!(
        embedding_dims("embedding", "dev", &table, &[]).unwrap(),
        (0, 1 << 61)
    );

    let p = be.zeros(&[0, 1 << 63]).unwrap();
    let e = concat_cols_dims(&[&p, &p]).unwrap_err();
    assert!(e.contains("usize::MAX"), "{e}");
    assert_eq!(concat_cols_dims(&[&p]).unwrap(), (0, vec![1 << 63]));
}

/// Regression: `logits_chunk_rows` computed `V * 4` unchecked; V is unbounded for a `(V, 0)`
/// head, so a backend sizing its chunk from a legal head panicked (debug) or got a wrapped
/// row count (release). A row larger than the budget now gets the 1-row minimum.
#[test]
fn logits_chunk_rows_never_overflows() {
    assert_eq!(logits_chunk_rows(1 << 20, 1 << 62, 64, 8), 1);
    assert_eq!(logits_chunk_rows(1 << 20, usize::MAX, 64, 8), 1);
    assert_eq!(logits_chunk_rows(1 << 20, 1024, 1024, 8), 256);
}

/// Regression: `AdamWParams::validate` checked only step and grad_scale, so beta = 1.0 in
/// f32 (a config's 0.99999999 after the cast), eps = 0, or a NaN/negative lr or weight decay
/// went through and turned every parameter NaN (or grew it) on the first step.
#[test]
fn adamw_validate_checks_every_hyper_parameter_in_f32() {
    let good = AdamWParams {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
        step: 1,
        grad_scale: 1.0,
    };
    good.validate().unwrap();
    AdamWParams {
        beta1: 0.0,
        beta2: 0.0,
        lr: 0.0,
        ..good
    }
    .validate()
    .unwrap();
    let bad = [
        (
            AdamWParams {
                beta1: 0.999_999_99_f64 as f32,
                ..good
            },
            "beta1 must be in [0, 1) as f32, got 1",
        ),
        (
            AdamWParams { beta2: 1.5, ..good },
            "beta2 must be in [0, 1) as f32, got 1.5",
        ),
        (
            AdamWParams {
                beta1: f32::NAN,
                ..good
            },
            "beta1",
        ),
        (
            AdamWParams { eps: 0.0, ..good },
            "eps must be finite and > 0 as f32, got 0",
        ),
        (AdamWParams { eps: -1e-8, ..good }, "eps"),
        (
            AdamWParams {
                lr: f32::INFINITY,
                ..good
            },
            "lr must be finite and >= 0, got inf",
        ),
        (
            AdamWParams {
                weight_decay: f32::NAN,
                ..good
            },
            "weight_decay must be finite and >= 0, got NaN",
        ),
    ];
    for (hp, want) in bad {
        let e = hp.validate().unwrap_err();
        assert!(e.contains(want), "{want:?} not in {e:?}");
    }
}
