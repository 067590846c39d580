//! Device buffers: [`WgpuStorage`] (elements of one [`DType`] in one storage buffer),
//! allocation with out-of-memory detection, host transfers in bounded chunks, and the checked
//! downcasts every op goes through.
//!
//! The dtype is validated once per operand, in the downcast: [`storage`] is what every op
//! that computes in f32 takes, and it rejects an f16 tensor with an error naming the op, the
//! shape, the dtype and the device; [`storage_any`] is for the ops that read both (the ones
//! [`dflash_core::MemoryOps::to_compute_format`] lists: memory moves, GEMM operands, the
//! embedding table, attention's q/k/v, the loss head), which branch on [`WgpuStorage::dtype`].

use std::any::Any;
use std::sync::Arc;
use std::sync::mpsc;

use dflash_core::{Error, Result, Shape, Storage, Tensor};

use crate::device::Ctx;
use crate::pipelines::Bind;

/// Bytes per host transfer chunk (staging buffers and queued writes stay this small).
const TRANSFER_CHUNK: u64 = 64 << 20;

/// The usages of every tensor buffer.
const USAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

/// The bytes a buffer of `n` elements of `dtype` needs: at least 16, a multiple of 16 (no
/// empty buffers, and a vec4 read of the last elements stays inside).
fn padded_bytes(dtype: DType, n: usize) -> u64 {
    (dtype.size() as u64 * n as u64)
        .next_multiple_of(16)
        .max(16)
}

/// Element type of a tensor buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// Everything a kernel writes: parameters, gradients, activations, statistics.
    F32,
    /// The compute format of read-only tensors (frozen weights, features) where the adapter
    /// has `SHADER_F16`: IEEE half, widened to f32 on load (kernels accumulate in f32).
    F16,
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 => 2,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F16 => "f16",
        }
    }
}

/// A tensor's buffer: `len` elements of `dtype`, row-major, on the device of `ctx`.
pub struct WgpuStorage {
    pub(crate) buf: wgpu::Buffer,
    pub(crate) len: usize,
    pub(crate) dtype: DType,
    pub(crate) ctx: Arc<Ctx>,
}

impl WgpuStorage {
    pub fn dtype(&self) -> DType {
        self.dtype
    }
}

impl std::fmt::Debug for WgpuStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "WgpuStorage({} {} on {})",
            self.len,
            self.dtype.name(),
            self.ctx.tag
        )
    }
}

impl Drop for WgpuStorage {
    fn drop(&mut self) {
        self.ctx.mem.sub(self.buf.size());
        self.ctx.pool.give(self.buf.clone());
    }
}

impl Storage for WgpuStorage {
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
    fn backend_name(&self) -> &'static str {
        "wgpu"
    }
    fn read_host(&self, n: usize) -> Result<Vec<f32>> {
        if n > self.len {
            return Err(Error::shape(
                "read_host",
                self.ctx.tag.clone(),
                format!("{n} elements asked of a buffer of {}", self.len),
            ));
        }
        self.ctx.download_as(&self.buf, self.dtype, n)
    }
}

impl WgpuStorage {
    /// The whole tensor as one binding (callers check it fits the binding limit).
    pub(crate) fn bind(&self) -> Bind<'_> {
        self.bind_elems(0, self.len)
    }

    /// Elements `[start, start + len)` as one binding; `start` must be a multiple of the
    /// device's offset alignment in elements of this dtype ([`Ctx::align_of`]). The size is
    /// rounded up to whole 32-bit words (what a storage binding must be; an f16 tensor's
    /// buffer always has room for it).
    pub(crate) fn bind_elems(&self, start: usize, len: usize) -> Bind<'_> {
        let es = self.dtype.size() as u64;
        Bind {
            buf: &self.buf,
            offset: es * start as u64,
            size: (es * len as u64).next_multiple_of(4).max(4),
        }
    }
}

impl Ctx {
    /// The storage-buffer offset alignment, in f32 elements.
    pub(crate) fn align_elems(&self) -> usize {
        self.align_of(DType::F32)
    }

    /// The storage-buffer offset alignment, in elements of `dtype`.
    pub(crate) fn align_of(&self, dtype: DType) -> usize {
        (self.limits.min_storage_buffer_offset_alignment.max(4) as usize / dtype.size()).max(1)
    }

