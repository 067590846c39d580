//! The op conformance suite: one test body per op family, run by every device backend through
//! each of its paths (a configuration of the backend: storage formats, binding limits, kernel
//! variants), against the reference backend.
//!
//! A backend joins by implementing [`OpPath`] for its configurations in its test helpers and
//! calling a family's body (`elementwise::rms_norm(&path)`, ...) from a `#[test]`; the run is
//! named after the path in every line it prints and every failure ([`OpPath::label`]).
//!
//! What every body does:
//! - inputs are fresh uniform random values from a ChaCha8 stream seeded per family (never
//!   zeros), the same on both backends: where a path takes an input in a narrower storage
//!   format, the reference gets the values that input holds (its download);
//! - outputs are poisoned by the backend under test (paths are built with its debug poison on,
//!   every output allocation NaN-filled), so an element no kernel writes fails;
//! - every comparison states its tolerance and the reason ([`Tolerance::why`]); an activation
//!   output stored in a narrower format ([`OpPath::activation_output`]) adds one rounding to
//!   that format ([`Format::unit_roundoff`]) and must hold values of that format;
//! - malformed calls return errors naming the op and the device, the same text as the
//!   reference's where the check lives in core.

pub mod collective;
pub mod elementwise;
pub mod gemm;
pub mod loss;
pub mod memory;
pub mod storage;

use dflash_backend_reference::ReferenceBackend;
use dflash_core::registry::BackendOptions;
use dflash_core::{Backend, HostSlice, MemoryOps, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::tolerance::{Closeness, Tolerance, assert_close};

/// The storage format of a tensor's elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    F32,
    /// bfloat16: 8 significant bits (the CUDA backend's compute format).
    Bf16,
    /// IEEE half: 11 significant bits (the wgpu backend's compute format).
    F16,
}

impl Format {
    /// The name error messages use for it.
    pub fn name(self) -> &'static str {
        match self {
            Format::F32 => "f32",
            Format::Bf16 => "bf16",
            Format::F16 => "f16",
        }
    }

    /// `x` rounded to this format (to nearest, ties to even, by the `half` crate: independent of
    /// any backend's kernel) and widened back: the value a tensor of this format holds.
    pub fn round(self, x: f32) -> f32 {
        match self {
            Format::F32 => x,
            Format::Bf16 => half::bf16::from_f32(x).to_f32(),
            Format::F16 => half::f16::from_f32(x).to_f32(),
        }
    }

    /// How far one rounding to this format moves a value, relative to it: half an ulp (2^-8 for
    /// bf16, 2^-11 for f16; 0 for f32, whose rounding the ops' own tolerances already hold).
    pub fn unit_roundoff(self) -> f64 {
        match self {
            Format::F32 => 0.0,
            Format::Bf16 => 1.0 / 256.0,
            Format::F16 => 1.0 / 2048.0,
        }
    }
}

/// How a backend computes an op whose tolerance depends on it (AdamW per element, the sum of
/// squares).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arithmetic {
    /// In f64 throughout, a result stored as f32 rounded once: the reference's own arithmetic.
    F64,
    /// In f32: a rounding per operation (per AdamW state and step; per partial sum).
    F32,
}

/// One configuration of a backend under test.
pub trait OpPath {
    /// What the run is named after (`cuda, bf16 activations`; `wgpu, 4 KiB bindings`).
    fn label(&self) -> &str;
    fn backend(&self) -> &dyn Backend;
    /// The device as error messages name it (`cuda:0`, `wgpu:0`).
    fn device(&self) -> &str;
    /// The storage format of `t`, a tensor of this backend.
    fn format_of(&self, t: &Tensor) -> Format;
    /// `data` uploaded in `format` (one of [`Self::activation_inputs`], or the compute format):
    /// a narrower format is rounded by the backend, and the suite reads back what it holds.
    fn upload_as(&self, data: &[f32], shape: &[usize], format: Format) -> Tensor;
    /// The formats an activation input (of RMSNorm, RoPE, SwiGLU, the embedding table) may
    /// come in on this path, f32 first.
    fn activation_inputs(&self) -> Vec<Format> {
        vec![Format::F32]
    }
    /// The format activation outputs are stored in.
    fn activation_output(&self) -> Format {
        Format::F32
    }
    /// Whether to keep the shapes small: a path whose storage bindings hold a few KiB walks
    /// every tensor in many chunks, so the large shapes would only cost time.
    fn small(&self) -> bool {
        false
    }
    fn adamw_arithmetic(&self) -> Arithmetic {
        Arithmetic::F32
    }
    /// How `sum_squares` adds (f32 partial sums, or f64 throughout).
    fn sum_squares_arithmetic(&self) -> Arithmetic {
        Arithmetic::F32
    }
    /// `upload_frozen` in host chunks of `chunk` elements, where the backend lets a caller
    /// choose them (its chunk boundaries are what the test moves); `None`: it does not.
    fn upload_frozen_chunked(
        &self,
        data: HostSlice<'_>,
        shape: &[usize],
        chunk: usize,
    ) -> Option<dflash_core::Result<Tensor>> {
        let _ = (data, shape, chunk);
        None
    }
}

/// The reference backend: the definition of correct every path is compared with.
pub fn reference() -> ReferenceBackend {
    ReferenceBackend::new(&BackendOptions::default()).expect("reference backend")
}

pub fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

