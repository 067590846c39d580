//! The backend's CUDA C kernels: sources embedded with `include_str!`, compiled by NVRTC once
//! per process and architecture (`compute_XY`; the files in parallel, since start-up waits
//! for them), loaded into each device's primary context and shared by every backend instance
//! on it (see [`crate::device`]), and kept on disk between processes ([`ptx_cache`]). Kernels
//! are shape-generic: every size is a kernel argument.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{CudaContext, CudaFunction};
use cudarc::nvrtc::{CompileError, CompileOptions, compile_ptx_with_opts};

use crate::CudaError;

pub mod ptx_cache;
pub use ptx_cache::PtxCache;

/// Helpers prepended to every file (NVRTC has no file system).
const COMMON: &str = include_str!("../kernels/common.cuh");

/// The source of a file of the kernel set as compiled: `kernels/vec.cuh` (16-byte vector
/// loads/stores for the memory-bound kernels), then the file, each with its own line numbers
/// (the common prelude goes in front, in [`full_source`]). Not used for `attention.cu`.
macro_rules! kernel_src {
    ($file:literal) => {
        concat!(
            "#line 1 \"vec.cuh\"\n",
            include_str!("../kernels/vec.cuh"),
            "\n#line 1 \"",
            $file,
            "\"\n",
            include_str!(concat!("../kernels/", $file))
        )
    };
}

macro_rules! kernel_set {
    ($( $file:literal => [ $( $f:ident ),* $(,)? ] ),* $(,)?) => {
        /// Every kernel of the backend, loaded on one device.
        pub(crate) struct Kernels {
            $( $( pub $f: CudaFunction, )* )*
        }

        /// `(file name, source)` of every kernel file.
        pub const SOURCES: &[(&str, &str)] = &[
            $( ($file, kernel_src!($file)), )*
        ];

        impl Kernels {
            /// Compiles every file for `arch` (e.g. `compute_90`; each file at most once a
            /// process, all in parallel) and loads it into `ctx`.
            pub(crate) fn load(ctx: &Arc<CudaContext>, arch: &str) -> Result<Kernels, CudaError> {
                let mut ptx = compile_all(SOURCES, arch);
                $(
                    let module = {
                        let ptx = ptx.remove($file).unwrap_or_else(|| {
                            Err(CudaError::Unavailable(format!("{} was not compiled", $file)))
                        })?;
                        ctx.load_module(ptx).map_err(|e| CudaError::Driver {
                            what: format!("loading the module of {} ({arch})", $file),
                            source: e,
                        })?
                    };
                    $(
                        let $f = module.load_function(stringify!($f)).map_err(|e| {
                            CudaError::Driver {
                                what: format!("loading kernel {} of {}", stringify!($f), $file),
                                source: e,
                            }
                        })?;
                    )*
                )*
                Ok(Kernels { $( $( $f, )* )* })
            }
        }
    };
}