    /// A zero-filled buffer for `n` f32 elements. Out of memory is [`Error::OutOfMemory`]; a
    /// size past the buffer limit names the limit.
    pub(crate) fn alloc(self: &Arc<Ctx>, op: &'static str, n: usize) -> Result<WgpuStorage> {
        self.alloc_as(op, n, DType::F32)
    }

    /// As [`Self::alloc`], for `n` elements of `dtype`.
    pub(crate) fn alloc_as(
        self: &Arc<Ctx>,
        op: &'static str,
        n: usize,
        dtype: DType,
    ) -> Result<WgpuStorage> {
        self.alloc_filled(op, n, dtype, true)
    }

    /// A buffer for `n` elements of `dtype` whose every element the caller writes before
    /// anything reads it (uploads): one from the pool is not cleared first. Its bytes past the
    /// `n` elements, up to the 16-byte multiple a vec4 read of the last element may reach,
    /// read as zeros, as a fresh buffer's.
    pub(crate) fn alloc_for_writes(
        self: &Arc<Ctx>,
        op: &'static str,
        n: usize,
        dtype: DType,
    ) -> Result<WgpuStorage> {
        let s = self.alloc_filled(op, n, dtype, false)?;
        let written = (dtype.size() as u64 * n as u64).next_multiple_of(4);
        let tail = padded_bytes(dtype, n) - written;
        if tail > 0 {
            self.queue
                .write_buffer(&s.buf, written, &[0u8; 16][..tail as usize]);
        }
        Ok(s)
    }

    /// A buffer for `n` elements of `dtype`: from the pool where it holds one of the size
    /// class (cleared first when `zeroed`, recorded in order with the kernels), else a new
    /// one (which wgpu zero-initialises). Out of memory lets go of what the device may still
    /// hold for this process ([`Self::release_for_retry`]) and tries once more.
    fn alloc_filled(
        self: &Arc<Ctx>,
        op: &'static str,
        n: usize,
        dtype: DType,
        zeroed: bool,
    ) -> Result<WgpuStorage> {
        self.alive(op)?;
        let bytes = padded_bytes(dtype, n);
        if bytes > self.limits.max_buffer_size {
            return Err(Error::op(
                op,
                self.tag.clone(),
                format!(
                    "a tensor of {n} {} elements ({bytes} bytes) exceeds the adapter's buffer \
                     size limit of {} bytes",
                    dtype.name(),
                    self.limits.max_buffer_size
                ),
            ));
        }
        let size = match self.pool.class(bytes) {
            c if c <= self.limits.max_buffer_size => c,
            _ => bytes,
        };
        let buf = match self.pool.take(size) {
            Some(buf) => {
                if zeroed {
                    self.record(|enc| enc.clear_buffer(&buf, 0, None));
                }
                buf
            }
            None => self.create_retrying(op, Some(op), size, USAGE)?,
        };
        // The buffer's bytes, its size class's rounding included: what the tensor takes from
        // the device (memory_stats; the memory plan rounds each tensor the same way). The
        // pool's holdings are not counted: an allocation that needs them drains the pool.
        self.mem.add(size);
        Ok(WgpuStorage {
            buf,
            len: n,
            dtype,
            ctx: self.clone(),
        })
    }

    /// After an allocation ran out of memory: submits what is recorded and waits until the
    /// device is idle, so that wgpu drops its references to the buffers finished work used
    /// (it destroys a buffer when the last reference goes, after a poll has retired the
    /// submissions that used it), then lets go of every buffer the pool holds, those freed
    /// since the last submit included. Dropping only the pool's free buffers, without the
    /// wait, could free nothing: in-flight work may still hold them.
    fn release_for_retry(&self, op: &'static str) -> Result<()> {
        self.wait(op)?;
        self.pool.drain();
        Ok(())
    }

    /// A new buffer (a tensor's, or a download's staging buffer); out of memory lets go of
    /// what the device may still hold for this process ([`Self::release_for_retry`]) and
    /// tries once more, then is [`Error::OutOfMemory`].
    fn create_retrying(
        &self,
        op: &'static str,
        label: Option<&str>,
        size: u64,
        usage: wgpu::BufferUsages,
    ) -> Result<wgpu::Buffer> {
        match self.create_buffer(op, label, size, usage) {
            Err(Error::OutOfMemory { .. }) => {
                self.release_for_retry(op)?;
                self.create_buffer(op, label, size, usage)
            }
            other => other,
        }
    }

