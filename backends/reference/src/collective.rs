//! Collectives over host memory: the data already lives on the host, so the communicator
//! sums the buffer in place.

use dflash_core::{CollectiveOps, Communicator, Error, Result, Tensor};

use crate::storage::slice_mut;
use crate::{DEVICE, ReferenceBackend};

impl CollectiveOps for ReferenceBackend {
    fn all_reduce_sum(&self, t: &mut Tensor, comm: &dyn Communicator) -> Result<()> {
        let shape = t.shape().clone();
        let data = slice_mut("all_reduce_sum", t)?;
        comm.all_reduce_sum(data).map_err(|e| {
            Error::op(
                "all_reduce_sum",
                DEVICE,
                format!(
                    "{shape:?} on rank {} of {}: communicator failed: {e}",
                    comm.rank(),
                    comm.world_size()
                ),
            )
        })
    }
}
