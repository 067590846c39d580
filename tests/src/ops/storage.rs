//! Tensors in the backend's compute format ([`dflash_core::MemoryOps::to_compute_format`]:
//! frozen weights, features): an op that reads them reads exactly the values they hold, an op
//! that computes in f32 only refuses them by name instead of reading their bytes as f32, and
//! the moves keep them.

use dflash_core::{AdamWParams, HostSlice, MemoryOps};
use rand::Rng;

use super::elementwise::check_gather;
use super::memory;
use super::{
    Format, OpPath, assert_err, check_exact, compute_format_of, down, holds, narrow_compute_format,
    rand_vec, reference, rng, up,
};

/// `data` in the compute format, checked to hold `data` rounded to `format`, and its values.
fn compute_held(
    path: &dyn OpPath,
    data: &[f32],
    shape: &[usize],
    format: Format,
) -> (dflash_core::Tensor, Vec<f32>) {
    let be = path.backend();
    let t = be
        .to_compute_format(up(be, data, shape))
        .expect("to_compute_format");
    let held = holds(path, "to_compute_format", &t, data, shape, format);
    (t, held)
}

/// The embedding gather from a table in the compute format, bit-exact against the reference on
/// the values the table holds (widening is exact), odd `H` putting rows at odd 2-byte offsets;
/// then the f32-only inputs refused: `rms_norm_backward`'s statistics and every AdamW state.
/// On a path whose compute format is f32 there is nothing to check, and it says so.
pub fn compute_format(path: &dyn OpPath) {
    let be = path.backend();
    let Some(cf) = narrow_compute_format(path, "tensors to check") else {
        return;
    };
    let mut r = rng(104);
    for (v, h) in [(1000, 96), (777, 97), (5, 1)] {
        let table = rand_vec(&mut r, v * h, 4.0);
        let (tb, held) = compute_held(path, &table, &[v, h], cf);
        assert!(held != table, "the {} table rounds nothing", cf.name());
        let ids: Vec<u32> = (0..517).map(|_| r.random_range(0..v as u32)).collect();
        let name = format!("embedding, {} table ({v}, {h})", cf.name());
        check_gather(path, &name, &tb, &held, (v, h), &ids);
    }

    let (t, c) = (6, 16);
    let x = rand_vec(&mut r, t * c, 1.0);
    let w = rand_vec(&mut r, c, 1.0);
    let (xf, wf) = (up(be, &x, &[t, c]), up(be, &w, &[c]));
    let (xn, _) = compute_held(path, &x, &[t, c], cf);
    let (_, rstd) = be.rms_norm(&xf, &wf, 1e-6).unwrap();
    let rstd_n = be.to_compute_format(rstd).unwrap();
    let refused = |r: dflash_core::Result<_>, op: &str| {
        let e = assert_err(r, &[op, cf.name(), path.device()]);
        println!("  [{}] {op:<40} refuses {}: {e}", path.label(), cf.name());
    };
    refused(
        be.rms_norm_backward(&xf, &xf, &wf, &rstd_n).map(|_| ()),
        "rms_norm_backward",
    );
    let hp = AdamWParams {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.0,
        step: 1,
        grad_scale: 1.0,
    };
    let (mut m, mut v) = (be.zeros(&[t, c]).unwrap(), be.zeros(&[t, c]).unwrap());
    let mut pn = be.copy(&xn).unwrap();
    refused(be.adamw_step(&mut pn, &xf, &mut m, &mut v, &hp), "adamw");
    let mut pf = be.copy(&xf).unwrap();
    refused(be.adamw_step(&mut pf, &xn, &mut m, &mut v, &hp), "adamw");
}

/// Tensors in the compute format through the moves, which take any storage format: the
/// download widens exactly, `to_compute_format` of one keeps it, `copy`, `narrow_rows`,
/// `concat_rows` and `concat_cols` keep the format and the values bit for bit
/// ([`memory::narrow_and_concat_in`]), and a concatenation mixing it with f32 is an error naming
/// both (never a reinterpretation of the bytes).
pub fn compute_format_moves(path: &dyn OpPath) {
    let be = path.backend();
    let Some(cf) = narrow_compute_format(path, "tensors to move") else {
        return;
    };
    let label = path.label();
    let (rows, cols) = (37, 29);
    let x = rand_vec(&mut rng(101), rows * cols, 3.0);
    let (t, held) = compute_held(path, &x, &[rows, cols], cf);
    assert!(
        held != x,
        "[{label}] the inputs must not be {} values already",
        cf.name()
    );
    let again = be.to_compute_format(be.copy(&t).unwrap()).unwrap();
    assert_eq!(
        path.format_of(&again),
        cf,
        "[{label}] to_compute_format of a {} tensor",
        cf.name()
    );
    check_exact(
        &format!("[{label}] to_compute_format({})", cf.name()),
        &down(be, &again),
        &held,
    );
    let cp = be.copy(&t).unwrap();
    assert_eq!(path.format_of(&cp), cf, "[{label}] copy");
    check_exact(
        &format!("[{label}] {} copy", cf.name()),
        &down(be, &cp),
        &held,
    );
    memory::narrow_and_concat_in(path, cf);
    let xf = up(be, &x, &[rows, cols]);
    for (what, r) in [
        ("concat_rows", be.concat_rows(&[&t, &xf]).map(|_| ())),
        ("concat_cols", be.concat_cols(&[&t, &xf]).map(|_| ())),
    ] {
        let e = assert_err(r, &[what, cf.name(), "f32", path.device()]);
        println!("  [{label}] {what} of {} and f32 refused: {e}", cf.name());
    }
}

