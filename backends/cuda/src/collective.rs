//! Collectives. `all_reduce_sum` goes through the host like the reference backend: download,
//! sum across ranks with the communicator, upload in place. The device group (NCCL, one rank
//! per GPU, nothing through host memory) is in `nccl.rs`.

use dflash_core::{
    CollectiveEndpoint, CollectiveOps, Communicator, DeviceCollective, Error, Result, Tensor,
};

use crate::CudaBackend;
use crate::storage::{f32_bytes, f32_bytes_mut};

impl CollectiveOps for CudaBackend {
    fn collective_endpoint(&self) -> Result<CollectiveEndpoint> {
        self.nccl_endpoint()
    }

    fn device_collectives(
        &self,
        endpoints: Vec<CollectiveEndpoint>,
    ) -> Result<Vec<Box<dyn DeviceCollective>>> {
        self.nccl_group(endpoints)
    }

    fn device_collective_id(&self) -> Result<Vec<u8>> {
        self.nccl_id()
    }

    fn join_device_collective(
        &self,
        id: &[u8],
        rank: usize,
        world: usize,
    ) -> Result<Box<dyn DeviceCollective>> {
        self.nccl_join(id, rank, world)
    }

    fn all_reduce_sum(&self, t: &mut Tensor, comm: &dyn Communicator) -> Result<()> {
        let op = "all_reduce_sum";
        let shape = t.shape().clone();
        let s = self.f32s_mut(op, t)?;
        let n = s.len;
        let mut host = vec![0.0f32; n];
        if n > 0 {
            self.stream
                .memcpy_dtoh(&s.buf.slice(0..n * 4), f32_bytes_mut(&mut host))
                .map_err(|e| self.drv(op, e))?;
        }
        self.stream.synchronize().map_err(|e| self.drv(op, e))?;
        comm.all_reduce_sum(&mut host).map_err(|e| {
            Error::op(
                op,
                self.tag.clone(),
                format!(
                    "{shape:?} on rank {} of {}: communicator failed: {e}",
                    comm.rank(),
                    comm.world_size()
                ),
            )
        })?;
        if n > 0 {
            self.stream
                .memcpy_htod(f32_bytes(&host), &mut s.buf.slice_mut(0..n * 4))
                .map_err(|e| self.drv(op, e))?;
        }
        Ok(())
    }
}
