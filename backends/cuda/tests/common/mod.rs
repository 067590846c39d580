//! Shared helpers of the CUDA conformance tests: backends (with an explicit, clean skip when
//! no CUDA device is present), seeded random inputs and tolerance checks that print the
//! measured error of every comparison.
//!
//! The conformance tests check the CUDA backend against the reference backend, one
//! integration-test file per op family (`memory gemm elementwise loss collective attention
//! drafter_step device`), one test per op family, each running the op on both backends on
//! fresh seeded random inputs (never zeros), CUDA outputs NaN-poisoned before the op writes
//! them, with a stated tolerance and its reason; attention on every mask family; a whole
//! drafter step (loss and every gradient). The op families' bodies are the shared suite's
//! (`dflash_tests::ops`, the same bodies the wgpu tests run), each configuration here a
//! [`CudaPath`].
//!
//! On a machine without CUDA every test prints `skipped: no CUDA device (<reason>)` and
//! passes; `create_backend_cuda_is_clean` then checks the registry returns `Unavailable`.
//!
//! Tolerances, by cause:
//! - exact: copies, gathers, f32 adds/scales (same single rounding on both sides);
//! - f32 vs f64 accumulation (norm, attention, loss statistics): ~1e-6 relative, stated as
//!   1e-5..1e-4 depending on the reduction length;
//! - bf16 GEMMs (the backend default): both operands rounded to 8 mantissa bits, each
//!   product term off by up to ~2^-8 relative (f32 accumulation): GEMM outputs ~4e-3 of
//!   `sum |a||b|`, everything downstream ~1e-2 (drafter gradients: rel-L2 5e-2);
//! - bf16 storage (`to_compute_format`): compared with the reference on the same bf16-rounded
//!   values; memory ops, embedding and the conversions bit-exact; GEMMs whose operands are all
//!   bf16-representable multiply exactly in every mode, so 1e-4 of `sum |a||b|` (f32
//!   accumulation only);
//! - TF32 GEMMs: operands keep 10 mantissa bits, so each product term is off by up
//!   to ~2^-10 relative: GEMM outputs ~1e-3 of `sum |a||b|`, and everything downstream of a
//!   GEMM (loss, drafter gradients) ~1e-3..1e-2. Each such check also runs with exact-f32
//!   GEMMs at a tight tolerance, which shows the difference is operand rounding and nothing
//!   else. Tests that use a GEMM only incidentally pin TF32 (`common::cuda`).
//! - bf16 activations (`cuda_act`, `CudaOptions::activations = Bf16`): an op computes in f32
//!   and rounds its output once (RNE) to bf16, so the tolerance is the op's f32 tolerance plus
//!   2^-8 of |ref| (`check_bf16`), against the reference on the same bf16-rounded inputs.
//!   Every other helper here gives f32 activations, so the tolerances above keep their meaning.
//!
//! Every tolerance is a `dflash_tests::tolerance::Tolerance` (named fields and its reason);
//! element-wise CUDA-vs-reference bounds put `atol` in units of the tensor's `max |ref|`
//! (`AtolUnit::MaxWant`), scalars are relative (`atol` 0).
#![allow(dead_code)]

use dflash_backend_cuda::{CudaBackend, CudaOptions, DType, GemmPrecision};
use dflash_core::registry::BackendOptions;
use dflash_core::{Backend, Error, Tensor};
pub use dflash_tests::ops::{Arithmetic, Format, OpPath};
// Not every test file uses every one of these.
#[allow(unused_imports)]
pub use dflash_tests::tolerance::{
    AtolUnit, Closeness, RelL2, Tolerance, assert_close, assert_rel_l2,
};

/// The CUDA backend on device 0 with debug poison on (every output allocation NaN-filled
/// first, so an unwritten element fails the comparison), or `None` after printing the skip
/// line when this machine has no CUDA. Any other start-up failure (e.g. a kernel that does
/// not compile) fails the test. Activations f32 (the tight f32 tolerances of the tests that
/// use it were stated for f32 activations); bf16 activations: [`cuda_act`].
pub fn cuda_with(gemm: GemmPrecision) -> Option<CudaBackend> {
    cuda_attn("cuda-simple", gemm)
}

/// As [`cuda_with`], with the attention kernel `attention` (e.g. `"cuda-flash"`); f32
/// activations.
pub fn cuda_attn(attention: &str, gemm: GemmPrecision) -> Option<CudaBackend> {
    cuda_attn_act(attention, gemm, DType::F32)
}

/// As [`cuda_with`], with activations stored as `activations`.
pub fn cuda_act(gemm: GemmPrecision, activations: DType) -> Option<CudaBackend> {
    cuda_attn_act("cuda-simple", gemm, activations)
}

