//! Tensors in the backend's compute format ([`dflash_core::MemoryOps::to_compute_format`]:
//! frozen weights, features): an op that reads them reads exactly the values they hold, an op
//! that computes in f32 only refuses them by name instead of reading their bytes as f32, and
//! the moves keep them.

use dflash_core::AdamWParams;
use rand::Rng;

use super::elementwise::check_gather;
use super::memory;
use super::{Format, OpPath, assert_err, check_exact, down, rand_vec, rng, up};

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
    assert_eq!(
        path.format_of(&t),
        format,
        "[{}] to_compute_format",
        path.label()
    );
    let held = down(be, &t);
    for (i, (&h, &x)) in held.iter().zip(data).enumerate() {
        assert_eq!(
            h.to_bits(),
            format.round(x).to_bits(),
            "[{}] element {i}: {x} held as {h}",
            path.label()
        );
    }
    (t, held)
}

/// The embedding gather from a table in the compute format, bit-exact against the reference on
/// the values the table holds (widening is exact), odd `H` putting rows at odd 2-byte offsets;
/// then the f32-only inputs refused: `rms_norm_backward`'s statistics and every AdamW state.
/// On a path whose compute format is f32 there is nothing to check, and it says so.
pub fn compute_format(path: &dyn OpPath) {
    let be = path.backend();
    let probe = be.to_compute_format(up(be, &[0.1, 0.2], &[2])).unwrap();
    let cf = path.format_of(&probe);
    if cf == Format::F32 {
        println!(
            "  [{}] the compute format is f32: no narrower tensors to check",
            path.label()
        );
        return;
    }
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
    let probe = be.to_compute_format(up(be, &[0.1, 0.2], &[2])).unwrap();
    let cf = path.format_of(&probe);
    if cf == Format::F32 {
        println!(
            "  [{}] the compute format is f32: no narrower tensors to move",
            path.label()
        );
        return;
    }
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
