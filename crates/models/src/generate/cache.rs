//! The target's forward with a KV cache: prompts and generated tokens are appended to
//! per-sequence slots, and each new row attends to its slot's cached keys.
//!
//! ```text
//! cache k, v (layer):  (slots * cap, Hkv, D)   slot s holds rows [s*cap, s*cap + len_s)
//! new rows x:          (T, H)                  T = sum of the tokens appended this call
//! per layer:  q, k, v = proj(rms(x)) (q, k: head norm, RoPE at the row's position)
//!             k, v -> cache rows s*cap + pos   (in place: MemoryOps::scatter_rows)
//!             attn(q, cache) with row r seeing [s*cap, s*cap + pos_r + 1)
//! ```
//! The layer is [`crate::layer`]'s self-attention layer with its keys and values kept:
//! the same projections, norms and rotary positions, so a cached forward agrees with the
//! target's plain forward (and with HF transformers') up to summation order.

use dflash_config::Qwen3Config;
use dflash_core::Backend;
use dflash_core::Tensor;
use dflash_core::mask::{BlockMask, Interval};

use crate::error::{ModelError, Result};
use crate::layer::{LayerDims, LayerWeights, head_norm};
use crate::target::Qwen3Target;

/// Keys and values of every layer for `slots` sequences of up to `capacity` tokens each.
pub struct KvCache {
    /// Per layer, `(slots * capacity, Hkv, D)`: post-norm, post-RoPE keys.
    k: Vec<Tensor>,
    /// Per layer, `(slots * capacity, Hkv, D)`.
    v: Vec<Tensor>,
    capacity: usize,
    /// Tokens held per slot.
    lens: Vec<usize>,
}

impl KvCache {
    pub fn slots(&self) -> usize {
        self.lens.len()
    }
    /// Tokens a slot can hold (prompt and generated together).
    pub fn capacity(&self) -> usize {
        self.capacity
    }
    /// Tokens held by `slot` now (`None`: no such slot).
    pub fn len(&self, slot: usize) -> Option<usize> {
        self.lens.get(slot).copied()
    }
    /// Empties `slot` for the next sequence (its rows are overwritten as it refills).
    pub fn clear(&mut self, slot: usize) -> Result<()> {
        let slots = self.slots();
        let len = self
            .lens
            .get_mut(slot)
            .ok_or_else(|| ModelError::Input(format!("kv cache: slot {slot} of {slots}")))?;
        *len = 0;
        Ok(())
    }
    /// Bytes of a cache of `slots x capacity` tokens for a target of `cfg`, in f32 (what
    /// [`Qwen3Target::kv_cache`] allocates): `2 * layers * slots * capacity * Hkv * D * 4`.
    /// Known before the weights load, so a cache that cannot fit is refused first.
    /// Saturates at `u64::MAX` (a capacity no device holds).
    pub fn bytes_for(cfg: &Qwen3Config, slots: usize, capacity: usize) -> u64 {
        [
            2,
            cfg.num_hidden_layers,
            slots,
            capacity,
            cfg.num_key_value_heads,
            cfg.head_dim,
            4,
        ]
        .iter()
        .try_fold(1u64, |acc, &n| acc.checked_mul(n as u64))
        .unwrap_or(u64::MAX)
    }
}

/// The rows of one [`Qwen3Target::extend`] call: for each appended token its slot, position
/// and cache row, and the attention mask over the whole cache.
struct Plan {
    ids: Vec<u32>,
    pos: Vec<i32>,
    rows: Vec<usize>,
    mask: BlockMask,
    /// Index into `ids` of each call entry's last token (whose logits come next).
    last: Vec<usize>,
    /// Every entry appends one token: a decode step.
    decode: bool,
}

