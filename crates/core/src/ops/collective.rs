use crate::{Result, Tensor};

/// A group of data-parallel ranks. Host implementations (threads) live in the pipeline;
/// NCCL-backed ones in GPU backends.
pub trait Communicator: Send + Sync {
    fn rank(&self) -> usize;
    fn world_size(&self) -> usize;
    /// In-place sum across ranks, identical result on every rank, summed in rank order so
    /// the result does not depend on arrival order.
    fn all_reduce_sum(&self, data: &mut [f32]) -> std::result::Result<(), String>;
}

pub trait CollectiveOps {
    /// Sums `t` across the communicator's ranks in place.
    fn all_reduce_sum(&self, t: &mut Tensor, comm: &dyn Communicator) -> Result<()>;
}