    /// A new buffer of `size` bytes; out of memory is [`Error::OutOfMemory`].
    fn create_buffer(
        &self,
        op: &'static str,
        label: Option<&str>,
        size: u64,
        usage: wgpu::BufferUsages,
    ) -> Result<wgpu::Buffer> {
        #[cfg(test)]
        if tests::oom_hook::fails_now(self.pool.stats().2) {
            return Err(self.out_of_memory(op, size));
        }
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let buf = self.device.create_buffer(&wgpu::BufferDescriptor {
            label,
            size,
            usage,
            mapped_at_creation: false,
        });
        if pollster::block_on(scope.pop()).is_some() {
            return Err(self.out_of_memory(op, size));
        }
        Ok(buf)
    }

    fn out_of_memory(&self, op: &'static str, size: u64) -> Error {
        Error::OutOfMemory {
            op,
            device: self.tag.clone(),
            requested: size,
            free: None,
            total: None,
        }
    }

    /// Queues `data` into `buf` at element `start`, in bounded chunks. A queued write lands at
    /// the start of the next submission, before the pending encoder's commands, so the caller
    /// guarantees that nothing pending reads, writes or clears that range: a buffer from
    /// [`Self::alloc_for_writes`], or one flushed first.
    pub(crate) fn write(&self, buf: &wgpu::Buffer, start: usize, data: &[f32]) {
        self.write_words(buf, start, data, |v| v.to_le_bytes());
    }

    /// As [`Self::write`], for 32-bit words of any plain type (indices).
    pub(crate) fn write_words<T: Copy>(
        &self,
        buf: &wgpu::Buffer,
        start: usize,
        data: &[T],
        le: impl Fn(T) -> [u8; 4],
    ) {
        let chunk = (TRANSFER_CHUNK / 4) as usize;
        for (i, part) in data.chunks(chunk).enumerate() {
            let bytes: Vec<u8> = part.iter().flat_map(|&v| le(v)).collect();
            let off = 4 * (start + i * chunk) as u64;
            self.queue.write_buffer(buf, off, &bytes);
            if data.len() > chunk {
                // Submitting moves the staged chunk to the device, so host memory stays bounded.
                self.queue.submit([]);
            }
        }
    }

    /// A buffer holding `data` (u32 indices: token ids, row lists).
    pub(crate) fn upload_u32(
        self: &Arc<Ctx>,
        op: &'static str,
        data: &[u32],
    ) -> Result<WgpuStorage> {
        let s = self.alloc_for_writes(op, data.len(), DType::F32)?;
        self.write_words(&s.buf, 0, data, u32::to_le_bytes);
        Ok(s)
    }

    /// A buffer holding `data`.
    pub(crate) fn upload_f32(
        self: &Arc<Ctx>,
        op: &'static str,
        data: &[f32],
    ) -> Result<WgpuStorage> {
        let s = self.alloc_for_writes(op, data.len(), DType::F32)?;
        self.write(&s.buf, 0, data);
        Ok(s)
    }

    /// Reads f32 elements `[start, start + n)` of `buf` back to the host (submits what is
    /// pending and waits for it).
    pub(crate) fn download(&self, buf: &wgpu::Buffer, start: usize, n: usize) -> Result<Vec<f32>> {
        let mut out = Vec::with_capacity(n);
        self.download_bytes(buf, 4 * start as u64, 4 * n as u64, |b| {
            out.extend(
                b.chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            )
        })?;
        Ok(out)
    }

    /// The first `n` elements of a buffer of `dtype`, widened to f32 (exact).
    pub(crate) fn download_as(
        &self,
        buf: &wgpu::Buffer,
        dtype: DType,
        n: usize,
    ) -> Result<Vec<f32>> {
        if dtype == DType::F32 {
            return self.download(buf, 0, n);
        }
        let mut out = Vec::with_capacity(n);
        // Whole words (a copy moves multiples of 4 bytes; the buffer has room for them).
        self.download_bytes(buf, 0, (2 * n as u64).next_multiple_of(4), |b| {
            let widened = dflash_core::HostSlice::F16(b).to_f32_vec();
            let room = n - out.len();
            out.extend_from_slice(&widened[..widened.len().min(room)]);
        })?;
        Ok(out)
    }