/// The CUDA backend with attention kernel `attention`, GEMM precision `gemm`, activation
/// dtype `activations`, poison on.
pub fn cuda_attn_act(
    attention: &str,
    gemm: GemmPrecision,
    activations: DType,
) -> Option<CudaBackend> {
    cuda_attn_opts(
        attention,
        CudaOptions {
            gemm,
            activations,
            poison: true,
            attn_forward_ctas: None,
        },
    )
}

/// The CUDA backend with attention kernel `attention` and options `copts`.
pub fn cuda_attn_opts(attention: &str, copts: CudaOptions) -> Option<CudaBackend> {
    dflash_backend_cuda::link();
    let opts = BackendOptions {
        attention: attention.into(),
        threads: 0,
        device: 0,
    };
    match CudaBackend::with_options(&opts, copts) {
        Ok(b) => Some(b),
        Err(Error::Unavailable { reason, .. }) => {
            skip(&reason);
            None
        }
        Err(e) => panic!("the CUDA backend failed to start: {e}"),
    }
}

/// Prints `skipped: no CUDA device (<reason>)` where a plain `cargo test` shows it: the test
/// harness captures `print!`, not writes to the stderr handle.
pub fn skip(reason: &str) {
    use std::io::Write;
    let test = std::thread::current()
        .name()
        .unwrap_or("cuda test")
        .to_string();
    let _ = writeln!(
        std::io::stderr().lock(),
        "{test}: skipped: no CUDA device ({reason})"
    );
}

/// TF32 GEMMs, pinned (not the backend default, bf16): the tolerances of tests that only
/// use a GEMM incidentally were stated for TF32.
pub fn cuda() -> Option<CudaBackend> {
    cuda_with(GemmPrecision::Tf32)
}

// The helpers every backend's tests share (seeded inputs, transfers, exact checks); not
// every test file uses every one.
#[allow(unused_imports)]
pub use dflash_tests::ops::{check_exact, down, rand_vec, reference, rng, up};

// ---------------------------------------------------------------------------------------
// The op suite's paths

/// A CUDA backend as a path of the shared op suite (`dflash_tests::ops`): its activation dtype
/// decides the formats activation inputs come in and outputs are stored in.
pub struct CudaPath {
    label: String,
    pub cu: CudaBackend,
    act: DType,
}

impl CudaPath {
    pub fn new(label: &str, cu: CudaBackend, act: DType) -> Self {
        CudaPath {
            label: format!("cuda, {label}"),
            cu,
            act,
        }
    }

    /// Both activation dtypes (f32, then bf16: every input in f32 and in bf16, mixed
    /// included), TF32 GEMMs (these ops have none); empty without CUDA.
    pub fn activation_modes() -> Vec<CudaPath> {
        [DType::F32, DType::Bf16]
            .into_iter()
            .filter_map(|act| {
                let cu = cuda_act(GemmPrecision::Tf32, act)?;
                Some(CudaPath::new(
                    &format!("{} activations", act.name()),
                    cu,
                    act,
                ))
            })
            .collect()
    }
}

impl OpPath for CudaPath {
    fn label(&self) -> &str {
        &self.label
    }
    fn backend(&self) -> &dyn Backend {
        &self.cu
    }
    fn device(&self) -> &str {
        "cuda:0"
    }
    fn format_of(&self, t: &Tensor) -> Format {
        match dtype_of(t) {
            DType::F32 => Format::F32,
            DType::Bf16 => Format::Bf16,
        }
    }
    fn upload_as(&self, data: &[f32], shape: &[usize], format: Format) -> Tensor {
        match format {
            Format::F32 => up(&self.cu, data, shape),
            Format::Bf16 => up_bf16(&self.cu, data, shape),
            Format::F16 => panic!("[{}] the CUDA backend stores no f16", self.label),
        }
    }
    fn activation_inputs(&self) -> Vec<Format> {
        match self.act {
            DType::F32 => vec![Format::F32],
            DType::Bf16 => vec![Format::F32, Format::Bf16],
        }
    }
    fn activation_output(&self) -> Format {
        match self.act {
            DType::F32 => Format::F32,
            DType::Bf16 => Format::Bf16,
        }
    }
    /// The AdamW kernel evaluates the reference's formula in f64 and rounds each state once.
    fn adamw_arithmetic(&self) -> Arithmetic {
        Arithmetic::F64
    }
    /// The reduction kernels add squares in f64.
    fn sum_squares_arithmetic(&self) -> Arithmetic {
        Arithmetic::F64
    }
    fn upload_frozen_chunked(
        &self,
        data: dflash_core::HostSlice<'_>,
        shape: &[usize],
        chunk: usize,
    ) -> Option<dflash_core::Result<Tensor>> {
        Some(self.cu.upload_frozen_chunked(data, shape, chunk))
    }
}

// ---------------------------------------------------------------------------------------
// bf16 storage (`to_compute_format`)

/// The element type of a CUDA tensor.
pub fn dtype_of(t: &Tensor) -> dflash_backend_cuda::DType {
    t.storage()
        .as_any()
        .downcast_ref::<dflash_backend_cuda::CudaStorage>()
        .expect("a CUDA tensor")
        .dtype()
}

