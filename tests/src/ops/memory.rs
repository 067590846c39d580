//! Memory ops against the reference backend: transfers, copies, zeros, narrowing,
//! concatenation, the element-wise glue (add, add_assign, scale_assign) and the reductions
//! (sum of squares, alone and batched; all_finite), at sizes around a small binding's chunk;
//! malformed calls with the reference's messages, and foreign tensors.

use dflash_core::{MemoryOps, Tensor};
use rand_chacha::ChaCha8Rng;

use super::{
    Arithmetic, Format, OpPath, assert_same_error, check_exact, down, rand_vec, reference, rng, up,
    upload_held,
};
use crate::tolerance::{AtolUnit, Tolerance, assert_close};

/// Lengths around a 4 KiB binding's 1024 f32 elements, and the empty tensor.
const SIZES: [usize; 6] = [1, 7, 1023, 1024, 5000, 0];

/// Upload and download, copy, zeros, add, add_assign and scale_assign: bit-exact (the same
/// single f32 rounding on both sides).
pub fn transfers_and_elementwise(path: &dyn OpPath) {
    let (be, rf) = (path.backend(), reference());
    let label = path.label();
    let mut r = rng(1);
    for n in SIZES {
        let a = rand_vec(&mut r, n, 2.0);
        let b = rand_vec(&mut r, n, 2.0);
        let (ta, tb) = (up(be, &a, &[n]), up(be, &b, &[n]));
        check_exact(
            &format!("[{label}] upload/download {n}"),
            &down(be, &ta),
            &a,
        );
        check_exact(
            &format!("[{label}] copy {n}"),
            &down(be, &be.copy(&ta).unwrap()),
            &a,
        );
        let z = be.zeros(&[n, 1]).unwrap();
        assert_eq!(z.dims(), &[n, 1]);
        check_exact(
            &format!("[{label}] zeros {n}"),
            &down(be, &z),
            &vec![0.0; n],
        );
        let want = down(
            &rf,
            &rf.add(&up(&rf, &a, &[n]), &up(&rf, &b, &[n])).unwrap(),
        );
        check_exact(
            &format!("[{label}] add {n}"),
            &down(be, &be.add(&ta, &tb).unwrap()),
            &want,
        );
        let mut acc = be.copy(&ta).unwrap();
        be.add_assign(&mut acc, &tb).unwrap();
        check_exact(&format!("[{label}] add_assign {n}"), &down(be, &acc), &want);
        let mut sb = be.copy(&ta).unwrap();
        be.scale_assign(&mut sb, -0.37).unwrap();
        let mut sr = up(&rf, &a, &[n]);
        rf.scale_assign(&mut sr, -0.37).unwrap();
        check_exact(
            &format!("[{label}] scale_assign {n}"),
            &down(be, &sb),
            &down(&rf, &sr),
        );
    }
}

/// `data` on the path in `format` (its values as held), and the held values on the reference.
fn both(path: &dyn OpPath, data: &[f32], shape: &[usize], format: Format) -> (Tensor, Tensor) {
    let (t, held) = upload_held(path, data, shape, format);
    (t, up(&reference(), &held, shape))
}

/// `narrow_rows` at the start, middle, last row and empty; `concat_rows` of parts with
/// different row counts, `concat_cols` of parts with different widths: bit-exact.
pub fn narrow_and_concat(path: &dyn OpPath) {
    narrow_and_concat_in(path, Format::F32);
}

