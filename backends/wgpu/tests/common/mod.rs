//! Shared helpers of the wgpu conformance tests: backends (with an explicit, clean skip where
//! no adapter exists), seeded random inputs and the checks that print each measured error.
//!
//! The tests check the wgpu backend against the reference backend, one integration-test file
//! per op family group (`memory gemm elementwise loss collective attention drafter_step
//! device`), each running the op on both backends on fresh seeded random inputs (never
//! zeros), wgpu outputs NaN-poisoned before the op writes them ([`wgpu`]), with a stated
//! tolerance and its reason. The op families' bodies are the shared suite's
//! (`dflash_tests::ops`, the same bodies the CUDA tests run), each backend configuration here
//! a [`WgpuPath`]; the attention cases and the drafter step are the suite's too. Every op also runs on a second instance whose storage bindings
//! are capped at a few KiB ([`wgpu_small_bindings`]), so the chunked paths (what a tensor
//! larger than the adapter's binding limit takes) are exercised on small inputs.
//!
//! Where this machine has no adapter every test prints `skipped: no wgpu adapter (<reason>)`
//! and passes (on Linux CI: `apt-get install mesa-vulkan-drivers` provides lavapipe).
//!
//! Tolerances, by cause (the wgpu kernels store f32 and accumulate in f32; the reference
//! accumulates in f64):
//! - exact: copies, gathers, f32 adds/scales (the same single rounding on both sides);
//! - f32 vs f64 accumulation (norm, loss, sums): ~1e-6 relative, stated as 1e-5..1e-4 by the
//!   reduction's length;
//! - GEMMs: f32 products with f32 accumulation against f64: |err| <= ~K * 2^-24 of
//!   `sum_k |a_ik||b_kj|`, stated as 1e-5 of that scale.
//!
//! The f16 compute format (`*_f16` tests, on [`wgpu_f16`]: adapters with `SHADER_F16`; a
//! clean skip naming the missing feature elsewhere): read-only operands are rounded to f16
//! (relative error <= 2^-11 ~ 4.9e-4 per element) and widened on load. Against the values the
//! f16 tensor holds (its download) an op is as exact as in f32; against the f32 originals the
//! rounding adds ~1e-3 relative, the bound stated by each test.
#![allow(dead_code)]

use dflash_backend_wgpu::{AttnCoop, DType, GemmKernel, WgpuBackend, WgpuOptions};
use dflash_core::registry::BackendOptions;
use dflash_core::{Backend, Error, MemoryOps, Tensor};
pub use dflash_tests::ops::{Format, OpPath};
#[allow(unused_imports)]
pub use dflash_tests::tolerance::{
    AtolUnit, Closeness, RelL2, Tolerance, assert_close, assert_rel_l2,
};

/// Storage bindings of [`wgpu_small_bindings`]: 4 KiB, 1024 f32 elements.
pub const SMALL_BINDING_BYTES: u64 = 4096;

/// The wgpu backend on adapter 0 with poison on (every output allocation NaN-filled first,
/// so an unwritten element fails the comparison) and the host `reference` attention kernel,
/// or `None` after printing the skip line when this machine has no adapter. Any other
/// start-up failure fails the test.
pub fn wgpu() -> Option<WgpuBackend> {
    wgpu_with("reference", None)
}

/// As [`wgpu`], without poison: outputs hold what the backend leaves in them.
pub fn wgpu_poison_off() -> Option<WgpuBackend> {
    let be = wgpu()?;
    let opts = WgpuOptions {
        poison: false,
        ..be.options()
    };
    Some(
        WgpuBackend::with_options(&BackendOptions::default(), opts)
            .expect("the wgpu backend without poison"),
    )
}

/// As [`wgpu`], with every storage binding capped at [`SMALL_BINDING_BYTES`].
pub fn wgpu_small_bindings() -> Option<WgpuBackend> {
    wgpu_with("reference", Some(SMALL_BINDING_BYTES))
}

/// Both: the adapter's limits, then small bindings (empty without an adapter).
pub fn wgpu_both() -> Vec<(&'static str, WgpuBackend)> {
    let mut v = Vec::new();
    if let Some(b) = wgpu() {
        v.push(("full bindings", b));
    }
    if let Some(b) = wgpu_small_bindings() {
        v.push(("4 KiB bindings", b));
    }
    v
}

