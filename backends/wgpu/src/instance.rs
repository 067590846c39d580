//! A backend instance's handle on its shared device ([`Inst`]): the device ([`Ctx`]) and the
//! instance's id, so that what wgpu reports outside a call's result is recorded for the
//! instance (and op) that raised it and reported to it alone ([`crate::device::errors`]).
//!
//! `Inst` dereferences to the shared `Arc<Ctx>`, and shadows each `Ctx` call that records
//! work, writes to the device or reports errors with one that first marks this instance and
//! the op as running on the thread (`errors::enter`). A `Ctx` call made on a tensor's own
//! device (`Storage::read_host`) runs unmarked: its errors go to whichever instance checks
//! next. A new `Ctx` call that records or checks belongs in the list below.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use dflash_core::Result;

use crate::device::Ctx;
use crate::device::errors::{self, Entered, Origin};
use crate::pipelines::{Bind, Kernel};
use crate::storage::{DType, WgpuStorage};

/// One backend instance's view of its device.
pub(crate) struct Inst {
    ctx: Arc<Ctx>,
    id: u64,
}

impl std::ops::Deref for Inst {
    type Target = Arc<Ctx>;
    fn deref(&self) -> &Arc<Ctx> {
        &self.ctx
    }
}

impl Inst {
    /// A new instance on `ctx`, with an id no other instance of this process has.
    pub(crate) fn new(ctx: Arc<Ctx>) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Inst {
            ctx,
            id: NEXT.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// This instance's id (in error messages: `wgpu:N#id`).
    #[cfg(test)]
    pub(crate) fn id(&self) -> u64 {
        self.id
    }

    /// Marks this instance's `op` as running on this thread until the guard drops.
    pub(crate) fn enter(&self, op: &'static str) -> Entered {
        errors::enter(Origin {
            instance: self.id,
            op,
        })
    }

    pub(crate) fn dispatch(
        &self,
        op: &'static str,
        k: &Kernel<'_>,
        params: &[u32],
        reads: &[Bind<'_>],
        writes: &[Bind<'_>],
        groups: u64,
    ) -> Result<()> {
        let _on = self.enter(op);
        self.ctx.dispatch(op, k, params, reads, writes, groups)
    }

    pub(crate) fn wait(&self, op: &'static str) -> Result<()> {
        let _on = self.enter(op);
        self.ctx.wait(op)
    }

    pub(crate) fn alloc(&self, op: &'static str, n: usize) -> Result<WgpuStorage> {
        let _on = self.enter(op);
        self.ctx.alloc(op, n)
    }

    pub(crate) fn alloc_for_writes(
        &self,
        op: &'static str,
        n: usize,
        dtype: DType,
    ) -> Result<WgpuStorage> {
        let _on = self.enter(op);
        self.ctx.alloc_for_writes(op, n, dtype)
    }

    pub(crate) fn upload_u32(&self, op: &'static str, data: &[u32]) -> Result<WgpuStorage> {
        let _on = self.enter(op);
        self.ctx.upload_u32(op, data)
    }

    pub(crate) fn upload_f32(&self, op: &'static str, data: &[f32]) -> Result<WgpuStorage> {
        let _on = self.enter(op);
        self.ctx.upload_f32(op, data)
    }

    pub(crate) fn download(&self, buf: &wgpu::Buffer, start: usize, n: usize) -> Result<Vec<f32>> {
        let _on = self.enter("download");
        self.ctx.download(buf, start, n)
    }

    pub(crate) fn download_as(
        &self,
        buf: &wgpu::Buffer,
        dtype: DType,
        n: usize,
    ) -> Result<Vec<f32>> {
        let _on = self.enter("download");
        self.ctx.download_as(buf, dtype, n)
    }

    /// [`Ctx::write`] for `op`.
    pub(crate) fn write(&self, op: &'static str, buf: &wgpu::Buffer, start: usize, data: &[f32]) {
        let _on = self.enter(op);
        self.ctx.write(buf, start, data)
    }

    /// [`Ctx::record`] for `op`.
    pub(crate) fn record(&self, op: &'static str, f: impl FnOnce(&mut wgpu::CommandEncoder)) {
        let _on = self.enter(op);
        self.ctx.record(f)
    }

    /// [`Ctx::flush`] for `op`.
    pub(crate) fn flush(&self, op: &'static str) {
        let _on = self.enter(op);
        self.ctx.flush()
    }
}

/// An instance's errors that it never checked are said when it goes (no other instance is
/// given them).
impl Drop for Inst {
    fn drop(&mut self) {
        for e in self.ctx.errors.forget(self.id, &self.ctx.tag) {
            eprintln!("dflash-backend-wgpu: an error of a backend instance that was dropped: {e}");
        }
    }
}

#[cfg(test)]
mod tests;
