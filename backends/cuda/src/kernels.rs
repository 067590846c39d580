//! The backend's CUDA C kernels: sources embedded with `include_str!`, compiled by NVRTC once
//! per device (for that device's `compute_XY`), loaded into the device's primary context and
//! shared by every backend instance on it (see [`crate::device`]). Kernels are shape-generic:
//! every size is a kernel argument.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction};
use cudarc::nvrtc::{CompileError, CompileOptions, compile_ptx_with_opts};

use crate::CudaError;

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
            /// Compiles every file for `arch` (e.g. `compute_90`) and loads it into `ctx`.
            pub(crate) fn load(ctx: &Arc<CudaContext>, arch: &str) -> Result<Kernels, CudaError> {
                $(
                    let module = {
                        let ptx = compile($file, kernel_src!($file), arch)?;
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

/// Compiles one file to PTX; a failure carries NVRTC's log.
pub fn compile(file: &str, src: &str, arch: &str) -> Result<cudarc::nvrtc::Ptx, CudaError> {
    let opts = CompileOptions {
        options: vec![format!("--gpu-architecture={arch}")],
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