/// The GEMM's backends: [`wgpu_both`] (the shipped `matmul128`) plus, on the adapter's limits,
/// the 64 x 64-tile kernel and the kernels behind switches ([`gemm_switch_variants`]).
pub fn wgpu_gemm_variants() -> Vec<(&'static str, WgpuBackend)> {
    let mut v = wgpu_both();
    if !v.is_empty() {
        let b = wgpu().expect("an adapter was found above");
        let opts = WgpuOptions {
            gemm: GemmKernel::Small,
            ..b.options()
        };
        let small = WgpuBackend::with_options(&BackendOptions::default(), opts)
            .expect("the wgpu backend with small GEMM tiles");
        assert_eq!(
            small.gemm_kernel(),
            "matmul",
            "the small-tile GEMM is not chosen"
        );
        v.push(("full bindings, 64-tile GEMM", small));
        v.extend(gemm_switch_variants(&b, false));
    }
    v
}

/// [`wgpu_f16_both`] plus the kernels behind switches with f16 storage on the adapter's limits.
pub fn wgpu_f16_gemm_variants() -> Vec<(&'static str, WgpuBackend)> {
    let mut v = wgpu_f16_both();
    if let Some(b) = wgpu_f16() {
        v.extend(gemm_switch_variants(&b, true));
    }
    v
}

/// The GEMM kernels behind `WgpuOptions::gemm` that the conformance tests run besides the
/// shipped one on f32 and f16 storage, with their labels on each (the small-tile kernel runs on
/// f32 only, [`wgpu_gemm_variants`]; the cooperative-matrix one rounds its operands to f16, so
/// it has its own reference, [`wgpu_coop_gemm_variants`]).
const GEMM_SWITCHES: [(GemmKernel, &str, &str); 3] = [
    (
        GemmKernel::DoubleBuffered,
        "full bindings, double-buffered GEMM",
        "f16, full bindings, double-buffered GEMM",
    ),
    (
        GemmKernel::Wide,
        "full bindings, 128-thread GEMM",
        "f16, full bindings, 128-thread GEMM",
    ),
    (
        GemmKernel::Narrow,
        "full bindings, 128 x 64-tile GEMM",
        "f16, full bindings, 128 x 64-tile GEMM",
    ),
];

/// `b` with each kernel of [`GEMM_SWITCHES`] alone, checked to run (`WgpuBackend::gemm_kernel`),
/// under its f32 or (`f16`) f16 label. The double-buffered one is left out, after a skip line,
/// where the adapter's workgroup storage cannot hold its tiles (the backend then runs the
/// shipped kernel, which the other variants test); the others need no more than the shipped
/// kernel does.
fn gemm_switch_variants(b: &WgpuBackend, f16: bool) -> Vec<(&'static str, WgpuBackend)> {
    let mut v = Vec::new();
    for (kernel, label32, label16) in GEMM_SWITCHES {
        let opts = WgpuOptions {
            gemm: kernel,
            ..b.options()
        };
        let be = WgpuBackend::with_options(&BackendOptions::default(), opts)
            .expect("the wgpu backend with a GEMM behind a switch");
        if be.gemm_kernel() == kernel.entry() {
            v.push((if f16 { label16 } else { label32 }, be));
        } else {
            assert_eq!(
                kernel,
                GemmKernel::DoubleBuffered,
                "{} is not chosen",
                kernel.entry()
            );
            skip(&format!(
                "the adapter's workgroup storage is too small for the double-buffered GEMM: {}",
                be.summary()
            ));
        }
    }
    v
}

/// `wgpu-tiled`, poisoned, with the tensor-core forward at `coop`: the backend's options and
/// the instance's.
fn tiled_with_coop(coop: AttnCoop) -> (BackendOptions, WgpuOptions) {
    let backend = BackendOptions {
        attention: "wgpu-tiled".into(),
        threads: 0,
        device: 0,
    };
    let opts = WgpuOptions {
        poison: true,
        attn_coop: coop,
        ..WgpuOptions::shipped()
    };
    (backend, opts)
}