impl Plan {
    fn new(cache: &KvCache, batch: &[(usize, &[u32])], vocab: usize) -> Result<Plan> {
        let cap = cache.capacity;
        let kv_rows = cache.slots() * cap;
        let mut seen = vec![false; cache.slots()];
        let n: usize = batch.iter().map(|(_, t)| t.len()).sum();
        let (mut ids, mut pos, mut rows) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        let (mut first, mut last) = (Vec::with_capacity(n), Vec::with_capacity(batch.len()));
        for &(slot, tokens) in batch {
            let input = |detail: String| Err(ModelError::Input(format!("kv cache: {detail}")));
            match seen.get_mut(slot) {
                None => return input(format!("slot {slot} of {}", cache.slots())),
                Some(true) => return input(format!("slot {slot} appears twice in one call")),
                Some(s) => *s = true,
            }
            let len = cache.lens[slot];
            if tokens.is_empty() || len + tokens.len() > cap {
                return input(format!(
                    "slot {slot} holds {len} tokens: appending {} does not fit its capacity {cap}",
                    tokens.len()
                ));
            }
            if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= vocab) {
                return input(format!(
                    "token id {bad} is outside the vocabulary of {vocab}"
                ));
            }
            let base = slot * cap;
            for (j, &t) in tokens.iter().enumerate() {
                let p = len + j;
                ids.push(t);
                pos.push(p as i32);
                rows.push(base + p);
                first.push(Interval::new(base as i32, (base + p + 1) as i32));
            }
            last.push(ids.len() - 1);
        }
        let second = vec![Interval::new(0, 0); first.len()];
        let mask = BlockMask::from_intervals(kv_rows, first, second)
            .map_err(|e| ModelError::Input(format!("kv cache mask: {e}")))?;
        Ok(Plan {
            decode: batch.iter().all(|(_, t)| t.len() == 1),
            ids,
            pos,
            rows,
            mask,
            last,
        })
    }
}

impl Qwen3Target {
    /// An empty cache of `slots` sequences of up to `capacity` tokens. The target must hold
    /// all its layers (loaded with the last layer among its ids).
    pub fn kv_cache(&self, slots: usize, capacity: usize) -> Result<KvCache> {
        if self.layers.len() != self.config().num_hidden_layers {
            return Err(ModelError::Input(format!(
                "generation needs all {} layers of the target, but only {} are loaded",
                self.config().num_hidden_layers,
                self.layers.len()
            )));
        }
        if slots == 0 || capacity == 0 {
            return Err(ModelError::Input(format!(
                "kv cache of {slots} slots x {capacity} tokens: both must be at least 1"
            )));
        }
        let b = self.backend().as_ref();
        let rows = self.kv_rows(slots, capacity)?;
        let shape = [rows, self.dims.kv_heads, self.dims.head_dim];
        let mut k = Vec::with_capacity(self.layers.len());
        let mut v = Vec::with_capacity(self.layers.len());
        for _ in &self.layers {
            k.push(b.zeros(&shape)?);
            v.push(b.zeros(&shape)?);
        }
        Ok(KvCache {
            k,
            v,
            capacity,
            lens: vec![0; slots],
        })
    }

    /// The rows of each layer's cache tensor, `slots * capacity`, where one such tensor can
    /// be allocated at all. An absurd `--batch` or capacity would otherwise wrap the product
    /// (a small cache whose slots overlap) or panic in the allocator: it is refused as
    /// memory no device has, with the bytes the whole cache would take.
    fn kv_rows(&self, slots: usize, capacity: usize) -> Result<usize> {
        let rows = slots.checked_mul(capacity);
        let tensor_bytes = rows
            .and_then(|r| r.checked_mul(self.dims.kv_heads))
            .and_then(|n| n.checked_mul(self.dims.head_dim))
            .and_then(|n| n.checked_mul(std::mem::size_of::<f32>()));
        match (rows, tensor_bytes) {
            // Rust allocations stop at isize::MAX bytes.
            (Some(rows), Some(bytes)) if isize::try_from(bytes).is_ok() => Ok(rows),
            _ => Err(dflash_core::Error::OutOfMemory {
                op: "kv_cache",
                device: self.backend().device(),
                requested: KvCache::bytes_for(self.config(), slots, capacity),
                free: None,
                total: None,
            }
            .into()),
        }
    }