/// Every element rounded to bf16 (nearest even, by the `half` crate, independently of the
/// backend's kernel) and widened back to f32: the values a bf16 tensor holds.
pub fn bf16_rounded(x: &[f32]) -> Vec<f32> {
    x.iter().map(|&v| Format::Bf16.round(v)).collect()
}

/// `data` uploaded and converted to bf16 on the device (whatever the GEMM mode).
pub fn up_bf16(cu: &CudaBackend, data: &[f32], shape: &[usize]) -> Tensor {
    let t = cu
        .to_dtype(&up(cu, data, shape), dflash_backend_cuda::DType::Bf16)
        .expect("to_dtype bf16");
    assert_eq!(dtype_of(&t), dflash_backend_cuda::DType::Bf16);
    t
}

/// Element `i` passes when `|got - want| <= tol * scale_i` (for GEMMs `scale = sum_k
/// |a_ik||b_kj|`, the natural error scale of a dot product). Prints the worst ratio; NaN or
/// infinity in `got` fails.
pub fn check_scaled(
    name: &str,
    got: &[f32],
    want: &[f32],
    scale: &[f32],
    tol: f64,
    why: &str,
) -> f64 {
    assert_eq!(got.len(), want.len(), "{name}: lengths differ");
    assert_eq!(got.len(), scale.len(), "{name}: scale length differs");
    let (mut worst, mut at) = (0.0f64, 0usize);
    for (i, ((&g, &w), &s)) in got.iter().zip(want).zip(scale).enumerate() {
        assert!(g.is_finite(), "{name}[{i}]: got {g}");
        let r = (g as f64 - w as f64).abs() / (s as f64 + 1e-30);
        if r > worst {
            worst = r;
            at = i;
        }
    }
    println!(
        "  {name:<44} max err/scale {worst:9.2e}  err/tol {:5.3}  [tol {tol:e} of sum|a||b|: {why}]",
        worst / tol
    );
    assert!(
        worst <= tol,
        "{name}: element {at}: got {}, want {} (err/scale {worst:.3e} > {tol:e})",
        got[at],
        want[at]
    );
    worst
}

/// Asserts that `r` failed with an error naming `op`, `bf16` and the device (`cuda:0`).
pub fn assert_bf16_rejected<T>(r: dflash_core::Result<T>, op: &str) {
    let e = match r {
        Ok(_) => panic!("{op} accepted a bf16 input (it computes in f32 only)"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains(op) && e.contains("bf16") && e.contains("cuda:0"),
        "{op}: the error must name op, dtype and device: {e}"
    );
    println!("  {op:<44} rejects bf16: {e}");
}

// ---------------------------------------------------------------------------------------
// bf16 activations (`CudaOptions::activations = Bf16`)

/// bf16's unit roundoff: one round-to-nearest-even to 8 significant bits moves a value by at
/// most 2^-8 of itself (half an ulp, ulp <= 2^-7 relative).
pub const BF16_ROUND: f64 = 1.0 / 256.0;

/// A bf16 activation output against the reference's f32 result on the same (bf16-rounded)
/// inputs: the op computes in f32 and rounds once on store, so element `i` passes under the
/// op's own f32-vs-reference tolerance `tol` with one bf16 rounding (2^-8) added to its
/// `rtol`. Also asserts the values are bf16-representable (they came out of bf16 storage).
pub fn check_bf16(name: &str, got: &[f32], want: &[f32], tol: &Tolerance) -> Closeness {
    for (i, &g) in got.iter().enumerate() {
        assert_eq!(
            g.to_bits() & 0xffff,
            0,
            "{name}[{i}] = {g} is not a bf16 value"
        );
    }
    let with_rounding = Tolerance {
        rtol: BF16_ROUND + tol.rtol,
        ..*tol
    };
    println!("  {name:<44} (bf16 output: rtol includes one bf16 rounding, 2^-8)");
    assert_close(name, got, want, &with_rounding)
}

/// The CUDA tensor's dtype must be `want`.
pub fn assert_dtype(name: &str, t: &Tensor, want: DType) {
    assert_eq!(dtype_of(t), want, "{name}: dtype");
}

/// `data` on the CUDA backend as `dtype` (bf16: rounded on the device), and the values it
/// holds (bf16-rounded for bf16), for the reference.
pub fn up_as(cu: &CudaBackend, data: &[f32], shape: &[usize], dtype: DType) -> (Tensor, Vec<f32>) {
    match dtype {
        DType::F32 => (up(cu, data, shape), data.to_vec()),
        DType::Bf16 => (up_bf16(cu, data, shape), bf16_rounded(data)),
    }
}

/// Both dtypes, for input combinations.
pub const DTYPES: [DType; 2] = [DType::F32, DType::Bf16];