/// `wgpu-tiled` with the tensor-core forward (`WgpuOptions::attn_coop`), poisoned, where the
/// adapter has cooperative matrices; elsewhere `None` ([`runs_or_is_refused`]).
#[allow(dead_code)]
pub fn wgpu_coop_attention() -> Option<WgpuBackend> {
    wgpu()?;
    let (backend, opts) = tiled_with_coop(AttnCoop::Required);
    if !runs_or_is_refused(&backend, opts, "the tensor-core attention forward") {
        return None;
    }
    Some(WgpuBackend::with_options(&backend, opts).expect("the wgpu backend with attn_coop"))
}

/// `wgpu-tiled` with its forward on tensor cores where the adapter has them
/// (as shipped: `AttnCoop::WhereSupported`), poisoned, else `None` after a skip
/// line naming what runs instead (the f32 forward, which the other helpers test).
pub fn wgpu_coop_attention_where_supported() -> Option<WgpuBackend> {
    wgpu()?;
    let (backend, opts) = tiled_with_coop(AttnCoop::WhereSupported);
    let be =
        WgpuBackend::with_options(&backend, opts).expect("the wgpu backend, coop where supported");
    if !be.coop_attention_forward() {
        skip(&format!(
            "the attention forward where supported is the f32 one here (tested elsewhere): {}",
            be.summary()
        ));
        return None;
    }
    Some(be)
}

/// Whether the adapter runs the cooperative-matrix kernels (`device::cooperative_matrix_support`).
/// Where it does not, `opts` (which ask for one, `what`) are first checked to be refused at
/// backend creation with that very reason, never running another kernel under its name, and
/// a skip line names the adapter and what it lacks.
fn runs_or_is_refused(backend: &BackendOptions, opts: WgpuOptions, what: &str) -> bool {
    let Err(why) = dflash_backend_wgpu::device::cooperative_matrix_support(0) else {
        return true;
    };
    let refused = WgpuBackend::with_options(backend, opts)
        .err()
        .unwrap_or_else(|| panic!("{what} started on an adapter that lacks what it needs"));
    assert_eq!(refused.to_string(), why.to_string());
    assert!(why.to_string().contains(" lacks "), "{why}");
    skip(&format!("{what} does not run here: {why}"));
    false
}

/// The cooperative-matrix GEMM's backends (`GemmKernel::Coop`, poisoned, f16 compute format):
/// on the adapter's limits and on 4 KiB bindings; or none, after a skip line naming the adapter
/// and what it lacks (`device::cooperative_matrix_support`: lavapipe has no cooperative
/// matrices), once such an adapter is checked to refuse the kernel with that very reason at
/// backend creation (never running another kernel under its name).
pub fn wgpu_coop_gemm_variants() -> Vec<(&'static str, WgpuBackend)> {
    if wgpu().is_none() {
        return Vec::new();
    }
    let opts = |max_binding_bytes| WgpuOptions {
        poison: true,
        max_binding_bytes,
        f16: true,
        gemm: GemmKernel::Coop,
        ..WgpuOptions::shipped()
    };
    let backend = BackendOptions {
        attention: "reference".into(),
        threads: 0,
        device: 0,
    };
    if !runs_or_is_refused(&backend, opts(None), "the cooperative-matrix GEMM") {
        return Vec::new();
    }
    let mut v = Vec::new();
    for (label, max) in [
        ("coop, full bindings", None),
        ("coop, 4 KiB bindings", Some(SMALL_BINDING_BYTES)),
    ] {
        let be = WgpuBackend::with_options(&backend, opts(max))
            .expect("the wgpu backend with the cooperative-matrix GEMM");
        assert_eq!(be.gemm_kernel(), "matmul_coop");
        assert_eq!(be.compute_format(), DType::F16, "{}", be.summary());
        v.push((label, be));
    }
    v
}

/// As [`wgpu`], with read-only tensors in f16 (`to_compute_format`), or `None` after printing
/// the skip line when there is no adapter or it lacks `SHADER_F16`.
pub fn wgpu_f16() -> Option<WgpuBackend> {
    wgpu_f16_with("reference", None)
}

