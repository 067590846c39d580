//! The adapter limits the kernels need beyond what each call checks, checked when a backend
//! instance starts ([`check`]) so that an adapter that cannot run them is refused with the limit
//! named, not failed later by a pipeline wgpu will not make; and the GEMM kernel that fits the
//! adapter's workgroup memory ([`gemm_for`]). WebGPU's guaranteed minimums (8 storage buffers a
//! stage, 16 KiB of workgroup memory) are not enough for every kernel, and wgpu's GL backend
//! may offer less still (its downlevel defaults: 4 storage buffers a stage). Each dispatch
//! checks its own bindings too (`Ctx::check_bindings`).

use dflash_core::{Error, Result};

use crate::device::Ctx;
use crate::gemm::GemmKernel;
use crate::pipelines::{Bind, Family, Kernel};

/// Storage buffers the tiled attention's most demanding kernel binds in one stage: dk/dv's 7
/// read (q, k, v, the block lists, dO, lse, the row sums) and 2 written (dk, dv)
/// (`attention/run.rs`).
pub(crate) const ATTENTION_STORAGE_BUFFERS: u32 = 9;

/// Storage buffers every other kernel binds at most (the RMSNorm backward's 4 read and 1
/// written, `norm.rs`).
pub(crate) const OTHER_STORAGE_BUFFERS: u32 = 5;

/// The most storage buffers a kernel of `family` binds in one dispatch (each dispatch checks
/// it in debug builds, so the conformance suite keeps these constants true).
pub(crate) fn storage_buffers_of(family: Family) -> u32 {
    match family {
        Family::Attention(_) => ATTENTION_STORAGE_BUFFERS,
        _ => OTHER_STORAGE_BUFFERS,
    }
}

/// What `limits` lack for the kernels an instance runs (`tiled_attention`: the `wgpu-tiled`
/// attention kernel, whose own tiles each call fits to the workgroup memory; a host attention
/// kernel runs no attention on the device), each naming the limit; empty where nothing is
/// missing. The GEMM needs its smallest kernel's workgroup memory (a larger one falls back,
/// [`gemm_for`]).
pub(crate) fn check(limits: &wgpu::Limits, tiled_attention: bool) -> Vec<String> {
    let mut lacks = Vec::new();
    let buffers = limits.max_storage_buffers_per_shader_stage;
    if buffers < OTHER_STORAGE_BUFFERS {
        lacks.push(format!(
            "the kernels bind up to {OTHER_STORAGE_BUFFERS} storage buffers in one stage; the \
             adapter's max_storage_buffers_per_shader_stage is {buffers}"
        ));
    } else if tiled_attention && buffers < ATTENTION_STORAGE_BUFFERS {
        lacks.push(format!(
            "the wgpu-tiled attention backward binds {ATTENTION_STORAGE_BUFFERS} storage buffers \
             in one stage; the adapter's max_storage_buffers_per_shader_stage is {buffers} (a \
             host attention kernel, e.g. `reference`, runs here)"
        ));
    }
    let have = limits.max_compute_workgroup_storage_size;
    let need = GemmKernel::Small.workgroup_bytes();
    if have < need {
        lacks.push(format!(
            "the smallest GEMM kernel ({}) needs {need} bytes of workgroup memory; the \
             adapter's max_compute_workgroup_storage_size is {have}",
            GemmKernel::Small.entry()
        ));
    }
    lacks
}

/// The GEMM kernel that runs for `wanted` where the adapter has `have` bytes of workgroup
/// memory: `wanted` where it fits, else the shipped `matmul128`, else the 64 x 64-tile
/// `matmul` (which [`check`] requires). The cooperative-matrix kernel is never replaced: its
/// device is opened only where it fits, and it is a precision mode, not a faster `matmul128`.
pub(crate) fn gemm_for(wanted: GemmKernel, have: u32) -> GemmKernel {
    if wanted == GemmKernel::Coop {
        return wanted;
    }
    [wanted, GemmKernel::Large, GemmKernel::Small]
        .into_iter()
        .find(|k| k.workgroup_bytes() <= have)
        .unwrap_or(wanted)
}

