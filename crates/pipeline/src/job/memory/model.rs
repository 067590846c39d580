//! What the memory plan must know of a backend besides shapes: the bytes of its element types
//! (`BackendInfo::element_bytes`) and the workspaces its ops take, per op family. The
//! workspaces are read off the backends' code (`backends/reference`, `backends/cuda`) and
//! named by where they come from; an attention kernel the plan does not know is assumed to
//! need no more than the reference kernel.

use dflash_core::{AllocationRounding, Backend};

use super::sim::LayerShape;

/// A tensor's element type as the plan counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Dtype {
    F32,
    Bf16,
}

impl Dtype {
    fn of_bytes(b: u64) -> Self {
        if b == 2 { Dtype::Bf16 } else { Dtype::F32 }
    }
    fn bytes(self) -> u128 {
        match self {
            Dtype::F32 => 4,
            Dtype::Bf16 => 2,
        }
    }
}

/// Whose op workspaces apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OpsKind {
    /// Host memory ops (the reference backend): outputs only, f64 scratch in a few kernels.
    Host,
    /// The CUDA backend: stream-ordered scratch for GEMM operands, a kept loss workspace and
    /// the cuBLASLt workspace.
    Cuda,
}

/// The attention kernel's workspace model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AttentionKind {
    /// The reference kernel: f64 dK/dV partials over every key in the backward.
    Reference,
    /// `tiled` and other host kernels: per-task tiles only.
    HostTiled,
    /// `cuda-flash`: f32 dQ accumulator and D_i in the backward.
    CudaFlash,
    /// `cuda-simple`: D_i in the backward.
    CudaSimple,
}

/// The backend a worker runs on, as the plan models it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct BackendModel {
    pub ops: OpsKind,
    pub attention: AttentionKind,
    /// Bytes of an activation element.
    pub act: u64,
    /// Bytes of an element in the compute format (frozen weights, features).
    pub compute: u64,
    /// How the backend sizes a tensor's buffer, applied to every tensor the plan counts.
    #[serde(serialize_with = "describe_rounding")]
    pub rounding: AllocationRounding,
}

/// `bytes` as `r` rounds a tensor of that size (none stays none; a size past `u64`, which no
/// device holds, stays as it is).
pub(super) fn rounded(r: AllocationRounding, bytes: u128) -> u128 {
    match u64::try_from(bytes) {
        Ok(0) | Err(_) => bytes,
        Ok(b) => r.bytes(b) as u128,
    }
}

fn describe_rounding<S: serde::Serializer>(
    r: &AllocationRounding,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.serialize_str(&match r {
        AllocationRounding::Exact => "exact".to_string(),
        AllocationRounding::SizeClasses {
            per_octave,
            min_bytes,
        } => format!("size classes of 1/{per_octave} octave, at least {min_bytes} B"),
    })
}

/// cuBLASLt's workspace, one per CUDA backend instance (`backends/cuda/src/gemm/plan.rs`).
const CUBLASLT_WORKSPACE: u128 = 32 << 20;
/// The CUDA loss's largest logits chunk, most rows and row alignment of a chunk
/// (`backends/cuda/src/loss.rs`).
const CUDA_LOGITS_BYTES: usize = 320 << 20;
const CUDA_CE_CHUNK_ROWS: usize = 1024;
const CUDA_CE_CHUNK_ALIGN: usize = 128;
/// The reference loss's rows per logits chunk (`backends/reference/src/loss.rs`).
const HOST_CE_CHUNK_ROWS: u128 = 64;

/// The CUDA loss's active rows per chunk for a `v`-row head (`chunk_rows` there).
fn cuda_ce_chunk_rows(v: u128) -> u128 {
    let rows = dflash_core::ops::loss::logits_chunk_rows(
        CUDA_LOGITS_BYTES,
        v as usize,
        CUDA_CE_CHUNK_ROWS,
        CUDA_CE_CHUNK_ALIGN,
    );
    rows as u128
}