/// [`narrow_and_concat`] on tensors of `format`, whose results must keep it (the moves are
/// pure copies, so they take any storage format). Odd widths put rows of 2-byte elements at
/// every alignment.
pub fn narrow_and_concat_in(path: &dyn OpPath, format: Format) {
    let (be, rf) = (path.backend(), reference());
    let mut r = rng(2);
    let parts = |r: &mut ChaCha8Rng, shapes: &[[usize; 2]]| -> (Vec<Tensor>, Vec<Tensor>) {
        shapes
            .iter()
            .map(|s| both(path, &rand_vec(r, s[0] * s[1], 1.0), s, format))
            .unzip()
    };
    for (rows, cols) in [(13, 7), (300, 33), (5, 1000), (1, 1), (37, 29)] {
        let x = rand_vec(&mut r, rows * cols, 3.0);
        let (tb, tr) = both(path, &x, &[rows, cols], format);
        for (start, len) in [
            (0, rows),
            (rows / 3, rows - rows / 3),
            (rows - 1, 1),
            (0, 0),
        ] {
            let what = format!("narrow_rows {rows}x{cols} [{start}, +{len})");
            let got = be.narrow_rows(&tb, start, len).unwrap();
            let want = rf.narrow_rows(&tr, start, len).unwrap();
            same_move(path, &what, format, &got, &want);
        }
        let (pb, pr) = parts(&mut r, &[[rows + 2, cols], [1, cols], [17, cols]]);
        let got = be.concat_rows(&refs(&pb)).unwrap();
        let want = rf.concat_rows(&refs(&pr)).unwrap();
        same_move(
            path,
            &format!("concat_rows of {cols} columns"),
            format,
            &got,
            &want,
        );
        let widths = [cols, 3, 2 * cols + 1];
        let (pb, pr) = parts(&mut r, &widths.map(|c| [rows, c]));
        let got = be.concat_cols(&refs(&pb)).unwrap();
        let want = rf.concat_cols(&refs(&pr)).unwrap();
        let what = format!("concat_cols {rows} rows, widths {widths:?}");
        same_move(path, &what, format, &got, &want);
    }
}

/// The parts as the concatenations take them.
fn refs(ts: &[Tensor]) -> Vec<&Tensor> {
    ts.iter().collect()
}

/// A move's result on the path against the reference's: the same dims, still in `format`, the
/// same values bit for bit.
fn same_move(path: &dyn OpPath, what: &str, format: Format, got: &Tensor, want: &Tensor) {
    let name = format!("[{}] {} {what}", path.label(), format.name());
    assert_eq!(got.dims(), want.dims(), "{name}: dims");
    assert_eq!(
        path.format_of(got),
        format,
        "{name}: keeps {}",
        format.name()
    );
    check_exact(&name, &down(path.backend(), got), &down(&reference(), want));
}

/// `sum_squares` against the reference's f64 sum (lengths past one and several reduction
/// blocks; 3 M elements off small bindings), deterministic, and `sum_squares_many` bit for bit
/// the single sums, the empty tensor included; `all_finite` finds NaN and infinities at chunk
/// edges and at the end, and takes `f32::MAX` as finite.
pub fn reductions(path: &dyn OpPath) {
    let (be, rf) = (path.backend(), reference());
    let label = path.label();
    let mut r = rng(3);
    let tol = match path.sum_squares_arithmetic() {
        Arithmetic::F64 => Tolerance {
            atol: 0.0,
            rtol: 1e-10,
            atol_unit: AtolUnit::Absolute,
            why: "f64 sums in a different order",
        },
        Arithmetic::F32 => Tolerance {
            atol: 0.0,
            rtol: 1e-5,
            atol_unit: AtolUnit::Absolute,
            why: "f32 partial sums of a few thousand squares, added in f64, vs f64",
        },
    };
    let mut lens = vec![1usize, 4095, 4097, 20_000, 3];
    if !path.small() {
        lens.push(3_000_017);
    }
    let xs: Vec<Vec<f32>> = lens.iter().map(|&n| rand_vec(&mut r, n, 3.0)).collect();
    let tb: Vec<Tensor> = xs.iter().map(|x| up(be, x, &[x.len()])).collect();
    let empty = up(be, &[], &[0]);
    let mut all: Vec<&Tensor> = tb.iter().collect();
    all.push(&empty);
    let many = be.sum_squares_many(&all).unwrap();
    for (i, (t, x)) in tb.iter().zip(&xs).enumerate() {
        let want = rf.sum_squares(&up(&rf, x, &[x.len()])).unwrap();
        let got = be.sum_squares(t).unwrap();
        assert_close(
            &format!("[{label}] sum_squares {}", x.len()),
            &[got],
            &[want],
            &tol,
        );
        let again = be.sum_squares(t).unwrap();
        assert_eq!(
            again.to_bits(),
            got.to_bits(),
            "[{label}] sum_squares is deterministic"
        );
        assert_eq!(
            many[i].to_bits(),
            got.to_bits(),
            "[{label}] sum_squares_many[{i}]"
        );
        assert!(be.all_finite(t).unwrap());
    }
    assert_eq!(
        many[tb.len()],
        0.0,
        "[{label}] sum_squares_many of an empty tensor"
    );
    assert_eq!(be.sum_squares(&empty).unwrap(), 0.0);
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        for at in [0, 4096, 9_999] {
            let mut x = rand_vec(&mut r, 10_000, 1.0);
            x[at] = bad;
            assert!(
                !be.all_finite(&up(be, &x, &[10_000])).unwrap(),
                "[{label}] {bad} at {at}"
            );
        }
    }
    assert!(
        be.all_finite(&up(be, &[f32::MAX, -f32::MAX], &[2]))
            .unwrap()
    );
    println!("  [{label}] all_finite: NaN / +-inf found at chunk edges, f32::MAX is finite");
}