// Templated kernels are instantiated per element type of their activation pointers (f32 or
// bf16), one letter each (`f` / `b`), outputs first, e.g. `add_bff`; see `kernels/common.cuh`
// and [`pick`].
kernel_set! {
    "elementwise.cu" => [
        fill_f32, fill_u16,
        add_fff, add_ffb, add_fbf, add_fbb, add_bff, add_bfb, add_bbf, add_bbb,
        add_assign_ff, add_assign_fb, add_assign_bf, add_assign_bb,
        scale_f, scale_b,
        copy_cols_f32, copy_cols_u16, gather_rows_f32, gather_rows_u16,
        scatter_rows_f, scatter_rows_b,
        sum_squares_partial_f, sum_squares_partial_b, sum_final_f64,
        nonfinite_partial_f, nonfinite_partial_b, sum_final_u64,
        f32_to_bf16, bf16_to_f32, random_normal_f32,
    ],
    "norm.cu" => [
        rms_norm_fwd_ff, rms_norm_fwd_fb, rms_norm_fwd_bf, rms_norm_fwd_bb,
        rms_norm_bwd_dx_fff, rms_norm_bwd_dx_ffb, rms_norm_bwd_dx_fbf, rms_norm_bwd_dx_fbb,
        rms_norm_bwd_dx_bff, rms_norm_bwd_dx_bfb, rms_norm_bwd_dx_bbf, rms_norm_bwd_dx_bbb,
        rms_norm_bwd_dw_partial_ff, rms_norm_bwd_dw_partial_fb, rms_norm_bwd_dw_partial_bf,
        rms_norm_bwd_dw_partial_bb, rms_norm_bwd_dw_final,
    ],
    "rope.cu" => [rope_rotate_ff, rope_rotate_fb, rope_rotate_bf, rope_rotate_bb],
    "activation.cu" => [
        swiglu_fwd_ff, swiglu_fwd_fb, swiglu_fwd_bf, swiglu_fwd_bb,
        swiglu_bwd_ff, swiglu_bwd_fb, swiglu_bwd_bf, swiglu_bwd_bb,
    ],
    "embedding.cu" => [
        embedding_gather_ff, embedding_gather_fb, embedding_gather_bf, embedding_gather_bb,
    ],
    "loss.cu" => [ce_rows, argmax_rows],
    "optimizer.cu" => [adamw_f32],
    "attention_simple.cu" => [
        attn_fwd_ff, attn_fwd_fb, attn_fwd_bf, attn_fwd_bb,
        attn_bwd_dsum_f, attn_bwd_dsum_b,
        attn_bwd_dq_ff, attn_bwd_dq_fb, attn_bwd_dq_bf, attn_bwd_dq_bb,
        attn_bwd_dkdv_ff, attn_bwd_dkdv_fb, attn_bwd_dkdv_bf, attn_bwd_dkdv_bb,
    ],
}

/// The instantiation of a templated kernel for the element types `dts` (outputs first, in
/// the order of its name's letters): `fs` lists the instantiations in `DF_INST*` order
/// (`f` = 0, `b` = 1, first letter most significant).
pub(crate) fn pick<'a>(fs: &[&'a CudaFunction], dts: &[crate::DType]) -> &'a CudaFunction {
    debug_assert_eq!(fs.len(), 1 << dts.len());
    let i = dts
        .iter()
        .fold(0usize, |i, d| 2 * i + usize::from(*d == crate::DType::Bf16));
    fs[i]
}

/// The root file of the bf16 flash attention (`"cuda-flash"`), compiled separately and only
/// when a backend selects it (see `flash.rs`). It `#include`s its parts
/// ([`FLASH_PARTS`]), which [`flash_source`] splices in.
pub const FLASH_FILE: &str = "attention.cu";

/// The parts `kernels/attention.cu` includes, as `(include name, source)`: embedded, since
/// NVRTC runs without the source tree.
pub const FLASH_PARTS: &[(&str, &str)] = &[
    (
        "attention/common.cuh",
        include_str!("../kernels/attention/common.cuh"),
    ),
    (
        "attention/fwd_mma.cuh",
        include_str!("../kernels/attention/fwd_mma.cuh"),
    ),
    (
        "attention/wgmma_gen.cuh",
        include_str!("../kernels/attention/wgmma_gen.cuh"),
    ),
    (
        "attention/fwd_wgmma.cuh",
        include_str!("../kernels/attention/fwd_wgmma.cuh"),
    ),
    (
        "attention/bwd_mma.cuh",
        include_str!("../kernels/attention/bwd_mma.cuh"),
    ),
    (
        "attention/bwd_wgmma.cuh",
        include_str!("../kernels/attention/bwd_wgmma.cuh"),
    ),
];

