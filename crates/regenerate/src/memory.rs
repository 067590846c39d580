//! Whether the KV cache fits: [`dflash_models::generate::KvCache`] holds
//! `batch x capacity` tokens of every layer in f32, which for an 8B target at a long
//! capacity is more than a GPU holds. Checked before the weights load (a fast error instead
//! of an out-of-memory after minutes of loading) and again after (the weights then take
//! their share). Where neither the backend nor the host reports free memory, nothing is
//! checked.

use dflash_config::Qwen3Config;
use dflash_core::{Backend, MemoryCapacity};
use dflash_models::generate::{GenerateOptions, KvCache};

use crate::error::RegenerateError;

/// Refuses a cache that needs more than the memory the backend allocates from has free
/// now; `when` says when that was measured.
pub(crate) fn check_kv_cache(
    backend: &dyn Backend,
    cfg: &Qwen3Config,
    g: &GenerateOptions,
    when: &str,
) -> Result<(), RegenerateError> {
    // Memory an allocator keeps for reuse (the load's staging buffers) is free to the cache.
    backend.release_cached_memory();
    let (device, free) = match backend.memory_capacity() {
        Some(c) => (backend.device(), Some(c)),
        // A backend that reports no device memory keeps its tensors in host memory.
        None => ("the host".to_string(), host_capacity()),
    };
    fits(cfg, g, free, &device, when)
}

fn fits(
    cfg: &Qwen3Config,
    g: &GenerateOptions,
    capacity: Option<MemoryCapacity>,
    device: &str,
    when: &str,
) -> Result<(), RegenerateError> {
    let need = KvCache::bytes_for(cfg, g.batch, g.capacity);
    match capacity {
        Some(c) if need > c.free => Err(RegenerateError::Memory {
            batch: g.batch,
            capacity: g.capacity,
            need,
            free: c.free,
            device: device.to_string(),
            when: when.to_string(),
        }),
        _ => Ok(()),
    }
}

/// Host memory from `/proc/meminfo`: `MemAvailable` (what can be allocated without
/// swapping) and `MemTotal`; `None` where the file is missing (not Linux). The training
/// job's memory plan reads the host the same way.
fn host_capacity() -> Option<MemoryCapacity> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        let kib: u64 = line[name.len()..]
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        Some(kib * 1024)
    };
    Some(MemoryCapacity {
        free: field("MemAvailable:")?,
        total: field("MemTotal:")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    use dflash_models::generate::Sampling;

    fn qwen3_8b() -> Qwen3Config {
        let mut c = Qwen3Config::from_file(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../assets/tiny-target/config.json"),
        )
        .unwrap();
        (c.num_hidden_layers, c.num_key_value_heads, c.head_dim) = (36, 8, 128);
        c
    }

    fn opts(batch: usize, capacity: usize) -> GenerateOptions {
        GenerateOptions {
            batch,
            capacity,
            max_new_tokens: 1,
            prefill_tokens: 1,
            eos: vec![0],
            sampling: Sampling::default(),
        }
    }

    #[test]
    fn a_cache_larger_than_the_free_memory_is_refused_naming_the_knobs() {
        let h100 = MemoryCapacity {
            free: 79 << 30,
            total: 80 << 30,
        };
        // Qwen3-8B at batch 16 and 40960 positions: the old default, 193 GB.
        let need = KvCache::bytes_for(&qwen3_8b(), 16, 40960);
        assert_eq!(need, 2 * 36 * 16 * 40960 * 8 * 128 * 4);
        let e = fits(&qwen3_8b(), &opts(16, 40960), Some(h100), "cuda:0", "").unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("--batch 16") && msg.contains("--capacity 40960"),
            "{msg}"
        );
        assert!(msg.contains(&need.to_string()), "{msg}");
        // 4096 + 1024 positions fit.
        fits(&qwen3_8b(), &opts(16, 5120), Some(h100), "cuda:0", "").unwrap();
        // Nothing reported: nothing checked.
        fits(&qwen3_8b(), &opts(16, 40960), None, "cpu", "").unwrap();
    }

    #[test]
    fn sizes_past_u64_saturate() {
        assert_eq!(KvCache::bytes_for(&qwen3_8b(), usize::MAX, 2), u64::MAX);
    }
}