/// Values that exercise the conversions into a narrower format: random ones over twelve decades
/// (so past f16's range too), signed zeros, infinities, subnormals of every format, and ties of
/// bf16 rounding.
fn conversion_values(n: usize, seed: u64) -> Vec<f32> {
    let mut r = rng(seed);
    let special = [
        0.0f32,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        1.0e-40,
        -3.0e-42,
        6.0e-8,
        65504.0,
        f32::from_bits(0x3F80_8000), // 1 + 2^-8: a bf16 tie, rounds to even
        f32::from_bits(0x3F81_8000), // a tie that rounds up
        f32::from_bits(0x3F80_8001), // just above a tie
    ];
    (0..n)
        .map(|i| match special.get(i % 97) {
            Some(&s) => s,
            None => r.random_range(-4.0f32..4.0) * 10f32.powi(r.random_range(-6..6)),
        })
        .collect()
}

/// `n` 16-bit patterns of a file in `format` (bf16 or f16): every pattern but NaN, so every
/// exponent, subnormal and infinity occurs.
pub fn half_bits(format: Format, n: usize, seed: u64) -> Vec<u8> {
    let mut r = rng(seed);
    let inf = match format {
        Format::Bf16 => 0x7f80u16,
        _ => 0x7c00,
    };
    (0..n)
        .flat_map(|_| {
            let b = loop {
                let b: u16 = r.random();
                if b & 0x7fff <= inf {
                    break b;
                }
            };
            b.to_le_bytes()
        })
        .collect()
}

/// `upload_frozen` (the checkpoint loader, straight from a memory-mapped file): for f32, bf16
/// and f16 files whose bytes start one past an allocation's start (as a tensor in a memory map
/// may), the tensor is in the compute format and holds exactly what `to_compute_format(upload(
/// widened data))` holds, which is the reference's upload rounded to that format; chunked
/// uploads (chunks of 1000, 7 and all elements: boundaries off any vector width) where the path
/// has them give the same. A byte count that does not match the shape is an error naming the
/// op, the device, the shape and the dtype; an empty tensor uploads.
pub fn upload_frozen(path: &dyn OpPath) {
    let (be, rf) = (path.backend(), reference());
    let label = path.label();
    let cf = compute_format_of(path);
    let (rows, cols) = (37, 111); // 4107 elements, odd
    let n = rows * cols;
    let x = conversion_values(n, 3);
    for file in ["f32", "bf16", "f16"] {
        let mut bytes = vec![0xA5u8];
        match file {
            "f32" => bytes.extend(x.iter().flat_map(|v| v.to_le_bytes())),
            "bf16" => bytes.extend(half_bits(Format::Bf16, n, 5)),
            _ => bytes.extend(half_bits(Format::F16, n, 6)),
        }
        let data = match file {
            "f32" => HostSlice::F32(&bytes[1..]),
            "bf16" => HostSlice::Bf16(&bytes[1..]),
            _ => HostSlice::F16(&bytes[1..]),
        };
        let widened = data.to_f32_vec();
        let want: Vec<f32> = widened.iter().map(|&v| cf.round(v)).collect();
        let via_f32 = be
            .to_compute_format(up(be, &widened, &[rows, cols]))
            .unwrap();
        let name = format!("[{label}] {file} file: to_compute_format(upload(widened))");
        check_exact(&name, &down(be, &via_f32), &want);
        let rt = rf.upload_frozen(data, &[rows, cols]).unwrap();
        let name = format!("[{label}] {file} file: the reference's, in {}", cf.name());
        let reference_held: Vec<f32> = down(&rf, &rt).iter().map(|&v| cf.round(v)).collect();
        check_exact(&name, &reference_held, &want);
        let mut uploads = vec![(
            "default chunks".to_string(),
            be.upload_frozen(data, &[rows, cols]),
        )];
        for chunk in [1000, 7, n] {
            if let Some(t) = path.upload_frozen_chunked(data, &[rows, cols], chunk) {
                uploads.push((format!("chunks of {chunk}"), t));
            }
        }
        for (how, t) in uploads {
            let t = t.unwrap();
            assert_eq!(t.dims(), &[rows, cols]);
            assert_eq!(path.format_of(&t), cf, "[{label}] {file} file, {how}");
            check_exact(
                &format!("[{label}] {file} file, {how}"),
                &down(be, &t),
                &want,
            );
        }
    }
    let e = be
        .upload_frozen(HostSlice::Bf16(&[0u8; 10]), &[2, 3])
        .expect_err("10 bytes are not 6 bf16 elements")
        .to_string();
    let parts = ["upload_frozen", path.device(), "[2, 3]", "bf16"];
    assert!(parts.iter().all(|p| e.contains(p)), "[{label}] {e}");
    let empty = be.upload_frozen(HostSlice::F16(&[]), &[0, 5]).unwrap();
    assert_eq!(empty.dims(), &[0, 5]);
    assert!(down(be, &empty).is_empty());
}
