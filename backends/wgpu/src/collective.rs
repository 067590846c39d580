//! Collectives through host memory, like the reference backend: the tensor is read back, the
//! communicator sums it across ranks in rank order, and the sum is written back in place.

use dflash_core::{CollectiveOps, Communicator, Result, Tensor};

use crate::WgpuBackend;
use crate::storage::storage_mut;

impl CollectiveOps for WgpuBackend {
    fn all_reduce_sum(&self, t: &mut Tensor, comm: &dyn Communicator) -> Result<()> {
        let op = "all_reduce_sum";
        let shape = t.shape().clone();
        let s = storage_mut(op, &self.ctx, t)?;
        // The download submits and waits for everything pending, so the in-place write below
        // is ordered after every earlier use of the buffer.
        let mut data = self.ctx.download(&s.buf, 0, s.len)?;
        comm.all_reduce_sum(&mut data).map_err(|e| {
            self.err(
                op,
                format!(
                    "{shape:?} on rank {} of {}: communicator failed: {e}",
                    comm.rank(),
                    comm.world_size()
                ),
            )
        })?;
        self.ctx.write(op, &s.buf, 0, &data);
        Ok(())
    }
}
