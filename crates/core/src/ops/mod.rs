//! The backend op families, one small trait per file (burn-style). Shapes are written
//! `(rows, cols)` for matrices; `T` tokens, `H` hidden, `Hq`/`Hkv` heads, `D` head dim, `V` vocab.
//! Every op validates shapes and returns a typed error naming op, shapes and device.

pub mod activation;
pub mod attention;
pub mod collective;
pub mod embedding;
pub mod gemm;
pub mod loss;
pub mod memory;
pub mod norm;
pub mod optimizer;
pub mod rope;

pub use activation::ActivationOps;
pub use attention::AttentionOps;
pub use collective::{CollectiveEndpoint, CollectiveOps, Communicator, DeviceCollective};
pub use embedding::{EmbeddingOps, embedding_dims};
pub use gemm::{GemmOps, Transpose};
pub use loss::{LossDims, LossOps, LossStats};
pub use memory::{
    HostSlice, MemoryOps, concat_cols_dims, concat_rows_dims, narrow_rows_dims, scatter_rows_cols,
    upload_numel,
};
pub use norm::{NormDims, NormOps};
pub use optimizer::{AdamWParams, AdamWScalars, OptimizerOps};
pub use rope::{RopeDims, RopeOps};

/// Checks that `a` and `b` have exactly the same dims (`what` names them, e.g. `"dy and x"`).
pub fn same_shape(
    op: &'static str,
    device: &str,
    what: &str,
    a: &crate::Tensor,
    b: &crate::Tensor,
) -> crate::Result<()> {
    if a.dims() != b.dims() {
        return Err(crate::Error::shape(
            op,
            device,
            format!("{what}: {:?} vs {:?}", a.shape(), b.shape()),
        ));
    }
    Ok(())
}

/// Device memory of a backend instance, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Bytes held by live tensors (and workspaces) now.
    pub in_use_bytes: u64,
    /// High-water mark of `in_use_bytes` since creation or the last
    /// [`BackendInfo::reset_peak_memory`].
    pub peak_bytes: u64,
}

/// How a backend instance stores what a memory plan counts, in bytes per element.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ElementBytes {
    /// An activation: what compute ops write (outputs and activation gradients).
    pub activation: u64,
    /// A tensor in the compute format (`MemoryOps::to_compute_format`): frozen weights, features.
    pub compute: u64,
}

/// The memory a backend instance allocates from, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryCapacity {
    /// Free now (what a job starting now can still take).
    pub free: u64,
    pub total: u64,
}

impl MemoryCapacity {
    /// The host's memory from the text of Linux's `/proc/meminfo`: `MemAvailable` (what can
    /// be allocated without swapping) as free and `MemTotal`; `None` where either is missing
    /// or unreadable.
    pub fn from_meminfo(text: &str) -> Option<MemoryCapacity> {
        let field = |name: &str| -> Option<u64> {
            let line = text.lines().find(|l| l.starts_with(name))?;
            let kib: u64 = line[name.len()..]
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .ok()?;
            kib.checked_mul(1024)
        };
        Some(MemoryCapacity {
            free: field("MemAvailable:")?,
            total: field("MemTotal:")?,
        })
    }
}

/// Host memory, for backends that keep their tensors there ([`BackendInfo::memory_capacity`]
/// `None`): [`MemoryCapacity::from_meminfo`] of `/proc/meminfo`; `None` where the file is
/// missing (not Linux). One reading for every caller, so a training job's memory plan and
/// `regenerate`'s KV cache check agree on what the host has.
pub fn host_capacity() -> Option<MemoryCapacity> {
    MemoryCapacity::from_meminfo(&std::fs::read_to_string("/proc/meminfo").ok()?)
}

/// How a backend instance sizes the buffer of a tensor: what its [`MemoryStats`] count and
/// what a memory plan must add up, tensor by tensor.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum AllocationRounding {
    /// A tensor takes its own bytes (an allocator whose rounding is small next to the
    /// tensors a plan is about, such as CUDA's stream-ordered pool).
    #[default]
    Exact,
    /// Sizes rounded up to classes that keep reuse possible across varying shapes: a
    /// multiple of `1/per_octave` of the largest power of two not above the size, and at
    /// least `min_bytes` (a buffer pool; at most `1/per_octave` more than asked).
    SizeClasses { per_octave: u64, min_bytes: u64 },
}