/// [`wgpu_f16`] on the adapter's limits, then on small bindings (empty where it skips).
pub fn wgpu_f16_both() -> Vec<(&'static str, WgpuBackend)> {
    let mut v = Vec::new();
    if let Some(b) = wgpu_f16() {
        v.push(("f16, full bindings", b));
        if let Some(b) = wgpu_f16_with("reference", Some(SMALL_BINDING_BYTES)) {
            v.push(("f16, 4 KiB bindings", b));
        }
    }
    v
}

/// The f16 backend with attention kernel `attention` and a binding cap (see [`wgpu_f16`]).
pub fn wgpu_f16_with(attention: &str, max_binding_bytes: Option<u64>) -> Option<WgpuBackend> {
    let be = wgpu_opts(attention, max_binding_bytes, true)?;
    if be.compute_format() != DType::F16 {
        skip(&format!(
            "the adapter lacks SHADER_F16, so the f16 compute format is unavailable: {}",
            be.summary()
        ));
        return None;
    }
    Some(be)
}

/// The dtype of a wgpu tensor.
pub fn dtype(t: &Tensor) -> DType {
    t.storage()
        .as_any()
        .downcast_ref::<dflash_backend_wgpu::WgpuStorage>()
        .expect("a wgpu tensor")
        .dtype()
}

/// `data` uploaded and put in the compute format (asserted to be f16), and the values it
/// holds, each checked to be `data`'s rounded to f16: within 2^-11 relative, or 2^-25
/// absolute below f16's normal range (6.1e-5).
pub fn up_f16(be: &WgpuBackend, data: &[f32], shape: &[usize]) -> (Tensor, Vec<f32>) {
    let t = be
        .to_compute_format(up(be, data, shape))
        .expect("to_compute_format");
    assert_eq!(dtype(&t), DType::F16, "to_compute_format on an f16 backend");
    assert_eq!(t.dims(), shape);
    let held = down(be, &t);
    for (i, (&h, &x)) in held.iter().zip(data).enumerate() {
        let err = (h - x).abs();
        assert!(
            err <= x.abs() * 2f32.powi(-11) || err <= 2f32.powi(-25),
            "f16 rounding of element {i}: {x} held as {h}"
        );
    }
    (t, held)
}

/// The wgpu backend with attention kernel `attention` and a binding cap.
pub fn wgpu_with(attention: &str, max_binding_bytes: Option<u64>) -> Option<WgpuBackend> {
    wgpu_opts(attention, max_binding_bytes, false)
}

/// As [`wgpu`], with the row reductions through workgroup memory even where the adapter has
/// subgroups (the fallback, tested next to the subgroup variant on one adapter).
pub fn wgpu_workgroup_reductions() -> Option<WgpuBackend> {
    let be = wgpu_opts_full("reference", None, false, false)?;
    assert!(!be.subgroups());
    Some(be)
}

/// `wgpu-tiled` without subgroup operations: the plain attention forward (and workgroup-memory
/// reductions) where the adapter's subgroups would take the forward's softmax.
pub fn wgpu_tiled_without_subgroups() -> Option<WgpuBackend> {
    let be = wgpu_opts_full("wgpu-tiled", None, false, false)?;
    assert!(!be.subgroups());
    Some(be)
}

/// The backends the row-reduction tests run on: [`wgpu_both`], plus (where the adapter has
/// `SUBGROUP`, so that those use subgroup reductions) one with workgroup-memory reductions.
pub fn wgpu_reduction_variants() -> Vec<(&'static str, WgpuBackend)> {
    let mut v = wgpu_both();
    if v.first().is_some_and(|(_, b)| b.subgroups()) {
        if let Some(b) = wgpu_workgroup_reductions() {
            v.push(("full bindings, workgroup-memory reductions", b));
        }
    } else if !v.is_empty() {
        println!("  (the adapter has no SUBGROUP: workgroup-memory reductions only)");
    }
    v
}

fn wgpu_opts(attention: &str, max_binding_bytes: Option<u64>, f16: bool) -> Option<WgpuBackend> {
    wgpu_opts_full(attention, max_binding_bytes, f16, true)
}