    /// Bytes `[start, start + bytes)` of `buf` (both multiples of 4), handed to `sink` in
    /// chunks of at most [`TRANSFER_CHUNK`] (each a multiple of 4 bytes).
    fn download_bytes(
        &self,
        buf: &wgpu::Buffer,
        start: u64,
        bytes: u64,
        mut sink: impl FnMut(&[u8]),
    ) -> Result<()> {
        let op = "download";
        self.alive(op)?;
        let mut done = 0;
        while done < bytes {
            let len = TRANSFER_CHUNK.min(bytes - done);
            // Created as tensor buffers are (out of memory caught, one retry after draining
            // the pool) and before anything is recorded: a copy into a staging buffer that
            // failed to allocate would make wgpu reject the device's whole shared
            // submission, other instances' work included, and this download would report a
            // failed mapping instead of running out of memory.
            let staging = self.create_retrying(
                op,
                Some("download staging"),
                len,
                wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            )?;
            let src = start + done;
            self.record(|enc| enc.copy_buffer_to_buffer(buf, src, &staging, 0, len));
            self.flush();
            let (tx, rx) = mpsc::channel();
            staging.map_async(wgpu::MapMode::Read, .., move |r| {
                let _ = tx.send(r);
            });
            self.wait(op)?;
            let mapped = rx
                .recv()
                .map_err(|e| Error::op(op, self.tag.clone(), format!("mapping lost: {e}")))?;
            mapped.map_err(|e| Error::op(op, self.tag.clone(), format!("mapping failed: {e}")))?;
            {
                let view = staging
                    .get_mapped_range(..)
                    .map_err(|e| Error::op(op, self.tag.clone(), format!("mapped range: {e}")))?;
                sink(&view);
            }
            staging.unmap();
            done += len;
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------
// Downcasts

fn foreign(op: &'static str, tag: &str, t: &Tensor) -> Error {
    Error::ForeignTensor {
        op,
        device: tag.to_string(),
        detail: format!(
            "a {:?} tensor of backend {:?} given to backend \"wgpu\"",
            t.shape(),
            t.storage().backend_name()
        ),
    }
}

/// The f32 storage of `t`, checked to be of device `ctx` and to hold `t.numel()` elements:
/// what every op that computes in f32 takes (an f16 tensor is an error naming `op`).
pub(crate) fn storage<'a>(op: &'static str, ctx: &Ctx, t: &'a Tensor) -> Result<&'a WgpuStorage> {
    let s = storage_any(op, ctx, t)?;
    want_f32(op, ctx, s, t.shape())?;
    Ok(s)
}

/// As [`storage`], of either dtype (for the ops that read f16 operands).
pub(crate) fn storage_any<'a>(
    op: &'static str,
    ctx: &Ctx,
    t: &'a Tensor,
) -> Result<&'a WgpuStorage> {
    let s = t
        .storage()
        .as_any()
        .downcast_ref::<WgpuStorage>()
        .ok_or_else(|| foreign(op, &ctx.tag, t))?;
    check_storage(op, ctx, s, t.shape())?;
    Ok(s)
}

fn want_f32(op: &'static str, ctx: &Ctx, s: &WgpuStorage, shape: &Shape) -> Result<()> {
    if s.dtype != DType::F32 {
        return Err(Error::op(
            op,
            ctx.tag.clone(),
            format!(
                "tensor {shape:?} is {} (the compute format of read-only tensors); this op \
                 reads f32 only",
                s.dtype.name()
            ),
        ));
    }
    Ok(())
}

/// As [`storage`], mutably (for in-place ops, which write f32 only).
pub(crate) fn storage_mut<'a>(
    op: &'static str,
    ctx: &Ctx,
    t: &'a mut Tensor,
) -> Result<&'a mut WgpuStorage> {
    let shape = t.shape().clone();
    if !t.storage().as_any().is::<WgpuStorage>() {
        return Err(foreign(op, &ctx.tag, t));
    }
    let s = t
        .storage_mut()
        .as_any_mut()
        .downcast_mut::<WgpuStorage>()
        .ok_or_else(|| Error::op(op, ctx.tag.clone(), "downcast failed"))?;
    check_storage(op, ctx, s, &shape)?;
    want_f32(op, ctx, s, &shape)?;
    Ok(s)
}

fn check_storage(op: &'static str, ctx: &Ctx, s: &WgpuStorage, shape: &Shape) -> Result<()> {
    if !std::ptr::eq(Arc::as_ptr(&s.ctx), ctx) {
        return Err(Error::ForeignTensor {
            op,
            device: ctx.tag.clone(),
            detail: format!("a {shape:?} tensor of device {}", s.ctx.tag),
        });
    }
    if s.len != shape.numel() {
        return Err(Error::op(
            op,
            ctx.tag.clone(),
            format!(
                "tensor {shape:?} holds {} elements, not {}",
                s.len,
                shape.numel()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