/// `(file name, whole source)` of the flash attention: `attention.cu` with each
/// `#include "attention/<part>"` line replaced by that part, bracketed by `#line` directives so
/// that NVRTC's messages name the part and its line. An include of an unknown part is left as
/// it is (NVRTC then reports it by name).
pub fn flash_source() -> (&'static str, String) {
    let root = include_str!("../kernels/attention.cu");
    let mut out = String::with_capacity(
        root.len() + FLASH_PARTS.iter().map(|p| p.1.len() + 64).sum::<usize>(),
    );
    for (i, line) in root.lines().enumerate() {
        let part = line
            .strip_prefix("#include \"")
            .and_then(|r| r.strip_suffix('"'))
            .and_then(|name| FLASH_PARTS.iter().find(|(n, _)| *n == name));
        match part {
            Some((name, src)) => {
                out.push_str(&format!(
                    "#line 1 \"{name}\"\n{src}\n#line {} \"{FLASH_FILE}\"\n",
                    i + 2
                ));
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    (FLASH_FILE, out)
}

/// The full source NVRTC sees for `file`: the common prelude, then the file with its own line
/// numbers.
pub fn full_source(file: &str, src: &str) -> String {
    format!("{COMMON}\n#line 1 \"{file}\"\n{src}")
}

/// One file's PTX for one architecture, once compiled.
type Slot = Arc<Mutex<Option<cudarc::nvrtc::Ptx>>>;

/// The PTX compiled in this process, by `(file, arch)`: devices of one architecture share it,
/// so a device started after another loads modules without compiling.
static COMPILED: OnceLock<Mutex<HashMap<(&'static str, String), Slot>>> = OnceLock::new();

/// `file`'s PTX for `arch`, compiled on the first request of this process (concurrent
/// requests wait for that one compilation). A failure is not kept: the next request retries.
pub fn compile_once(
    file: &'static str,
    src: &str,
    arch: &str,
) -> Result<cudarc::nvrtc::Ptx, CudaError> {
    let slot = {
        let map = COMPILED.get_or_init(Default::default);
        let mut map = map.lock().unwrap_or_else(|p| p.into_inner());
        map.entry((file, arch.to_string())).or_default().clone()
    };
    let mut ptx = slot.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(p) = ptx.as_ref() {
        return Ok(p.clone());
    }
    let compiled = compile_cached(file, src, arch)?;
    *ptx = Some(compiled.clone());
    Ok(compiled)
}

/// Every `(file, source)` of `files` compiled for `arch` by [`compile_once`], one thread a
/// file (NVRTC is thread-safe across programs), by file name.
pub fn compile_all(
    files: &[(&'static str, &str)],
    arch: &str,
) -> HashMap<&'static str, Result<cudarc::nvrtc::Ptx, CudaError>> {
    std::thread::scope(|s| {
        let running: Vec<_> = files
            .iter()
            .map(|&(file, src)| (file, s.spawn(move || compile_once(file, src, arch))))
            .collect();
        running
            .into_iter()
            .map(|(file, t)| {
                let ptx = t.join().unwrap_or_else(|_| {
                    Err(CudaError::Unavailable(format!(
                        "compiling {file} for {arch} panicked"
                    )))
                });
                (file, ptx)
            })
            .collect()
    })
}

/// [`compile`], through the disk cache ([`PtxCache`]) where the environment keeps one and
/// NVRTC is there to say its version (part of the key: another NVRTC may emit other PTX).
fn compile_cached(file: &str, src: &str, arch: &str) -> Result<cudarc::nvrtc::Ptx, CudaError> {
    compile_through(PtxCache::from_env().as_ref(), file, src, arch)
}

/// [`compile`] through `cache`, where there is one and NVRTC can say its version.
fn compile_through(
    cache: Option<&PtxCache>,
    file: &str,
    src: &str,
    arch: &str,
) -> Result<cudarc::nvrtc::Ptx, CudaError> {
    let (Some(cache), Some(version)) = (cache, nvrtc_version()) else {
        return compile(file, src, arch);
    };
    let key = ptx_cache::key(&[
        full_source(file, src).as_bytes(),
        nvrtc_options(arch).join("\n").as_bytes(),
        version.as_bytes(),
    ]);
    cache
        .get_or_compile(file, arch, key, || {
            compile(file, src, arch).map(|p| p.to_src())
        })
        .map(cudarc::nvrtc::Ptx::from_src)
}

/// NVRTC's `major.minor`, or `None` where the library is not there to ask.
fn nvrtc_version() -> Option<String> {
    use cudarc::nvrtc::sys;
    // SAFETY: `is_culib_present` is checked first, so the dynamic load cannot panic; the
    // out-pointers are valid for the call.
    unsafe {
        if !sys::is_culib_present() {
            return None;
        }
        let (mut major, mut minor) = (0, 0);
        let ok = sys::nvrtcVersion(&mut major, &mut minor) == sys::nvrtcResult::NVRTC_SUCCESS;
        ok.then(|| format!("{major}.{minor}"))
    }
}

/// NVRTC's options for `arch`.
fn nvrtc_options(arch: &str) -> Vec<String> {
    vec![format!("--gpu-architecture={arch}")]
}

/// Compiles one file to PTX; a failure carries NVRTC's log.
pub fn compile(file: &str, src: &str, arch: &str) -> Result<cudarc::nvrtc::Ptx, CudaError> {
    let opts = CompileOptions {
        options: nvrtc_options(arch),
        name: Some(file.to_string()),
        ..Default::default()
    };
    compile_ptx_with_opts(full_source(file, src), opts).map_err(|e| {
        let log = match &e {
            CompileError::CompileError { log, .. } => log.to_string_lossy().into_owned(),
            other => format!("{other:?}"),
        };
        CudaError::Compile {
            file: file.to_string(),
            arch: arch.to_string(),
            log,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept(file: &'static str, arch: &str) -> Option<bool> {
        let map = COMPILED.get()?.lock().unwrap();
        let slot = map.get(&(file, arch.to_string()))?;
        Some(slot.lock().unwrap().is_some())
    }

    /// A file's PTX is kept for its architecture after the first compilation and handed out
    /// again; a failure is not kept, so a later request compiles again.
    #[test]
    fn compiled_ptx_is_kept_per_file_and_arch_and_failures_are_not() {
        if unsafe { !cudarc::nvrtc::sys::is_culib_present() } {
            println!("skipped: NVRTC library not found");
            return;
        }
        let (file, src) = (
            "kept_test.cu",
            "extern \"C\" __global__ void k(float *x) { x[0] = 1.0f; }",
        );
        let files = [(file, src), ("kept_test_2.cu", src)];
        let first = compile_all(&files, "compute_80");
        assert_eq!(first.len(), 2);
        assert_eq!(kept(file, "compute_80"), Some(true));
        assert_eq!(kept(file, "compute_90"), None, "kept per architecture");
        let again = compile_once(file, src, "compute_80").unwrap();
        assert_eq!(again.to_src(), first[file].as_ref().unwrap().to_src());

        let broken = "extern \"C\" __global__ void k() { undefined_thing(); }";
        for _ in 0..2 {
            let e = compile_once("kept_broken.cu", broken, "compute_80").unwrap_err();
            assert!(e.to_string().contains("undefined_thing"), "{e}");
            assert_eq!(kept("kept_broken.cu", "compute_80"), Some(false));
        }
    }

    /// Through a disk cache, the first compilation writes an entry holding NVRTC's PTX and
    /// the next one reads it back unchanged; a broken file writes no entry.
    #[test]
    fn compiled_ptx_goes_through_the_disk_cache_unchanged() {
        if unsafe { !cudarc::nvrtc::sys::is_culib_present() } {
            println!("skipped: NVRTC library not found");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let cache = PtxCache::at(dir.path());
        let (file, src) = (
            "cached_test.cu",
            "extern \"C\" __global__ void k(float *x) { x[0] = 2.0f; }",
        );
        let direct = compile(file, src, "compute_80").unwrap().to_src();
        let first = compile_through(Some(&cache), file, src, "compute_80").unwrap();
        assert_eq!(first.to_src(), direct);
        let entries: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(entries.len(), 1, "one entry");
        let entry = entries[0].as_ref().unwrap().path();
        assert_eq!(PtxCache::read(&entry).as_deref(), Some(direct.as_str()));
        let again = compile_through(Some(&cache), file, src, "compute_80").unwrap();
        assert_eq!(again.to_src(), direct);

        let broken = "extern \"C\" __global__ void k() { undefined_thing(); }";
        let e = compile_through(Some(&cache), "cached_broken.cu", broken, "compute_80");
        assert!(e.unwrap_err().to_string().contains("undefined_thing"));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
