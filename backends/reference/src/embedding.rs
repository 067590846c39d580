//! Row gather from a frozen `(V, H)` table.

use dflash_core::{EmbeddingOps, Result, Tensor};

use crate::storage::{host_tensor, slice};
use crate::{DEVICE, ReferenceBackend};

impl EmbeddingOps for ReferenceBackend {
    fn embedding(&self, table: &Tensor, ids: &[u32]) -> Result<Tensor> {
        let op = "embedding";
        let tab = slice(op, table)?;
        // Rank, id range and result size, all before the allocation below: its capacity
        // `T * H` is only known to fit once they pass.
        let (_, h) = dflash_core::embedding_dims(op, DEVICE, table, ids)?;
        let mut out = Vec::with_capacity(ids.len() * h); // (T, H)
        for &id in ids {
            let id = id as usize;
            out.extend_from_slice(&tab[id * h..(id + 1) * h]);
        }
        Ok(host_tensor(out, [ids.len(), h]))
    }
}
