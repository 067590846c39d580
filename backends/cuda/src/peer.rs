//! Tensors of another GPU: copied device to device (a peer copy over NVLink / PCIe, ordered
//! after the writes of the stream that made the source), never through host memory. Target
//! features made on one GPU reach a drafter replica on another this way.

use cudarc::driver::DevicePtr;
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
        // Allocated here, so that a full device is `Error::OutOfMemory` like any other op's.
        let mut buf = self.alloc(op, s.len, s.dtype)?;
        // The copy waits for the source stream's pending writes (cudarc has this stream wait
        // on an event of it), then runs on this backend's stream.
        self.stream
            .memcpy_dtod(&src, &mut buf.slice_mut(0..src.len()))
            .map_err(|e| self.drv(op, e))?;
        // cudarc marks the source read on its own stream *before* the copy, which runs on
        // ours: without this, the source could be freed or written (by its owner's next
        // step) while the copy still reads it. Its stream waits for the copy, and the read
        // mark is renewed after that wait.
        let copied = self
            .stream
            .record_event(None)
            .map_err(|e| self.drv(op, e))?;
        let src_stream = s.buf.stream();
        src_stream.wait(&copied).map_err(|e| self.drv(op, e))?;
        drop(s.buf.device_ptr(src_stream));
        let out = self.tensor(buf, s.dtype, t.shape().clone());
        Ok(Some(out))
    }
}
