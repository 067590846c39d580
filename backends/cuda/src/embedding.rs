//! Row gather from a frozen `(V, H)` table (`kernels/embedding.cu`), f32 or bf16 (widened
//! exactly); the output is f32. Ids are validated on the host before anything is enqueued.

use cudarc::driver::PushKernelArg;
use dflash_core::{EmbeddingOps, Error, Result, Tensor};

use crate::storage::DType;
use crate::{CudaBackend, grid1d};

impl EmbeddingOps for CudaBackend {
    fn embedding(&self, table: &Tensor, ids: &[u32]) -> Result<Tensor> {
        let op = "embedding";
        let tab = self.any(op, table)?;
        if table.dims().len() != 2 {
            return Err(self.shape_err(op, format!("table {:?} must be (V, H)", table.shape())));
        }
        let (v, h) = (table.dims()[0], table.dims()[1]);
        let mut idx = Vec::with_capacity(ids.len());
        for (t, &id) in ids.iter().enumerate() {
            let id = id as usize;
            if id >= v {
                return Err(Error::op(
                    op,
                    self.tag.clone(),
                    format!("token id {id} at position {t} is out of range for vocab size V = {v}"),
                ));
            }
            idx.push(id as i32);
        }
        let n = ids.len() * h;
        let mut out = self.alloc_f32(op, n)?;
        if n > 0 {
            let ids_dev = self.upload_i32(op, &idx)?;
            let (t64, h64) = (ids.len() as i64, h as i64);
            let f = match tab.dtype {
                DType::F32 => &self.k().embedding_gather,
                DType::Bf16 => &self.k().embedding_gather_bf16,
            };
            let mut l = self.stream.launch_builder(f);
            l.arg(&mut out)
                .arg(&tab.buf)
                .arg(&ids_dev)
                .arg(&t64)
                .arg(&h64);
            self.launch(op, l, grid1d(n))?;
        }
        Ok(self.tensor(out, DType::F32, [ids.len(), h]))
    }
}
