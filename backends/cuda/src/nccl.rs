//! Device collectives through NCCL (cudarc's `nccl`, loaded dynamically like every CUDA
//! library here): the drafter replicas of one process, one per GPU, sum their gradients on
//! the GPUs over NVLink / PCIe peer paths, on each backend's own stream, without host memory.
//!
//! The group is made at once from the replicas' streams (`ncclCommInitAll`); each replica's
//! thread then calls its own member, for the same tensors in the same order. NCCL refuses
//! two ranks on one GPU, and so does [`CudaBackend::device_collectives`], with the devices
//! named.

use std::sync::{Arc, Mutex};

use cudarc::driver::CudaStream;
use cudarc::nccl::{Comm, ReduceOp};
use dflash_core::{CollectiveEndpoint, DeviceCollective, Error, Result, Tensor};

use crate::CudaBackend;
use crate::storage::{CudaStorage, DType};

/// Whether libnccl can be loaded (cudarc panics on a missing library; this only tries to
/// dlopen the candidate names).
fn check_library() -> Result<()> {
    // SAFETY: dlopen of the candidate names only; no symbol is called.
    if unsafe { cudarc::nccl::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(Error::Unavailable {
            name: "NCCL".into(),
            reason: "libnccl.so.2 could not be loaded (install NCCL 2, e.g. the nvidia-nccl-cu* \
                     wheel or libnccl2, and put it on LD_LIBRARY_PATH)"
                .into(),
        })
    }
}

/// What a CUDA backend brings to a group: its device and stream.
struct Endpoint {
    ordinal: usize,
    stream: Arc<CudaStream>,
}

/// One rank's NCCL communicator.
struct NcclMember {
    /// Behind a mutex: a communicator must not be called from two threads at once.
    comm: Mutex<SendComm>,
    ordinal: usize,
    rank: usize,
    world: usize,
    version: String,
}

struct SendComm(Comm);

// SAFETY: an NCCL communicator is a handle that NCCL lets any thread use, as long as calls
// on it do not overlap; `NcclMember` serialises them with its mutex, and the stream it holds
// (`Arc<CudaStream>`) is itself `Send`.
unsafe impl Send for SendComm {}

impl NcclMember {
    fn tag(&self) -> String {
        format!("cuda:{}", self.ordinal)
    }

    fn err(&self, detail: String) -> Error {
        Error::op("nccl_all_reduce_sum", self.tag(), detail)
    }
}

impl DeviceCollective for NcclMember {
    fn all_reduce_sum(&self, t: &mut Tensor) -> Result<()> {
        let shape = t.shape().clone();
        let backend = t.storage().backend_name();
        let s = t
            .storage_mut()
            .as_any_mut()
            .downcast_mut::<CudaStorage>()
            .ok_or_else(|| self.err(format!("tensor {shape:?} belongs to backend {backend}")))?;
        if s.dtype != DType::F32 || s.ordinal != self.ordinal {
            return Err(self.err(format!(
                "tensor {shape:?} is {} on cuda:{}; the group sums f32 on cuda:{}",
                s.dtype.name(),
                s.ordinal,
                self.ordinal
            )));
        }
        let n = s.len;
        if n == 0 {
            return Ok(());
        }
        let comm = self.comm.lock().unwrap_or_else(|p| p.into_inner());
        comm.0
            .context()
            .bind_to_thread()
            .map_err(|e| self.err(format!("binding the context: {e:?}")))?;
        // SAFETY: the buffer holds at least `len` f32 values (`CudaStorage`'s invariant).
        let mut view = unsafe { s.buf.transmute_mut::<f32>(n) }
            .ok_or_else(|| self.err(format!("buffer of {shape:?} shorter than {n} f32")))?;
        comm.0
            .all_reduce_in_place(&mut view, &ReduceOp::Sum)
            .map_err(|e| {
                self.err(format!(
                    "{shape:?} on rank {} of {}: {e:?}",
                    self.rank, self.world
                ))
            })?;
        Ok(())
    }

    fn describe(&self) -> String {
        format!(
            "NCCL {}, rank {} of {} on {}",
            self.version,
            self.rank,
            self.world,
            self.tag()
        )
    }
}

impl CudaBackend {
    pub(crate) fn nccl_endpoint(&self) -> Result<CollectiveEndpoint> {
        check_library()?;
        Ok(CollectiveEndpoint(Box::new(Endpoint {
            ordinal: self.ordinal,
            stream: self.stream.clone(),
        })))
    }

    pub(crate) fn nccl_group(
        &self,
        endpoints: Vec<CollectiveEndpoint>,
    ) -> Result<Vec<Box<dyn DeviceCollective>>> {
        check_library()?;
        let op = "nccl_group";
        let eps = endpoints
            .into_iter()
            .enumerate()
            .map(|(rank, e)| {
                e.0.downcast::<Endpoint>().map(|b| *b).map_err(|_| {
                    Error::op(
                        op,
                        self.tag.clone(),
                        format!("rank {rank} is not a CUDA backend"),
                    )
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let mut ordinals: Vec<usize> = eps.iter().map(|e| e.ordinal).collect();
        ordinals.sort_unstable();
        if let Some(w) = ordinals.windows(2).find(|w| w[0] == w[1]) {
            return Err(Error::op(
                op,
                self.tag.clone(),
                format!(
                    "two drafter replicas on cuda:{}: NCCL needs one rank per GPU (set \
                     pipeline.collective = \"host\", or one replica per device)",
                    w[0]
                ),
            ));
        }
        let version = cudarc::nccl::result::get_nccl_version()
            .map(|v| format!("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100))
            .unwrap_or_else(|_| "?".into());
        let world = eps.len();
        let comms =
            Comm::from_devices(eps.iter().map(|e| e.stream.clone()).collect()).map_err(|e| {
                Error::op(
                    op,
                    self.tag.clone(),
                    format!("ncclCommInitAll over {world} GPUs: {e:?}"),
                )
            })?;
        Ok(comms
            .into_iter()
            .zip(&eps)
            .enumerate()
            .map(|(rank, (comm, e))| {
                Box::new(NcclMember {
                    comm: Mutex::new(SendComm(comm)),
                    ordinal: e.ordinal,
                    rank,
                    world,
                    version: version.clone(),
                }) as Box<dyn DeviceCollective>
            })
            .collect())
    }
}
