//! Element counts of caller-supplied shapes are checked, never wrapped or panicked on, and the
//! default `MemoryOps` methods name the device of the backend that inherits them.
//!
//! `Mock` is the smallest backend that inherits every default: f32 values in a `Vec`.

use std::any::Any;

use dflash_core::tensor::checked_numel;
use dflash_core::{
    BackendInfo, Error, HostSlice, MemoryOps, Result, Storage, Tensor, concat_rows_dims,
    upload_numel,
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
