//! Allocation after out of memory, on a device of its own (not the process's shared one, so
//! the pool holds only what the test puts there), through a hook that makes `create_buffer`
//! fail. Skips without an adapter.

use std::sync::Arc;

use super::*;

/// Failures `create_buffer` reports before it tries the device, and the bytes the pool held
/// at each call: per thread, so tests on other threads are untouched.
pub(crate) mod oom_hook {
    use std::cell::{Cell, RefCell};

    thread_local! {
        static FAILS: Cell<u32> = const { Cell::new(0) };
        static HELD_AT_CREATE: RefCell<Vec<u64>> = const { RefCell::new(Vec::new()) };
    }

    /// Logs `held` (the pool's bytes); whether this call is one of the failures armed.
    pub(crate) fn fails_now(held: u64) -> bool {
        HELD_AT_CREATE.with(|l| l.borrow_mut().push(held));
        FAILS.with(|f| {
            let left = f.get();
            f.set(left.saturating_sub(1));
            left > 0
        })
    }

    /// The next `n` calls on this thread fail; the log starts empty.
    pub(super) fn arm(n: u32) {
        FAILS.with(|f| f.set(n));
        HELD_AT_CREATE.with(|l| l.borrow_mut().clear());
    }

    /// The pool's bytes at each call since [`arm`].
    pub(super) fn log() -> Vec<u64> {
        HELD_AT_CREATE.with(|l| l.borrow().clone())
    }
}

/// A device of its own on adapter 0 with its pool on, or `None` after a skip line.
fn private_ctx() -> Option<Arc<Ctx>> {
    if std::env::var("DFLASH_WGPU_POOL").is_ok_and(|v| v == "0") {
        println!("skipped: DFLASH_WGPU_POOL=0, no pool to empty");
        return None;
    }
    match crate::device::open(0, false) {
        Ok(ctx) => Some(Arc::new(ctx)),
        Err(Error::Unavailable { reason, .. }) => {
            println!("skipped: no wgpu adapter ({reason})");
            None
        }
        Err(e) => panic!("opening a device: {e}"),
    }
}

#[test]
fn out_of_memory_empties_the_pool_recent_buffers_included_and_retries_once() {
    let Some(ctx) = private_ctx() else { return };
    let freed = ctx.alloc("t", 256).unwrap(); // a 1 KiB class
    let recent = ctx.alloc("t", 1024).unwrap(); // 4 KiB
    drop(freed);
    ctx.flush(); // `freed` is free to hand out now
    drop(recent); // freed since the last submit: in `recent`
    assert_eq!(ctx.pool.stats().2, 1024 + 4096);

    oom_hook::arm(1);
    let big = ctx
        .alloc("t", 1 << 16)
        .expect("the retry after out of memory");
    // The retry came after the pool let go of everything, the recent buffer included.
    assert_eq!(oom_hook::log(), [1024 + 4096, 0]);
    assert_eq!(ctx.pool.stats().2, 0);
    let back = ctx.download(&big.buf, 0, big.len).unwrap();
    assert!(
        back.iter().all(|&v| v == 0.0),
        "a new buffer reads as zeros"
    );

    // An empty pool is no reason not to retry: finished work may still hold memory.
    oom_hook::arm(1);
    ctx.alloc("t", 3 << 16)
        .expect("the retry with an empty pool");
    assert_eq!(oom_hook::log().len(), 2);

    // Once only: a second failure is the out-of-memory error, naming the op and the size.
    oom_hook::arm(2);
    match ctx.alloc("t", 5 << 16) {
        Err(Error::OutOfMemory { op, requested, .. }) => {
            assert_eq!(op, "t");
            assert_eq!(requested, ctx.pool.class(4 * (5 << 16)));
        }
        Err(e) => panic!("expected OutOfMemory, got {e}"),
        Ok(_) => panic!("the hook's second failure was not reported"),
    }
    assert_eq!(oom_hook::log().len(), 2);
    oom_hook::arm(0);
}

/// Out of memory on a download's staging buffer: caught before the copy is recorded (a copy
/// into a buffer that failed to allocate would make wgpu reject the device's whole shared
/// submission), retried once after the pool lets go, else reported as out of memory.
#[test]
fn a_download_whose_staging_buffer_runs_out_of_memory_retries_once_and_loses_no_work() {
    let Some(ctx) = private_ctx() else { return };
    let data: Vec<f32> = (1..=64).map(|i| i as f32).collect();
    let bytes = 4 * data.len() as u64;
    let src = ctx.upload_f32("t", &data).unwrap();
    // Work recorded, not yet submitted, when the download starts: a copy into `dst`.
    let pending_copy = |dst: &WgpuStorage| {
        let (s, d) = (src.buf.clone(), dst.buf.clone());
        ctx.record(move |enc| enc.copy_buffer_to_buffer(&s, 0, &d, 0, bytes));
    };

    // Failing twice: out of memory, naming the download and the staging size, with
    // nothing recorded into the shared encoder.
    let first = ctx.alloc("t", data.len()).unwrap();
    pending_copy(&first);
    oom_hook::arm(2);
    match ctx.download(&src.buf, 0, data.len()) {
        Err(Error::OutOfMemory { op, requested, .. }) => {
            assert_eq!(op, "download");
            assert_eq!(requested, bytes);
        }
        Err(e) => panic!("expected OutOfMemory, got {e}"),
        Ok(_) => panic!("the staging buffer's allocation failures were not reported"),
    }
    assert_eq!(oom_hook::log().len(), 2, "one retry, no more");
    oom_hook::arm(0);
    // The work recorded before it still ran.
    assert_eq!(ctx.download(&first.buf, 0, data.len()).unwrap(), data);

    // Failing once: the retry after draining the pool succeeds, and the work recorded
    // before it ran too.
    let second = ctx.alloc("t", data.len()).unwrap();
    pending_copy(&second);
    oom_hook::arm(1);
    assert_eq!(ctx.download(&second.buf, 0, data.len()).unwrap(), data);
    let log = oom_hook::log();
    assert_eq!(log.len(), 2, "a failure and its retry: {log:?}");
    assert_eq!(
        log[1], 0,
        "the retry came after the pool let go of everything"
    );
    oom_hook::arm(0);
    ctx.wait("t").unwrap();
}