fn wgpu_opts_full(
    attention: &str,
    max_binding_bytes: Option<u64>,
    f16: bool,
    subgroups: bool,
) -> Option<WgpuBackend> {
    dflash_backend_wgpu::link();
    dflash_backend_reference::link();
    let opts = BackendOptions {
        attention: attention.into(),
        threads: 0,
        device: 0,
    };
    // The shipped kernels (the attention variants where the adapter takes them), poisoned.
    // The f32 attention forward is pinned: the tensor-core one rounds its products to f16 and
    // is checked against its own bounds (`wgpu_coop_attention*`).
    let wopts = WgpuOptions {
        poison: true,
        max_binding_bytes,
        f16,
        subgroups,
        attn_coop: AttnCoop::Off,
        ..WgpuOptions::shipped()
    };
    match WgpuBackend::with_options(&opts, wopts) {
        Ok(b) => Some(b),
        Err(Error::Unavailable { reason, .. }) => {
            skip(&format!("no wgpu adapter ({reason})"));
            None
        }
        Err(e) => panic!("the wgpu backend failed to start: {e}"),
    }
}

/// Prints `skipped: <reason>` where a plain `cargo test` shows it.
pub fn skip(reason: &str) {
    use std::io::Write;
    let test = std::thread::current()
        .name()
        .unwrap_or("wgpu test")
        .to_string();
    let _ = writeln!(std::io::stderr().lock(), "{test}: skipped: {reason}");
}

// The helpers every backend's tests share (seeded inputs, transfers, exact and error checks);
// not every test file uses every one.
#[allow(unused_imports)]
pub use dflash_tests::ops::{assert_err, check_exact, down, rand_vec, reference, rng, up};

// ---- The op suite's paths -------------------------------------------------------------------

/// A wgpu backend as a path of the shared op suite (`dflash_tests::ops`), named after its
/// configuration.
pub struct WgpuPath {
    label: String,
    be: WgpuBackend,
}

impl WgpuPath {
    pub fn new(label: &str, be: WgpuBackend) -> Self {
        WgpuPath {
            label: format!("wgpu, {label}"),
            be,
        }
    }
}

/// Whether `be`'s storage bindings are capped at [`SMALL_BINDING_BYTES`].
fn small_bindings(be: &WgpuBackend) -> bool {
    be.options().max_binding_bytes == Some(SMALL_BINDING_BYTES)
}

impl OpPath for WgpuPath {
    fn label(&self) -> &str {
        &self.label
    }
    fn backend(&self) -> &dyn Backend {
        &self.be
    }
    fn device(&self) -> &str {
        "wgpu:0"
    }
    fn format_of(&self, t: &Tensor) -> Format {
        match dtype(t) {
            DType::F32 => Format::F32,
            DType::F16 => Format::F16,
        }
    }
    fn upload_as(&self, data: &[f32], shape: &[usize], format: Format) -> Tensor {
        match format {
            Format::F32 => up(&self.be, data, shape),
            Format::F16 => up_f16(&self.be, data, shape).0,
            Format::Bf16 => panic!("[{}] wgpu stores no bf16", self.label),
        }
    }
    /// Storage bindings of a few KiB: every tensor in many chunks.
    fn small(&self) -> bool {
        small_bindings(&self.be)
    }
    fn upload_frozen_chunked(
        &self,
        data: dflash_core::HostSlice<'_>,
        shape: &[usize],
        chunk: usize,
    ) -> Option<dflash_core::Result<Tensor>> {
        Some(self.be.upload_frozen_chunked(data, shape, chunk))
    }
}

