//! Tensors of another GPU: copied device to device (a peer copy over NVLink / PCIe, ordered
//! after the writes of the stream that made the source), never through host memory. Target
//! features made on one GPU reach a drafter replica on another this way.

use cudarc::driver::CudaSlice;
use dflash_core::{Result, Tensor};

use crate::CudaBackend;
use crate::storage::CudaStorage;

impl CudaBackend {
    /// `t` copied onto this backend's device when it is a CUDA tensor of another device;
    /// `None` when it is not a CUDA tensor (the caller goes through the host then).
    pub(crate) fn import_peer(&self, t: &Tensor) -> Result<Option<Tensor>> {
        let op = "import (peer copy)";
        let Some(s) = t.storage().as_any().downcast_ref::<CudaStorage>() else {
            return Ok(None);
        };
        let bytes = s.len * s.dtype.size();
        let src = s.buf.slice(0..bytes.max(1).min(s.buf.len()));
        // The copy waits for the source stream's pending writes (cudarc records an event on
        // it), then runs on this backend's stream.
        let buf: CudaSlice<u8> = self.stream.clone_dtod(&src).map_err(|e| self.drv(op, e))?;
        let out = self.tensor(buf, s.dtype, t.shape().clone());
        Ok(Some(out))
    }
}