impl BackendModel {
    /// The model of a built backend: its element sizes, and its op and kernel family by name.
    pub fn of(b: &dyn Backend) -> Self {
        let e = b.element_bytes();
        let cuda = b.name() == "cuda";
        let attention = match b.attention_kernel() {
            "reference" => AttentionKind::Reference,
            "cuda-simple" => AttentionKind::CudaSimple,
            _ if cuda => AttentionKind::CudaFlash,
            _ => AttentionKind::HostTiled,
        };
        BackendModel {
            ops: if cuda { OpsKind::Cuda } else { OpsKind::Host },
            attention,
            act: e.activation,
            compute: e.compute,
            rounding: b.allocation_rounding(),
        }
    }

    /// The reference backend with its own attention kernel (f32 everywhere).
    pub fn reference() -> Self {
        BackendModel {
            ops: OpsKind::Host,
            attention: AttentionKind::Reference,
            act: 4,
            compute: 4,
            rounding: AllocationRounding::Exact,
        }
    }

    /// The bytes a tensor of `bytes` takes on this backend.
    pub(super) fn tensor_bytes(&self, bytes: u128) -> u128 {
        rounded(self.rounding, bytes)
    }

    pub(super) fn act_dtype(&self) -> Dtype {
        Dtype::of_bytes(self.act)
    }
    pub(super) fn compute_dtype(&self) -> Dtype {
        Dtype::of_bytes(self.compute)
    }

    /// Scratch a GEMM makes of an operand of `n` elements of `dt`: CUDA converts an operand
    /// not in its GEMM type (the compute format) into a stream-ordered copy for the call.
    pub(super) fn gemm_scratch(&self, dt: Dtype, n: u128) -> u128 {
        match self.ops {
            OpsKind::Cuda if dt != self.compute_dtype() => n * self.compute_dtype().bytes(),
            _ => 0,
        }
    }

    /// RoPE's cos/sin tables on the host (`(rows, D/2)` f32 each); CUDA computes them inline.
    pub(super) fn rope_tables(&self, rows: u128, dh: u128) -> u128 {
        match self.ops {
            OpsKind::Host => 2 * rows * (dh / 2) * 4,
            OpsKind::Cuda => 0,
        }
    }

    /// Forward attention's workspace beyond `out` and `lse`.
    pub(super) fn attention_forward_ws(&self, tq: u128, tk: u128, l: &LayerShape) -> u128 {
        match self.attention {
            // Per-row accumulators of D values per task: nothing that scales.
            AttentionKind::Reference | AttentionKind::HostTiled | AttentionKind::CudaSimple => 0,
            // bf16 copies of f32 q/k/v (none with bf16 activations), and the bf16 output that
            // is widened when activations are f32.
            AttentionKind::CudaFlash => self.flash_operands(tq, tk, l) + self.flash_out(tq * l.qd),
        }
    }

    /// Backward attention's workspace beyond `dq`, `dk`, `dv`.
    pub(super) fn attention_backward_ws(&self, tq: u128, tk: u128, l: &LayerShape) -> u128 {
        match self.attention {
            // D (Tq, Hq) f64 and the f64 dK/dV partials of every (kv head, key block).
            AttentionKind::Reference => tq * l.hq * 8 + 2 * tk * l.kd * 8,
            AttentionKind::HostTiled => 0,
            AttentionKind::CudaSimple => tq * l.hq * 4,
            // D_i (Tq, Hq) f32 and dq_accum (Tq, Hq, D) f32; bf16 copies of f32 inputs (q, k,
            // v, out, d_out) and bf16 results widened for f32 activations.
            AttentionKind::CudaFlash => {
                tq * l.hq * 4
                    + tq * l.qd * 4
                    + self.flash_operands(tq, tk, l)
                    + 2 * self.flash_out(tq * l.qd)
                    + 2 * self.flash_out(tk * l.kd)
            }
        }
    }

