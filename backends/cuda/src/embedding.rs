//! Row gather from a frozen `(V, H)` table (`kernels/embedding.cu`), f32 or bf16; the output is
//! an activation (`CudaOptions::activations`): a same-dtype gather is an exact copy, a bf16
//! table into f32 widens exactly, an f32 table into bf16 rounds once (RNE). Ids are validated
//! on the host before anything is enqueued.

use cudarc::driver::PushKernelArg;
use dflash_core::{EmbeddingOps, Result, Tensor};

use crate::kernels::pick;
use crate::{CudaBackend, grid_vec8};

impl EmbeddingOps for CudaBackend {
    fn embedding(&self, table: &Tensor, ids: &[u32]) -> Result<Tensor> {
        let op = "embedding";
        let tab = self.any(op, table)?;
        let (_, h) = dflash_core::embedding_dims(op, &self.tag, table, ids)?;
        // The gather kernel indexes rows as i32 (vocabularies are far below 2^31 rows).
        let idx: Vec<i32> = ids.iter().map(|&id| id as i32).collect();
        let n = ids.len() * h;
        let od = self.opts.activations;
        let mut out = self.alloc(op, n, od)?;
        if n > 0 {
            let ids_dev = self.upload_i32(op, &idx)?;
            let (t64, h64) = (ids.len() as i64, h as i64);
            let k = self.k();
            let f = pick(
                &[
                    &k.embedding_gather_ff,
                    &k.embedding_gather_fb,
                    &k.embedding_gather_bf,
                    &k.embedding_gather_bb,
                ],
                &[od, tab.dtype],
            );
            let mut l = self.stream.launch_builder(f);
            l.arg(&mut out)
                .arg(&tab.buf)
                .arg(&ids_dev)
                .arg(&t64)
                .arg(&h64);
            self.launch(op, l, grid_vec8(n))?;
        }
        Ok(self.tensor(out, od, [ids.len(), h]))
    }
}