impl Ctx {
    /// What wgpu would reject in a dispatch's storage bindings, checked before it is recorded
    /// ([`Self::dispatch`]): more than the stage's limit of storage buffers, or a buffer
    /// written by the dispatch that is also bound read-only (a usage conflict: wgpu tracks
    /// usage per buffer, not per range, and read-write storage excludes every other use but
    /// itself).
    pub(crate) fn check_bindings(
        &self,
        op: &'static str,
        k: &Kernel<'_>,
        reads: &[Bind<'_>],
        writes: &[Bind<'_>],
    ) -> Result<()> {
        let n = (reads.len() + writes.len()) as u32;
        debug_assert!(
            n <= storage_buffers_of(k.family),
            "{} binds {n} storage buffers, more than `storage_buffers_of` states for its family",
            k.entry
        );
        let limit = self.limits.max_storage_buffers_per_shader_stage;
        if n > limit {
            return Err(Error::op(
                op,
                self.tag.clone(),
                format!(
                    "{} binds {n} storage buffers; the adapter's \
                     max_storage_buffers_per_shader_stage is {limit}",
                    k.entry
                ),
            ));
        }
        for (i, w) in writes.iter().enumerate() {
            if let Some(j) = reads.iter().position(|r| r.buf == w.buf) {
                return Err(Error::op(
                    op,
                    self.tag.clone(),
                    format!(
                        "{}: the buffer written through @binding({}) is also bound read-only \
                         as @binding({}) (a usage conflict wgpu rejects); reads {:?}, writes {:?}",
                        k.entry,
                        1 + reads.len() + i,
                        1 + j,
                        ranges(reads),
                        ranges(writes)
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// `offset..offset + size` of each binding, for error messages.
pub(crate) fn ranges(binds: &[Bind<'_>]) -> Vec<std::ops::Range<u64>> {
    binds.iter().map(|b| b.offset..b.offset + b.size).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(storage_buffers: u32, workgroup_bytes: u32) -> wgpu::Limits {
        wgpu::Limits {
            max_storage_buffers_per_shader_stage: storage_buffers,
            max_compute_workgroup_storage_size: workgroup_bytes,
            ..wgpu::Limits::default()
        }
    }

    #[test]
    fn an_adapter_with_webgpus_minimums_runs_all_but_the_tiled_attention() {
        // WebGPU's guaranteed minimums: 8 storage buffers, 16 KiB.
        let l = limits(8, 16384);
        assert!(check(&l, false).is_empty(), "{:?}", check(&l, false));
        let lacks = check(&l, true);
        assert_eq!(lacks.len(), 1, "{lacks:?}");
        assert!(
            lacks[0].contains("max_storage_buffers_per_shader_stage is 8")
                && lacks[0].contains("wgpu-tiled"),
            "{lacks:?}"
        );
        assert!(check(&limits(9, 16384), true).is_empty());
    }

    #[test]
    fn too_few_storage_buffers_or_too_little_workgroup_memory_is_named() {
        // wgpu's GL downlevel defaults: 4 storage buffers a stage.
        let lacks = check(&limits(4, 16384), false);
        assert!(
            lacks.len() == 1 && lacks[0].contains("max_storage_buffers_per_shader_stage is 4"),
            "{lacks:?}"
        );
        let lacks = check(&limits(8, 8192), false);
        assert!(
            lacks.len() == 1 && lacks[0].contains("max_compute_workgroup_storage_size is 8192"),
            "{lacks:?}"
        );
    }

    #[test]
    fn a_gemm_kernel_that_does_not_fit_falls_back_to_one_that_does() {
        use GemmKernel::*;
        // matmul128's 16,896 bytes do not fit WebGPU's 16 KiB minimum.
        assert!(Large.workgroup_bytes() > 16384);
        assert_eq!(gemm_for(Large, 16384), Small);
        assert_eq!(gemm_for(Wide, 16384), Small);
        assert_eq!(gemm_for(Narrow, 16384), Narrow);
        assert_eq!(gemm_for(Narrow, 12 * 1024), Small);
        assert_eq!(gemm_for(DoubleBuffered, 16384), Small);
        assert_eq!(gemm_for(DoubleBuffered, 17 * 1024), Large);
        for k in GemmKernel::ALL {
            assert_eq!(gemm_for(k, 32 * 1024), k, "{k:?}");
        }
        assert_eq!(gemm_for(Coop, 0), Coop);
    }
}
