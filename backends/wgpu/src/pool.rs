//! Freed tensor buffers kept for reuse, so that a training step, which allocates the same
//! sizes step after step, stops creating and destroying device buffers.
//!
//! Why: creating a large buffer, clearing it (wgpu zero-initialises every buffer it has not
//! seen written) and destroying it costs far more than reusing one. On an H100 an 8192^3 GEMM
//! whose 256 MiB result was a new buffer each call ran at 26.8 TFLOP/s against 34.6 with the
//! pool, and the attention backward after it 1.7x slower; the kernels' own device time was
//! the same (docs/PERF.md, "Session 13").
//!
//! The rules that keep reuse invisible:
//! - A buffer freed since the last submit may still be read or written by commands in the
//!   device's pending encoder; it waits in `recent` until that encoder is submitted
//!   ([`BufferPool::submitted`]). After that, whatever reuses it is ordered after those
//!   commands on the queue: a kernel recorded later, and a host write (`queue.write_buffer`,
//!   which lands at the start of the next submission) alike.
//! - Sizes are rounded up to classes (1/8 of a power of two, at least 256 bytes), so packed
//!   micro-batches of varying length still find buffers; bindings always name their element
//!   range, never the whole buffer, so the extra bytes are never read. A tensor's memory is
//!   its buffer's size ([`crate::WgpuBackend`]'s `memory_stats` and `allocation_rounding`,
//!   which the job's memory plan applies tensor by tensor).
//! - A reused buffer holds old values: [`crate::device::Ctx::alloc`] clears it (recorded, in
//!   order with the kernels), and uploads and op outputs (`WgpuBackend::out`, which the op
//!   writes in full; the poisoned suites prove it) take one uncleared.
//! - The pool holds at most [`BufferPool::cap`] bytes; an allocation the device cannot satisfy
//!   waits for the device to go idle, drains the pool and tries again
//!   (`Ctx::release_for_retry`).

use std::collections::HashMap;
use std::sync::Mutex;

/// The size classes: an eighth of a power of two, at least 256 bytes.
pub(crate) const CLASSES: dflash_core::AllocationRounding =
    dflash_core::AllocationRounding::SizeClasses {
        per_octave: 8,
        min_bytes: 256,
    };

#[derive(Default)]
struct Inner {
    /// Buffers freed before the last submit, by size class: free to hand out.
    free: HashMap<u64, Vec<wgpu::Buffer>>,
    /// Buffers freed since the last submit.
    recent: Vec<wgpu::Buffer>,
    /// Bytes in `free` and `recent`.
    held: u64,
    /// Requests served from the pool, and those that created a buffer.
    hits: u64,
    misses: u64,
}

/// One device's freed buffers ([`crate::device::Ctx::pool`]).
pub(crate) struct BufferPool {
    enabled: bool,
    cap: u64,
    inner: Mutex<Inner>,
}

impl BufferPool {
    /// A pool that keeps up to `cap` bytes (`enabled` false: keeps nothing, every request
    /// creates a buffer, as before the pool).
    pub(crate) fn new(enabled: bool, cap: u64) -> Self {
        BufferPool {
            enabled,
            cap,
            inner: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The buffer size a request of `bytes` gets: `bytes` rounded up to its class.
    pub(crate) fn class(&self, bytes: u64) -> u64 {
        self.rounding().bytes(bytes)
    }

    /// How a request is rounded: to [`CLASSES`], or not at all when the pool is off.
    pub(crate) fn rounding(&self) -> dflash_core::AllocationRounding {
        match self.enabled {
            true => CLASSES,
            false => dflash_core::AllocationRounding::Exact,
        }
    }

    /// A buffer of exactly `class` bytes freed before the last submit, if one is held.
    pub(crate) fn take(&self, class: u64) -> Option<wgpu::Buffer> {
        if !self.enabled {
            return None;
        }
        let mut inner = self.lock();
        let buf = inner.free.get_mut(&class).and_then(Vec::pop);
        match &buf {
            Some(b) => {
                inner.held -= b.size();
                inner.hits += 1;
            }
            None => inner.misses += 1,
        }
        buf
    }

    /// Keeps a tensor's freed buffer for reuse after the next submit (drops it when the pool
    /// is off or full).
    pub(crate) fn give(&self, buf: wgpu::Buffer) {
        if !self.enabled {
            return;
        }
        let mut inner = self.lock();
        if inner.held + buf.size() > self.cap {
            return;
        }
        inner.held += buf.size();
        inner.recent.push(buf);
    }

    /// The pending encoder was submitted: the buffers freed before it may be handed out.
    pub(crate) fn submitted(&self) {
        if !self.enabled {
            return;
        }
        let mut inner = self.lock();
        let recent = std::mem::take(&mut inner.recent);
        for b in recent {
            inner.free.entry(b.size()).or_default().push(b);
        }
    }

    /// Drops every buffer held, free and recent (the device ran out of memory, or the backend
    /// was asked to release its cache); returns the bytes let go. Dropping a recent buffer is
    /// safe where reusing it is not: wgpu keeps a buffer alive while recorded or submitted
    /// commands use it, and destroys it after the last of them is retired.
    pub(crate) fn drain(&self) -> u64 {
        let mut inner = self.lock();
        let bytes = inner.held;
        inner.free.clear();
        inner.recent.clear();
        inner.held = 0;
        bytes
    }

    /// `(hits, misses, bytes held)`.
    pub(crate) fn stats(&self) -> (u64, u64, u64) {
        let inner = self.lock();
        (inner.hits, inner.misses, inner.held)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The classes' own properties are tested with `AllocationRounding` in dflash-core.
    #[test]
    fn an_enabled_pool_rounds_to_its_classes_and_an_off_one_not_at_all() {
        let pool = BufferPool::new(true, 1 << 30);
        assert_eq!(pool.class(1), 256);
        assert_eq!(pool.class((1 << 20) + 1), (1 << 20) + (1 << 17));
        assert_eq!(pool.rounding(), CLASSES);
        let off = BufferPool::new(false, 1 << 30);
        assert_eq!(off.class(1000), 1000);
        assert_eq!(off.rounding(), dflash_core::AllocationRounding::Exact);
    }
}
