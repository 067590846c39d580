//! Device buffers: [`WgpuStorage`] (f32 elements in one storage buffer), allocation with
//! out-of-memory detection, host transfers in bounded chunks, and the checked downcasts every
//! op goes through.

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

/// A tensor's buffer: `len` f32 elements, row-major, on the device of `ctx`.
pub struct WgpuStorage {
    pub(crate) buf: wgpu::Buffer,
    pub(crate) len: usize,
    pub(crate) ctx: Arc<Ctx>,
}

impl std::fmt::Debug for WgpuStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "WgpuStorage({} f32 on {})", self.len, self.ctx.tag)
    }
}

impl Drop for WgpuStorage {
    fn drop(&mut self) {
        self.ctx.mem.sub(self.buf.size());
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
        self.ctx.download(&self.buf, 0, n)
    }
}

impl WgpuStorage {
    /// The whole tensor as one binding (callers check it fits the binding limit).
    pub(crate) fn bind(&self) -> Bind<'_> {
        self.bind_elems(0, self.len)
    }

    /// Elements `[start, start + len)` as one binding; `start` must be a multiple of the
    /// device's offset alignment in elements ([`Ctx::align_elems`]).
    pub(crate) fn bind_elems(&self, start: usize, len: usize) -> Bind<'_> {
        Bind {
            buf: &self.buf,
            offset: 4 * start as u64,
            size: (4 * len as u64).max(4),
        }
    }
}

impl Ctx {
    /// The storage-buffer offset alignment, in f32 elements.
    pub(crate) fn align_elems(&self) -> usize {
        (self.limits.min_storage_buffer_offset_alignment as usize / 4).max(1)
    }

    /// A zero-filled buffer for `n` f32 elements (wgpu zero-initialises every buffer).
    /// Out of memory is [`Error::OutOfMemory`]; a size past the buffer limit names the limit.
    pub(crate) fn alloc(self: &Arc<Ctx>, op: &'static str, n: usize) -> Result<WgpuStorage> {
        // At least 16 bytes, a multiple of 16: no empty buffers, and vec4 reads stay inside.
        let bytes = (4 * n as u64).next_multiple_of(16).max(16);
        if bytes > self.limits.max_buffer_size {
            return Err(Error::op(
                op,
                self.tag.clone(),
                format!(
                    "a tensor of {n} f32 elements ({bytes} bytes) exceeds the adapter's buffer \
                     size limit of {} bytes",
                    self.limits.max_buffer_size
                ),
            ));
        }
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
        let buf = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(op),
            size: bytes,
            usage: USAGE,
            mapped_at_creation: false,
        });
        if pollster::block_on(scope.pop()).is_some() {
            return Err(Error::OutOfMemory {
                op,
                device: self.tag.clone(),
                requested: bytes,
                free: None,
                total: None,
            });
        }
        self.mem.add(bytes);
        Ok(WgpuStorage {
            buf,
            len: n,
            ctx: self.clone(),
        })
    }

    /// Queues `data` into `buf` at element `start`, in bounded chunks. The caller guarantees
    /// nothing pending reads or writes that range (a fresh buffer, or one flushed first).
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

    /// A fresh buffer holding `data` (u32 indices: token ids, row lists).
    pub(crate) fn upload_u32(
        self: &Arc<Ctx>,
        op: &'static str,
        data: &[u32],
    ) -> Result<WgpuStorage> {
        let s = self.alloc(op, data.len())?;
        self.write_words(&s.buf, 0, data, u32::to_le_bytes);
        Ok(s)
    }

    /// Reads elements `[start, start + n)` of `buf` back to the host (submits what is pending
    /// and waits for it).
    pub(crate) fn download(&self, buf: &wgpu::Buffer, start: usize, n: usize) -> Result<Vec<f32>> {
        let op = "download";
        let mut out = Vec::with_capacity(n);
        let chunk = (TRANSFER_CHUNK / 4) as usize;
        let mut done = 0;
        while done < n {
            let len = chunk.min(n - done);
            let bytes = 4 * len as u64;
            let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("download staging"),
                size: bytes,
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            let src = 4 * (start + done) as u64;
            self.record(|enc| enc.copy_buffer_to_buffer(buf, src, &staging, 0, bytes));
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
                out.extend(
                    view.chunks_exact(4)
                        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
                );
            }
            staging.unmap();
            done += len;
        }
        Ok(out)
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

/// The wgpu storage of `t`, checked to be of device `ctx` and to hold `t.numel()` elements.
pub(crate) fn storage<'a>(op: &'static str, ctx: &Ctx, t: &'a Tensor) -> Result<&'a WgpuStorage> {
    let s = t
        .storage()
        .as_any()
        .downcast_ref::<WgpuStorage>()
        .ok_or_else(|| foreign(op, &ctx.tag, t))?;
    check_storage(op, ctx, s, t.shape())?;
    Ok(s)
}

/// As [`storage`], mutably (for in-place ops).
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