/// `backends` (from [`wgpu_both`] and its siblings) as op-suite paths.
pub fn paths(backends: Vec<(&'static str, WgpuBackend)>) -> Vec<WgpuPath> {
    backends
        .into_iter()
        .map(|(label, be)| WgpuPath::new(label, be))
        .collect()
}

/// The attention suite's `cases` on `be`, its report printed; panics naming every failure.
pub fn run_suite(
    be: &dyn dflash_core::Backend,
    label: &str,
    cases: &[dflash_tests::Case],
    checks: &dflash_tests::AttentionChecks,
) {
    let report = dflash_tests::check_backend_attention(be, label, cases, checks);
    println!("{report}");
    if let Err(e) = report.ensure_passed() {
        panic!("{e}");
    }
}

/// The NaN cases on `layout`, the NaN in k, v, q and d_out (a zero weight times a NaN must not
/// reach a row or key that never reads it: the kernels' careful accumulation, in the forward,
/// dq and dk/dv).
pub fn run_nan_cases(be: &dyn dflash_core::Backend, label: &str, layout: dflash_tests::Layout) {
    let cases = dflash_tests::nan_input_cases_on(layout).unwrap();
    let report = dflash_tests::check_backend_attention_nan(be, label, &cases);
    println!("{report}");
    if let Err(e) = report.ensure_passed() {
        panic!("{e}");
    }
}

// ---- GEMM oracle ----------------------------------------------------------------------------

#[allow(unused_imports)]
pub use dflash_tests::ops::gemm::naive;

/// f32 products with f32 accumulation (fma) against f64: |err| <= ~K * 2^-24 of the scale.
pub const GEMM_TOL: f64 = dflash_tests::ops::gemm::GemmPrecision::F32.tol;

/// [`dflash_tests::ops::gemm::check_scaled`] at [`GEMM_TOL`]; the worst `|err| / scale`.
pub fn check_gemm(name: &str, got: &[f32], want: &[f64], scale: &[f64]) -> f64 {
    dflash_tests::ops::gemm::check_scaled(name, got, want, scale, GEMM_TOL)
}

// ---- f16 attention inputs -------------------------------------------------------------------

/// Attention on f16 q, k, v (and f16 out and d_out in the backward, as a benchmark hands
/// every input in the compute format) against f32 tensors holding the same values, on a
/// causal mask of `s` rows: forward (out, lse) and backward (dq, dk, dv) bit for bit equal,
/// since either way each value reaches the kernel's f32 arithmetic unchanged (the f32 path
/// itself is checked against the oracle by the suites). `(s, hq, hk, d)`: rows, q and kv
/// heads, head dim.
#[allow(dead_code)]
pub fn check_f16_inputs_exact(
    be: &WgpuBackend,
    label: &str,
    r: &mut rand_chacha::ChaCha8Rng,
    (s, hq, hk, d): (usize, usize, usize, usize),
) {
    use dflash_core::AttentionOps;
    let mask = dflash_core::mask::BlockMask::causal(s).unwrap();
    let (q16, q) = up_f16(be, &rand_vec(r, s * hq * d, 1.0), &[s, hq, d]);
    let (k16, k) = up_f16(be, &rand_vec(r, s * hk * d, 1.0), &[s, hk, d]);
    let (v16, v) = up_f16(be, &rand_vec(r, s * hk * d, 1.0), &[s, hk, d]);
    let (q32, k32, v32) = (
        up(be, &q, &[s, hq, d]),
        up(be, &k, &[s, hk, d]),
        up(be, &v, &[s, hk, d]),
    );
    let scale = 1.0 / (d as f32).sqrt();
    let (o16, l16) = be.attention(&q16, &k16, &v16, &mask, scale).unwrap();
    let (o32, l32) = be.attention(&q32, &k32, &v32, &mask, scale).unwrap();
    let (dout16, dout) = up_f16(be, &rand_vec(r, s * hq * d, 1.0), &[s, hq, d]);
    let (oh16, oh) = up_f16(be, &down(be, &o32), &[s, hq, d]);
    let (dout32, oh32) = (up(be, &dout, &[s, hq, d]), up(be, &oh, &[s, hq, d]));
    let g16 = be
        .attention_backward(&q16, &k16, &v16, &oh16, &l32, &dout16, &mask, scale)
        .unwrap();
    let g32 = be
        .attention_backward(&q32, &k32, &v32, &oh32, &l32, &dout32, &mask, scale)
        .unwrap();
    let tag = format!("{label} ({s}, {hq}/{hk}, {d})");
    for (name, a, b) in [
        ("out", &o16, &o32),
        ("lse", &l16, &l32),
        ("dq", &g16.0, &g32.0),
        ("dk", &g16.1, &g32.1),
        ("dv", &g16.2, &g32.2),
    ] {
        check_exact(&format!("f16 qkv {name} {tag}"), &down(be, a), &down(be, b));
    }
}