/// `n` values uniform in `[-s, s)` (never all zeros).
pub fn rand_vec(r: &mut ChaCha8Rng, n: usize, s: f32) -> Vec<f32> {
    (0..n).map(|_| r.random_range(-s..s)).collect()
}

pub fn up(be: &dyn MemoryOps, data: &[f32], shape: &[usize]) -> Tensor {
    be.upload(data, shape).expect("upload")
}

pub fn down(be: &dyn MemoryOps, t: &Tensor) -> Vec<f32> {
    be.download(t).expect("download")
}

/// Bit-exact comparison (copies, gathers, plain f32 adds).
pub fn check_exact(name: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{name}: lengths differ");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.to_bits(), w.to_bits(), "{name}[{i}]: {g} vs {w}");
    }
    println!("  {name:<44} bit-exact ({} elements)", got.len());
}

/// The format `to_compute_format` gives on the path (read off a probe tensor).
pub fn compute_format_of(path: &dyn OpPath) -> Format {
    let be = path.backend();
    let probe = be.to_compute_format(up(be, &[0.1, 0.2], &[2])).unwrap();
    path.format_of(&probe)
}

/// The path's compute format where it is narrower than f32; `None` after saying that there is
/// nothing of `what` to check where it is f32.
pub fn narrow_compute_format(path: &dyn OpPath, what: &str) -> Option<Format> {
    let cf = compute_format_of(path);
    if cf == Format::F32 {
        println!(
            "  [{}] the compute format is f32: no narrower {what}",
            path.label()
        );
        return None;
    }
    Some(cf)
}

/// `data` on `path` in `format`, and the values it holds (what the reference gets). A
/// narrower format must hold `data` rounded to it, element for element.
pub fn upload_held(
    path: &dyn OpPath,
    data: &[f32],
    shape: &[usize],
    format: Format,
) -> (Tensor, Vec<f32>) {
    let t = path.upload_as(data, shape, format);
    let held = holds(path, "upload_as", &t, data, shape, format);
    (t, held)
}

/// The values `t` (made by `how` from `data`) holds, after checking its format and shape and
/// that each is `data`'s rounded to `format`.
pub(crate) fn holds(
    path: &dyn OpPath,
    how: &str,
    t: &Tensor,
    data: &[f32],
    shape: &[usize],
    format: Format,
) -> Vec<f32> {
    let (label, fmt) = (path.label(), format.name());
    assert_eq!(path.format_of(t), format, "[{label}] {how} {fmt}");
    assert_eq!(t.dims(), shape, "[{label}] {how}");
    let held = down(path.backend(), t);
    for (i, (&h, &x)) in held.iter().zip(data).enumerate() {
        let want = format.round(x).to_bits();
        assert_eq!(
            h.to_bits(),
            want,
            "[{label}] {how}: element {i} in {fmt}: {x} held as {h}"
        );
    }
    held
}

/// Checks an f32 output (statistics, parameter gradients): its format and its values.
pub fn check_f32(
    path: &dyn OpPath,
    name: &str,
    got: &Tensor,
    want: &[f32],
    tol: &Tolerance,
) -> Closeness {
    check_stored(path, name, got, want, tol, Format::F32)
}

/// Checks an activation output against the reference's f32 result on the same held inputs:
/// stored in [`OpPath::activation_output`].
pub fn check_activation(
    path: &dyn OpPath,
    name: &str,
    got: &Tensor,
    want: &[f32],
    tol: &Tolerance,
) -> Closeness {
    check_stored(path, name, got, want, tol, path.activation_output())
}

/// `got`, stored in `format` (whose values it must hold), against `want` within the op's own f32
/// tolerance `tol` plus one rounding to that format (the op computes in f32 and rounds once on
/// store).
fn check_stored(
    path: &dyn OpPath,
    name: &str,
    got: &Tensor,
    want: &[f32],
    tol: &Tolerance,
    format: Format,
) -> Closeness {
    let name = format!("[{}] {name}", path.label());
    assert_eq!(path.format_of(got), format, "{name}: format");
    let g = down(path.backend(), got);
    if format == Format::F32 {
        return assert_close(&name, &g, want, tol);
    }
    for (i, &x) in g.iter().enumerate() {
        let held = format.round(x).to_bits() == x.to_bits();
        assert!(held, "{name}[{i}] = {x} is not a {} value", format.name());
    }
    let with_rounding = Tolerance {
        rtol: tol.rtol + format.unit_roundoff(),
        ..*tol
    };
    println!(
        "  {name:<44} ({} output: rtol includes one rounding, {:.1e})",
        format.name(),
        format.unit_roundoff()
    );
    assert_close(&name, &g, want, &with_rounding)
}

/// Asserts that `r` failed with an error whose text holds every one of `parts`; returns it.
pub fn assert_err<T>(r: dflash_core::Result<T>, parts: &[&str]) -> String {
    let e = match r {
        Ok(_) => panic!("expected an error containing {parts:?}"),
        Err(e) => e.to_string(),
    };
    for p in parts {
        assert!(e.contains(p), "error {e:?} lacks {p:?}");
    }
    e
}

/// Asserts that the path's error `e` is the reference's `want` but for the device's name.
pub fn assert_same_error(path: &dyn OpPath, e: &str, want: &str) {
    assert_eq!(e.replace(path.device(), "cpu"), want, "[{}]", path.label());
}
