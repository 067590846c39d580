//! The side stream and pinned staging buffers of `MemoryOps::download_detached`.

/// A side stream with two pinned staging buffers:
/// [`MemoryOps::download_detached`](dflash_core::MemoryOps::download_detached) copies a snapshot
/// through them in chunks. A pageable device-to-host copy of gigabytes (a checkpoint) holds the
/// driver for its whole length and slows the kernels that other threads launch meanwhile; a pinned
/// chunk is a true asynchronous DMA, and while the host drains one buffer the next chunk lands in
/// the other.
pub(crate) struct SideTransfers {
    stream: std::sync::Arc<cudarc::driver::CudaStream>,
    stage: [cudarc::driver::PinnedHostSlice<u8>; 2],
}

impl SideTransfers {
    /// Bytes of one staging buffer.
    const STAGE_BYTES: usize = 32 << 20;

    pub(super) fn new(
        ctx: &std::sync::Arc<cudarc::driver::CudaContext>,
    ) -> std::result::Result<Self, cudarc::driver::DriverError> {
        // Not `alloc_pinned`: its write-combined memory is slow for the host to read, and
        // reading is all the host does with it.
        let pinned = || unsafe { ctx.alloc_pinned_with_flags::<u8>(Self::STAGE_BYTES, 0) };
        Ok(SideTransfers {
            stream: ctx.new_stream()?,
            stage: [pinned()?, pinned()?],
        })
    }

    /// `src` into `dst` (the same length), waiting for `src`'s last write only. Whole chunks
    /// go through the pinned buffers; the tail (under one chunk) is a plain copy, because
    /// cudarc copies a destination's whole length.
    pub(super) fn copy(
        &mut self,
        src: &cudarc::driver::CudaView<'_, u8>,
        dst: &mut [u8],
    ) -> std::result::Result<(), cudarc::driver::DriverError> {
        let SideTransfers { stream, stage } = self;
        let chunk = Self::STAGE_BYTES;
        let whole = dst.len() / chunk;
        // Chunk `i` is staged in buffer `i % 2`; a buffer is refilled only after the host
        // has read it (its `as_slice` waited for the copy, and the host copy is synchronous).
        let fill = |stage: &mut cudarc::driver::PinnedHostSlice<u8>, i: usize| {
            stream.memcpy_dtoh(&src.slice(i * chunk..(i + 1) * chunk), stage)
        };
        for (i, buf) in stage.iter_mut().enumerate().take(whole) {
            fill(buf, i)?;
        }
        for i in 0..whole {
            let buf = &mut stage[i % 2];
            dst[i * chunk..(i + 1) * chunk].copy_from_slice(buf.as_slice()?);
            if i + 2 < whole {
                fill(buf, i + 2)?;
            }
        }
        let tail = whole * chunk;
        if tail < dst.len() {
            stream.memcpy_dtoh(&src.slice(tail..), &mut dst[tail..])?;
        }
        stream.synchronize()
    }
}