/// Malformed calls fail with the reference's message (device name aside), never a panic; a
/// tensor of another backend is a typed error naming both, and `import` brings it over intact.
pub fn malformed_calls(path: &dyn OpPath) {
    let (be, rf) = (path.backend(), reference());
    let same = |what: &str, b: dflash_core::Result<Tensor>, r: dflash_core::Result<Tensor>| {
        let e = b.unwrap_err().to_string();
        assert_same_error(path, &e, &r.unwrap_err().to_string());
        println!("  [{}] {what:<30} {e}", path.label());
    };
    let (a3, b4) = (up(be, &[1.0; 6], &[2, 3]), up(be, &[1.0; 8], &[2, 4]));
    let (ra3, rb4) = (up(&rf, &[1.0; 6], &[2, 3]), up(&rf, &[1.0; 8], &[2, 4]));
    same(
        "upload",
        be.upload(&[1.0; 5], &[2, 3]),
        rf.upload(&[1.0; 5], &[2, 3]),
    );
    same("add", be.add(&a3, &b4), rf.add(&ra3, &rb4));
    same(
        "narrow_rows",
        be.narrow_rows(&a3, 1, 2),
        rf.narrow_rows(&ra3, 1, 2),
    );
    same(
        "concat_rows",
        be.concat_rows(&[&a3, &b4]),
        rf.concat_rows(&[&ra3, &rb4]),
    );
    let (c, rc) = (up(be, &[1.0; 3], &[3, 1]), up(&rf, &[1.0; 3], &[3, 1]));
    same(
        "concat_cols",
        be.concat_cols(&[&a3, &c]),
        rf.concat_cols(&[&ra3, &rc]),
    );
    same("concat_rows []", be.concat_rows(&[]), rf.concat_rows(&[]));
    let mut acc = be.copy(&a3).unwrap();
    let e = be.add_assign(&mut acc, &b4).unwrap_err().to_string();
    assert!(e.contains("add_assign") && e.contains(path.device()), "{e}");
    let e = be.copy(&ra3).unwrap_err().to_string();
    let named = format!("\"{}\"", be.name());
    assert!(e.contains("\"reference\"") && e.contains(&named), "{e}");
    assert!(!be.is_local(&ra3) && be.is_local(&a3));
    check_exact(
        &format!("[{}] import", path.label()),
        &down(be, &be.import(&ra3).unwrap()),
        &[1.0; 6],
    );
}
