//! Device collectives through NCCL (cudarc's `nccl`, loaded dynamically like every CUDA
//! library here): the drafter replicas of one process, one per GPU, sum their gradients on
//! the GPUs over NVLink / PCIe peer paths, on each backend's own stream, without host memory.
//!
//! In one process the group is made at once from the replicas' streams (`ncclCommInitAll`);
//! across processes rank 0 makes NCCL's unique id, the processes' own group hands it to every
//! rank, and each joins (`ncclCommInitRank`). Each replica's thread then calls its own
//! member, for the same tensors in the same order. NCCL refuses two ranks on one GPU, and so
//! does [`CudaBackend::device_collectives`], with the devices named.

use std::sync::{Arc, Mutex};

use cudarc::driver::CudaStream;
use cudarc::nccl::{Comm, Id, ReduceOp};
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

/// What NCCL says about a failed call: the result code, its text and NCCL's last error
/// message (which names, e.g., the ranks that share a GPU); cudarc's own `Debug` says only
/// `NcclError`.
fn nccl_error(e: &cudarc::nccl::result::NcclError) -> String {
    let text = |p: *const std::ffi::c_char| {
        if p.is_null() {
            String::new()
        } else {
            // SAFETY: NCCL returns NUL-terminated static (or thread-local) strings.
            unsafe { std::ffi::CStr::from_ptr(p) }
                .to_string_lossy()
                .trim()
                .to_owned()
        }
    };
    // ncclGetLastError exists from NCCL 2.13 on (cudarc would panic on a missing symbol).
    let has_last = cudarc::nccl::result::get_nccl_version().is_ok_and(|v| v >= 21300);
    // SAFETY: both take no pointer argument but the (null: any) communicator.
    let (what, last) = unsafe {
        (
            text(cudarc::nccl::sys::ncclGetErrorString(e.0)),
            match has_last {
                true => text(cudarc::nccl::sys::ncclGetLastError(std::ptr::null_mut())),
                false => String::new(),
            },
        )
    };
    match last.is_empty() {
        true => format!("{:?} ({what})", e.0),
        false => format!("{:?} ({what}): {last}", e.0),
    }
}

/// The loaded NCCL's version, `2.21.5`.
fn nccl_version() -> String {
    cudarc::nccl::result::get_nccl_version()
        .map(|v| format!("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100))
        .unwrap_or_else(|_| "?".into())
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
                    "{shape:?} on rank {} of {}: {}",
                    self.rank,
                    self.world,
                    nccl_error(&e)
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

    /// A new NCCL unique id (128 bytes) for a group across processes.
    pub(crate) fn nccl_id(&self) -> Result<Vec<u8>> {
        check_library()?;
        let id = Id::new().map_err(|e| {
            Error::op(
                "nccl_id",
                self.tag.clone(),
                format!("ncclGetUniqueId: {}", nccl_error(&e)),
            )
        })?;
        Ok(id.internal().iter().map(|&c| c as u8).collect())
    }

    /// This process's rank of the NCCL group `id` (from [`Self::nccl_id`] on rank 0), on this
    /// backend's device and stream; blocks until every rank has joined.
    pub(crate) fn nccl_join(
        &self,
        id: &[u8],
        rank: usize,
        world: usize,
    ) -> Result<Box<dyn DeviceCollective>> {
        check_library()?;
        let op = "nccl_join";
        let internal: [std::ffi::c_char; 128] = <[u8; 128]>::try_from(id)
            .map_err(|_| {
                Error::op(
                    op,
                    self.tag.clone(),
                    format!("an NCCL unique id has 128 bytes, this one {}", id.len()),
                )
            })?
            .map(|b| b as std::ffi::c_char);
        if rank >= world {
            return Err(Error::op(
                op,
                self.tag.clone(),
                format!("rank {rank} of a group of {world}"),
            ));
        }
        // ncclCommInitRank works on the calling thread's current device.
        self.stream
            .context()
            .bind_to_thread()
            .map_err(|e| self.drv(op, e))?;
        let comm = Comm::from_rank(self.stream.clone(), rank, world, Id::uninit(internal))
            .map_err(|e| {
                Error::op(
                    op,
                    self.tag.clone(),
                    format!(
                        "ncclCommInitRank as rank {rank} of {world}: {} (NCCL needs one GPU \
                         per rank: give each process its own device)",
                        nccl_error(&e)
                    ),
                )
            })?;
        Ok(Box::new(NcclMember {
            comm: Mutex::new(SendComm(comm)),
            ordinal: self.ordinal,
            rank,
            world,
            version: nccl_version(),
        }))
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
        let version = nccl_version();
        let world = eps.len();
        let comms =
            Comm::from_devices(eps.iter().map(|e| e.stream.clone()).collect()).map_err(|e| {
                Error::op(
                    op,
                    self.tag.clone(),
                    format!("ncclCommInitAll over {world} GPUs: {}", nccl_error(&e)),
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
