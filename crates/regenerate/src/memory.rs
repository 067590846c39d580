//! Whether the KV cache fits: [`dflash_models::generate::KvCache`] holds
//! `batch x capacity` tokens of every layer in f32, which for an 8B target at a long
//! capacity is more than a GPU holds. Checked before the weights load (a fast error instead
//! of an out-of-memory after minutes of loading) and again after (the weights then take
//! their share), against the memory the backend reports, or the host's for a backend that
//! reports none (its tensors live there). Where the host's is unknown too, nothing is
//! checked, and a note says so.

use dflash_config::Qwen3Config;
use dflash_core::{Backend, MemoryCapacity, host_capacity};
use dflash_models::generate::{GenerateOptions, KvCache};

use crate::error::RegenerateError;

/// Refuses a cache that needs more than the memory the backend allocates from has free
/// now; `when` says when that was measured. `Ok(Some(note))`: nothing could be checked,
/// and the note says why.
pub(crate) fn check_kv_cache(
    backend: &dyn Backend,
    cfg: &Qwen3Config,
    g: &GenerateOptions,
    when: &str,
) -> Result<Option<String>, RegenerateError> {
    // Memory an allocator keeps for reuse (the load's staging buffers) is free to the cache.
    backend.release_cached_memory();
    let free = free_memory(backend.device(), backend.memory_capacity(), host_capacity);
    match free {
        Ok((device, capacity)) => fits(cfg, g, capacity, &device, when).map(|()| None),
        Err(why) => Ok(Some(format!(
            "the KV cache of --batch {} x --capacity {} tokens ({} bytes) is not checked \
             against free memory: {why}",
            g.batch,
            g.capacity,
            KvCache::bytes_for(cfg, g.batch, g.capacity)
        ))),
    }
}

/// The memory the cache comes from and what it has free, or why that is unknown: what the
/// backend on `device` reports, else the host's (`host`): by
/// [`dflash_core::BackendInfo::memory_capacity`]'s contract, a backend that reports none keeps
/// its tensors in host memory (the training job's memory plan reads it the same way).
fn free_memory(
    device: String,
    reported: Option<MemoryCapacity>,
    host: impl FnOnce() -> Option<MemoryCapacity>,
) -> Result<(String, MemoryCapacity), String> {
    match reported {
        Some(c) => Ok((device, c)),
        None => host()
            .map(|c| ("the host".to_string(), c))
            .ok_or_else(|| "the host does not report its free memory".to_string()),
    }
}

fn fits(
    cfg: &Qwen3Config,
    g: &GenerateOptions,
    capacity: MemoryCapacity,
    device: &str,
    when: &str,
) -> Result<(), RegenerateError> {
    let need = KvCache::bytes_for(cfg, g.batch, g.capacity);
    if need > capacity.free {
        return Err(RegenerateError::Memory {
            batch: g.batch,
            capacity: g.capacity,
            need,
            free: capacity.free,
            device: device.to_string(),
            when: when.to_string(),
        });
    }
    Ok(())
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
        let e = fits(&qwen3_8b(), &opts(16, 40960), h100, "cuda:0", "").unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("--batch 16") && msg.contains("--capacity 40960"),
            "{msg}"
        );
        assert!(msg.contains(&need.to_string()), "{msg}");
        // 4096 + 1024 positions fit.
        fits(&qwen3_8b(), &opts(16, 5120), h100, "cuda:0", "").unwrap();
    }

    #[test]
    fn a_backend_without_its_own_memory_is_checked_against_the_host() {
        let small = || {
            Some(MemoryCapacity {
                free: 1 << 30,
                total: 2 << 30,
            })
        };
        let gpu = MemoryCapacity {
            free: 79 << 30,
            total: 80 << 30,
        };
        // What the backend reports wins; the host is not asked.
        let asked = || -> Option<MemoryCapacity> { panic!("the host was asked") };
        let got = free_memory("cuda:0".into(), Some(gpu), asked).unwrap();
        assert_eq!(got, ("cuda:0".to_string(), gpu));
        // A backend that reports none keeps its tensors in host memory.
        let got = free_memory("cpu".into(), None, small).unwrap();
        assert_eq!(got, ("the host".to_string(), small().unwrap()));
        let e = free_memory("cpu".into(), None, || None).unwrap_err();
        assert!(e.contains("the host does not report"), "{e}");
    }

    #[test]
    fn sizes_past_u64_saturate() {
        assert_eq!(KvCache::bytes_for(&qwen3_8b(), usize::MAX, 2), u64::MAX);
    }
}
