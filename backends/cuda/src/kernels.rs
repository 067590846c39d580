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

macro_rules! kernel_set {
    ($( $file:literal => [ $( $f:ident ),* $(,)? ] ),* $(,)?) => {
        /// Every kernel of the backend, loaded on one device.
        pub(crate) struct Kernels {
            $( $( pub $f: CudaFunction, )* )*
        }

        /// `(file name, source)` of every kernel file.
        pub const SOURCES: &[(&str, &str)] = &[
            $( ($file, include_str!(concat!("../kernels/", $file))), )*
        ];

        impl Kernels {
            /// Compiles every file for `arch` (e.g. `compute_90`) and loads it into `ctx`.
            pub(crate) fn load(ctx: &Arc<CudaContext>, arch: &str) -> Result<Kernels, CudaError> {
                $(
                    let module = {
                        let ptx = compile($file, include_str!(concat!("../kernels/", $file)), arch)?;
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

kernel_set! {
    "elementwise.cu" => [
        fill_f32, add_f32, add_assign_f32, scale_f32, copy_cols_f32, copy_cols_u16, gather_rows_f32,
        scatter_rows_f32, sum_squares_partial, sum_final_f64, nonfinite_partial, sum_final_u64,
        f32_to_bf16, bf16_to_f32, random_normal_f32,
    ],
    "norm.cu" => [rms_norm_fwd, rms_norm_bwd_dx, rms_norm_bwd_dw_partial, rms_norm_bwd_dw_final],
    "rope.cu" => [rope_rotate],
    "activation.cu" => [swiglu_fwd, swiglu_bwd],
    "embedding.cu" => [embedding_gather, embedding_gather_bf16],
    "loss.cu" => [ce_rows, argmax_rows],
    "optimizer.cu" => [adamw_f32],
    "attention_simple.cu" => [attn_fwd, attn_bwd_dsum, attn_bwd_dq, attn_bwd_dkdv],
}

/// `(file name, source)` of the bf16 flash attention (`"cuda-flash"`), compiled separately and
/// only when a backend selects it (see [`crate::flash`]).
pub const FLASH_SOURCE: (&str, &str) = ("attention.cu", include_str!("../kernels/attention.cu"));

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
