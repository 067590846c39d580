//! Backend-specific settings ([`CudaOptions`]: GEMM precision, activation storage type,
//! poison mode) and their environment variables.

use dflash_core::{Error, Result};

use crate::{DType, GemmPrecision};

/// Backend-specific settings (not in [`dflash_core::registry::BackendOptions`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaOptions {
    pub gemm: GemmPrecision,
    /// Storage type of the activations every op writes (GEMM / attention / norm / rope /
    /// swiglu / add / embedding outputs and the activation gradients). Statistics, parameter
    /// gradients and everything made by `upload` / `zeros` / `random_normal` stay f32.
    pub activations: DType,
    /// Fill every allocated output with NaN before the op writes it (debugging/tests).
    pub poison: bool,
    /// At most this many CTAs for `cuda-flash`'s persistent forward (default `None`: one per
    /// SM). Tests set a small cap so that small shapes run several (query tile, head) items
    /// per CTA, as the large ones do.
    pub attn_forward_ctas: Option<u32>,
}

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions::for_gemm(GemmPrecision::Bf16)
    }
}

impl CudaOptions {
    /// The activation type that goes with a GEMM precision: bf16 activations with bf16 GEMMs
    /// (PyTorch bf16 autocast), f32 otherwise.
    pub fn default_activations(gemm: GemmPrecision) -> DType {
        match gemm {
            GemmPrecision::Bf16 => DType::Bf16,
            GemmPrecision::Tf32 | GemmPrecision::Fp32 => DType::F32,
        }
    }

    /// `gemm` with its default activation type, poison off.
    pub fn for_gemm(gemm: GemmPrecision) -> Self {
        CudaOptions {
            gemm,
            activations: Self::default_activations(gemm),
            poison: false,
            attn_forward_ctas: None,
        }
    }

    /// Defaults overridden by `DFLASH_CUDA_GEMM` (`bf16` (default) | `tf32` | `fp32`),
    /// `DFLASH_CUDA_ACTIVATIONS` (`bf16` | `f32`; default bf16 with bf16 GEMMs, else f32) and
    /// `DFLASH_CUDA_POISON` (`1` | `0`).
    pub fn from_env() -> Result<Self> {
        let mut o = CudaOptions::default();
        if let Ok(v) = std::env::var("DFLASH_CUDA_GEMM") {
            o.gemm = match v.to_ascii_lowercase().as_str() {
                "bf16" => GemmPrecision::Bf16,
                "tf32" => GemmPrecision::Tf32,
                "fp32" | "f32" => GemmPrecision::Fp32,
                other => {
                    return Err(Error::op(
                        "cuda_init",
                        "cuda",
                        format!(
                            "DFLASH_CUDA_GEMM={other:?}: expected \"bf16\", \"tf32\" or \"fp32\""
                        ),
                    ));
                }
            };
        }
        o.activations = Self::default_activations(o.gemm);
        if let Ok(v) = std::env::var("DFLASH_CUDA_ACTIVATIONS") {
            o.activations = parse_activations(&v)?;
        }
        if let Ok(v) = std::env::var("DFLASH_CUDA_POISON") {
            o.poison = !matches!(v.as_str(), "" | "0" | "false");
        }
        Ok(o)
    }
}

/// A `DFLASH_CUDA_ACTIVATIONS` value: `bf16` or `f32` (`fp32` accepted), any case.
pub fn parse_activations(v: &str) -> Result<DType> {
    match v.to_ascii_lowercase().as_str() {
        "bf16" => Ok(DType::Bf16),
        "f32" | "fp32" => Ok(DType::F32),
        other => Err(Error::op(
            "cuda_init",
            "cuda",
            format!("DFLASH_CUDA_ACTIVATIONS={other:?}: expected \"bf16\" or \"f32\""),
        )),
    }
}
