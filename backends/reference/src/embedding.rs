//! Row gather from a frozen `(V, H)` table.

use dflash_core::{EmbeddingOps, Error, Result, Tensor};

use crate::storage::{host_tensor, shape_err, slice};
use crate::{DEVICE, ReferenceBackend};

impl EmbeddingOps for ReferenceBackend {
    fn embedding(&self, table: &Tensor, ids: &[u32]) -> Result<Tensor> {
        let op = "embedding";
        let tab = slice(op, table)?;
        if table.dims().len() != 2 {
            return Err(shape_err(
                op,
                format!("table {:?} must be (V, H)", table.shape()),
            ));
        }
        let (v, h) = (table.dims()[0], table.dims()[1]);
        let mut out = Vec::with_capacity(ids.len() * h); // (T, H)
        for (t, &id) in ids.iter().enumerate() {
            let id = id as usize;
            if id >= v {
                return Err(Error::op(
                    op,
                    DEVICE,
                    format!("token id {id} at position {t} is out of range for vocab size V = {v}"),
                ));
            }
            out.extend_from_slice(&tab[id * h..(id + 1) * h]);
        }
        Ok(host_tensor(out, [ids.len(), h]))
    }
}