    fn flash_operands(&self, tq: u128, tk: u128, l: &LayerShape) -> u128 {
        match self.act_dtype() {
            Dtype::Bf16 => 0,
            Dtype::F32 => (tq * l.qd + 2 * tk * l.kd) * 2,
        }
    }
    fn flash_out(&self, n: u128) -> u128 {
        match self.act_dtype() {
            Dtype::Bf16 => 0,
            Dtype::F32 => n * 2,
        }
    }

    /// The fused linear cross-entropy's workspace over `rows` rows of `h` against a `v`-row
    /// head: `(transient, kept)`, where `kept` stays with the backend after the call (CUDA's
    /// loss workspace is reused by every later call).
    pub(super) fn ce_workspace(&self, rows: u128, h: u128, v: u128) -> (u128, u128) {
        match self.ops {
            // Per chunk of 64 rows: the gathered rows, the logits and dx of the chunk (f32),
            // and per-row (CE, correct); the active row list.
            OpsKind::Host => {
                let c = HOST_CE_CHUNK_ROWS.min(rows);
                (c * (2 * h + v) * 4 + c * 16 + rows * 8, 0)
            }
            // Active rows, labels, weights (i32/f32), CE (f64) and correct flags on the device
            // (the head is in the compute format, which is the GEMM type: read in place);
            // kept: xc and dxc (chunk, H) and the logits (chunk, V), f32, and with bf16 GEMMs
            // the dlogits (chunk, V) as their own bf16 operand.
            OpsKind::Cuda => {
                let chunk = cuda_ce_chunk_rows(v);
                let dlogits = if self.compute == 2 { chunk * v * 2 } else { 0 };
                (
                    rows * 6 * 4,
                    (2 * chunk * h + chunk * v) * 4 + dlogits + 1024,
                )
            }
        }
    }

    /// What a backend instance holds once it has run anything: cuBLASLt's workspace.
    pub(super) fn instance_bytes(&self) -> u128 {
        match self.ops {
            OpsKind::Cuda => CUBLASLT_WORKSPACE,
            OpsKind::Host => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 8B loss on CUDA with bf16 GEMMs: chunks of 512 rows, each keeping its gathered rows
    /// and dx (f32), its f32 logits and its bf16 dlogits.
    #[test]
    fn cuda_loss_workspace_mirrors_the_backend() {
        let (h, v) = (4096u128, 151_936u128);
        assert_eq!(cuda_ce_chunk_rows(v), 512);
        assert_eq!(cuda_ce_chunk_rows(320), CUDA_CE_CHUNK_ROWS as u128);
        let model = |compute| BackendModel {
            ops: OpsKind::Cuda,
            attention: AttentionKind::CudaFlash,
            act: 2,
            compute,
            rounding: AllocationRounding::Exact,
        };
        let (transient, kept) = model(2).ce_workspace(8192, h, v);
        assert_eq!(transient, 8192 * 24);
        assert_eq!(kept, (2 * 512 * h + 512 * v) * 4 + 512 * v * 2 + 1024);
        // f32 GEMMs write the dlogits over the logits: no separate matrix.
        let (_, kept_f32) = model(4).ce_workspace(8192, h, v);
        assert_eq!(kept - kept_f32, 512 * v * 2);
    }

    /// The constants above are copies of the CUDA loss's (this crate does not link the
    /// backend): a change there that is not made here fails this test.
    #[test]
    fn cuda_loss_constants_are_the_backends() {
        let src = include_str!("../../../../../backends/cuda/src/loss.rs");
        for line in [
            format!("const CHUNK_ROWS: usize = {CUDA_CE_CHUNK_ROWS};"),
            format!(
                "const LOGITS_BYTES: usize = {} << 20;",
                CUDA_LOGITS_BYTES >> 20
            ),
            format!("const CHUNK_ALIGN: usize = {CUDA_CE_CHUNK_ALIGN};"),
            "let bytes = (2 * xc_len + logits_len) * 4 + dl_bytes + 256 * 4;".to_string(),
        ] {
            assert!(
                src.contains(&line),
                "backends/cuda/src/loss.rs has no `{line}`"
            );
        }
    }
}
