use std::any::Any;

use crate::{Error, Result, Tensor};

/// A group of data-parallel ranks. Host implementations (threads) live in the pipeline;
/// NCCL-backed ones in GPU backends.
pub trait Communicator: Send + Sync {
    fn rank(&self) -> usize;
    fn world_size(&self) -> usize;
    /// In-place sum across ranks, identical result on every rank, summed in rank order so
    /// the result does not depend on arrival order.
    fn all_reduce_sum(&self, data: &mut [f32]) -> std::result::Result<(), String>;
}

/// One rank of a collective group that sums tensors on the devices themselves (NCCL on
/// CUDA), on the stream of the backend it was made for: nothing passes through host memory.
/// Each rank calls its member from its own thread, for the same tensors in the same order.
pub trait DeviceCollective: Send {
    /// Sums `t` (f32) across the group in place.
    fn all_reduce_sum(&self, t: &mut Tensor) -> Result<()>;
    /// What the group is, for the log: `NCCL 2.21.5, rank 1 of 2 on cuda:1`.
    fn describe(&self) -> String;
}

/// What a backend brings to a device collective group (its device and stream), opaque to
/// everyone but the backend kind that made it.
pub struct CollectiveEndpoint(pub Box<dyn Any + Send>);

pub trait CollectiveOps {
    /// Sums `t` across the communicator's ranks in place.
    fn all_reduce_sum(&self, t: &mut Tensor, comm: &dyn Communicator) -> Result<()>;

    /// This backend's part of a device collective group. Default: the backend has none.
    fn collective_endpoint(&self) -> Result<CollectiveEndpoint> {
        Err(self::no_device_collective())
    }

    /// The members of a device collective group over `endpoints` (rank i on endpoint i, each
    /// made by a backend of this kind), created together. Default: the backend has none.
    fn device_collectives(
        &self,
        endpoints: Vec<CollectiveEndpoint>,
    ) -> Result<Vec<Box<dyn DeviceCollective>>> {
        let _ = endpoints;
        Err(self::no_device_collective())
    }

    /// The id of a new device collective group across processes (NCCL's unique id), made on
    /// rank 0 and handed to every rank (the processes' own group carries it). Default: the
    /// backend has none.
    fn device_collective_id(&self) -> Result<Vec<u8>> {
        Err(self::no_device_collective())
    }

    /// This process's member of the device collective group `id`: rank `rank` of `world`,
    /// one process per device. Every rank must call it (it returns once all have joined).
    /// Default: the backend has none.
    fn join_device_collective(
        &self,
        id: &[u8],
        rank: usize,
        world: usize,
    ) -> Result<Box<dyn DeviceCollective>> {
        let _ = (id, rank, world);
        Err(self::no_device_collective())
    }
}

fn no_device_collective() -> Error {
    Error::Unavailable {
        name: "device collective".into(),
        reason: "this backend sums gradients through host memory only".into(),
    }
}