impl AllocationRounding {
    /// The bytes a tensor of `bytes` bytes takes.
    pub fn bytes(self, bytes: u64) -> u64 {
        match self {
            AllocationRounding::Exact => bytes,
            AllocationRounding::SizeClasses {
                per_octave,
                min_bytes,
            } => {
                let bytes = bytes.max(min_bytes).max(1);
                let octave = 1u64 << (63 - bytes.leading_zeros());
                let step = (octave / per_octave.max(1)).max(min_bytes).max(1);
                bytes.checked_next_multiple_of(step).unwrap_or(u64::MAX)
            }
        }
    }
}

/// Identity of a backend instance.
pub trait BackendInfo: Send + Sync {
    /// Registered name, e.g. `"reference"`.
    fn name(&self) -> &'static str;
    /// Human-readable device, e.g. `"cpu (2 threads)"` or `"cuda:0 (NVIDIA H200)"`.
    fn device(&self) -> String;
    /// Name of the attention kernel this instance dispatches to.
    fn attention_kernel(&self) -> &str;

    /// Waits until every op enqueued so far has finished (and reports any asynchronous error
    /// it raised). Timing code calls this before reading the clock. Host backends finish each
    /// op before returning, so the default does nothing; GPU backends wait for their stream.
    fn synchronize(&self) -> crate::Result<()> {
        Ok(())
    }
    /// Device memory in use and its peak, when the backend tracks them (`None` otherwise).
    fn memory_stats(&self) -> Option<MemoryStats> {
        None
    }
    /// How this instance sizes a tensor's buffer ([`BackendInfo::memory_stats`] counts these
    /// sizes). The default: a tensor takes its own bytes.
    fn allocation_rounding(&self) -> AllocationRounding {
        AllocationRounding::Exact
    }
    /// Restarts the peak of [`BackendInfo::memory_stats`] from the memory in use now.
    fn reset_peak_memory(&self) {}
    /// Returns to the device what this instance's allocator keeps for reuse but no live
    /// tensor holds, so that [`BackendInfo::memory_capacity`] counts it as free: a memory
    /// plan made after earlier work in the same process (a bench's earlier figures, a
    /// previous job) sees the memory that work left behind. Later allocations pay a trip to
    /// the driver again. The default does nothing (nothing is cached).
    fn release_cached_memory(&self) {}
    /// Element sizes of this instance's storage. The default is f32 throughout (parameters,
    /// gradients and optimizer moments are f32 on every backend).
    fn element_bytes(&self) -> ElementBytes {
        ElementBytes {
            activation: 4,
            compute: 4,
        }
    }
    /// The device memory this instance allocates from, when the backend knows it (`None`: a
    /// backend that keeps its tensors in host memory; the caller asks the host).
    fn memory_capacity(&self) -> Option<MemoryCapacity> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::{AllocationRounding, MemoryCapacity};

    #[test]
    fn meminfo_gives_available_and_total_bytes_or_nothing() {
        let text = "MemTotal:       16318096 kB\nMemFree:  1 kB\nMemAvailable:   8000000 kB\n";
        assert_eq!(
            MemoryCapacity::from_meminfo(text),
            Some(MemoryCapacity {
                free: 8_000_000 * 1024,
                total: 16_318_096 * 1024,
            })
        );
        // An old kernel without MemAvailable, a garbled number, a size past u64: nothing.
        assert_eq!(MemoryCapacity::from_meminfo("MemTotal: 1 kB\n"), None);
        let garbled = "MemTotal: x kB\nMemAvailable: 1 kB\n";
        assert_eq!(MemoryCapacity::from_meminfo(garbled), None);
        let huge = format!("MemTotal: {} kB\nMemAvailable: 1 kB\n", u64::MAX);
        assert_eq!(MemoryCapacity::from_meminfo(&huge), None);
    }

    #[test]
    fn size_classes_round_up_by_at_most_their_fraction_and_are_fixed_points() {
        let r = AllocationRounding::SizeClasses {
            per_octave: 8,
            min_bytes: 256,
        };
        assert_eq!(r.bytes(0), 256);
        assert_eq!(r.bytes(1), 256);
        assert_eq!(r.bytes(256), 256);
        assert_eq!(r.bytes(257), 512);
        // Above 2 KiB the step is an eighth of the octave: 2^20 + 1 -> 2^20 + 2^17.
        assert_eq!(r.bytes((1 << 20) + 1), (1 << 20) + (1 << 17));
        for bytes in [
            1000u64,
            4096,
            4097,
            65_537,
            3 << 20,
            (64 << 20) + 4,
            1 << 31,
        ] {
            let c = r.bytes(bytes);
            assert!(c >= bytes && c - bytes <= bytes / 8 + 256, "{bytes} -> {c}");
            assert_eq!(r.bytes(c), c, "a class is its own class ({bytes} -> {c})");
        }
        assert_eq!(AllocationRounding::Exact.bytes(1000), 1000);
    }
}