    /// Appends `tokens` to each listed `(slot, tokens)` (distinct slots; a prompt, or the
    /// token sampled last) and returns `(n, H)`: the final-norm hidden state of each entry's
    /// last token, in `batch` order, ready for the LM head.
    pub fn extend(&self, cache: &mut KvCache, batch: &[(usize, &[u32])]) -> Result<Tensor> {
        let b = self.backend().as_ref();
        let plan = Plan::new(cache, batch, self.config().vocab_size)?;
        let mut x = b.embedding(self.frozen.embed(), &plan.ids)?;
        for (i, w) in self.layers.iter().enumerate() {
            let kv = (&mut cache.k[i], &mut cache.v[i]);
            x = cached_layer(b, w, &self.dims, &x, &plan, kv)?;
        }
        for &(slot, tokens) in batch {
            cache.lens[slot] += tokens.len();
        }
        let x = if plan.decode {
            x
        } else {
            let rows = plan
                .last
                .iter()
                .map(|&r| b.narrow_rows(&x, r, 1))
                .collect::<dflash_core::Result<Vec<_>>>()?;
            b.concat_rows(&rows.iter().collect::<Vec<_>>())?
        };
        let norm = self.norm.as_ref().expect("norm is loaded with the layers");
        Ok(b.rms_norm(&x, norm, self.dims.eps)?.0)
    }

    /// The LM head's logits `(n, V)` of [`Self::extend`]'s output.
    pub fn head_logits(&self, hidden: &Tensor) -> Result<Tensor> {
        Ok(self.backend().linear(hidden, self.lm_head())?)
    }
}

/// One decoder layer over the plan's rows, writing their keys and values into the cache
/// before attending to it. `x (T, H)` -> `(T, H)`.
fn cached_layer(
    b: &dyn Backend,
    w: &LayerWeights,
    d: &LayerDims,
    x: &Tensor,
    plan: &Plan,
    (k_cache, v_cache): (&mut Tensor, &mut Tensor),
) -> Result<Tensor> {
    let rows = x.dims()[0];
    let (xn, _) = b.rms_norm(x, &w.input_layernorm, d.eps)?;
    let (q, _) = head_norm(b, &b.linear(&xn, &w.q_proj)?, &w.q_norm, d)?;
    let q = b.rope(&q, &plan.pos, d.rope_theta)?; // (T, Hq, D)
    let (k, _) = head_norm(b, &b.linear(&xn, &w.k_proj)?, &w.k_norm, d)?;
    let k = b.rope(&k, &plan.pos, d.rope_theta)?; // (T, Hkv, D)
    let v = b
        .linear(&xn, &w.v_proj)?
        .reshape([rows, d.kv_heads, d.head_dim])?;
    b.scatter_rows(k_cache, &plan.rows, &k)?;
    b.scatter_rows(v_cache, &plan.rows, &v)?;
    // A decode step's rows each read another slot: per-row scheduling. A prefill's rows
    // come in runs of one slot, which a tiled kernel handles well.
    let attn = if plan.decode {
        b.attention_rows(&q, k_cache, v_cache, &plan.mask, d.scale())?
    } else {
        b.attention(&q, k_cache, v_cache, &plan.mask, d.scale())?.0
    };
    let attn = attn.reshape([rows, d.q_heads * d.head_dim])?;
    let h = b.add(x, &b.linear(&attn, &w.o_proj)?)?;
    let (hn, _) = b.rms_norm(&h, &w.post_attention_layernorm, d.eps)?;
    let act = b.swiglu(&b.linear(&hn, &w.gate_proj)?, &b.linear(&hn, &w.up_proj)?)?;
    Ok(b.add(&h, &b.linear(&act, &w.down_proj)?)?)
}
