//! What wgpu reports outside the calls that return a result, kept per device for the backend
//! instances that share it (every instance on an adapter shares one device: in the default
//! one-GPU layout the target worker and the drafter replica do):
//!
//! - **Uncaptured errors** (a validation error of a host write, of a submission): each is
//!   recorded with the instance and op that were running on the thread that raised it
//!   ([`Origin`], set by [`crate::instance::Inst`]'s calls; wgpu calls the handler on that
//!   thread), and reported only to that instance ([`ErrorLog::take_for`]), never to another
//!   instance's next op under that op's name. A rejected submission holds the work of every
//!   instance that recorded into the device's shared encoder since the last one, and none of
//!   it ran, so each of them is told ([`ErrorLog::rejected`]). Errors raised outside any
//!   instance's op (a tensor's `read_host`) go to whichever instance checks next.
//! - **Device loss**: the device-lost callback records the reason ([`ErrorLog::lose`]); every
//!   op of every instance then fails with `device lost: ...`. wgpu turns a device error met
//!   while waiting (`Device::poll`: the device lost, out of memory) into a panic ("Error in
//!   Device::poll"), after it has called the callback; [`guarded`] turns that back into an
//!   error.

use std::cell::Cell;
use std::sync::{Arc, Mutex};

/// The backend instance ([`crate::instance::Inst`]) and the op running on this thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Origin {
    pub(crate) instance: u64,
    pub(crate) op: &'static str,
}

thread_local! {
    static CURRENT: Cell<Option<Origin>> = const { Cell::new(None) };
}

/// While alive, `origin` is what runs on this thread ([`current`]); the previous one after.
pub(crate) struct Entered {
    prev: Option<Origin>,
}

impl Drop for Entered {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.prev));
    }
}

/// Marks `origin` as running on this thread until the returned guard drops.
pub(crate) fn enter(origin: Origin) -> Entered {
    Entered {
        prev: CURRENT.with(|c| c.replace(Some(origin))),
    }
}

/// The instance and op running on this thread, if any.
pub(crate) fn current() -> Option<Origin> {
    CURRENT.with(Cell::get)
}

/// One error wgpu raised outside an error scope.
#[derive(Debug)]
struct Recorded {
    /// Who raised it; `None`: no instance's op was running.
    origin: Option<Origin>,
    message: String,
}

impl Recorded {
    fn describe(&self, tag: &str) -> String {
        match self.origin {
            Some(o) => format!(
                "{} (raised by {} of {tag}#{})",
                self.message, o.op, o.instance
            ),
            None => format!("{} (raised outside any backend op)", self.message),
        }
    }
}

/// One device's uncaptured errors, oldest first, and whether it was lost.
#[derive(Debug, Default)]
pub(crate) struct ErrorLog {
    errors: Mutex<Vec<Recorded>>,
    /// The first loss reported (by the callback, or by a wait that failed).
    lost: Mutex<Option<String>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl ErrorLog {
    /// Records `message`, raised by `origin`.
    pub(crate) fn push(&self, origin: Option<Origin>, message: String) {
        lock(&self.errors).push(Recorded { origin, message });
    }

    /// A submission holding the work `origins` recorded was rejected with `message`: each
    /// instance among them is told (naming its ops), and no one in particular where work was
    /// recorded outside any instance's op.
    pub(crate) fn rejected(&self, origins: &[Option<Origin>], message: &str) {
        let mut instances: Vec<u64> = origins.iter().flatten().map(|o| o.instance).collect();
        instances.sort_unstable();
        instances.dedup();
        let say = |ops: &[&str]| {
            format!(
                "a submission holding work of {} was rejected, so none of the work recorded \
                 with it ran: {message}",
                ops.join(", ")
            )
        };
        for i in instances {
            let mine: Vec<Origin> = origins
                .iter()
                .flatten()
                .filter(|o| o.instance == i)
                .copied()
                .collect();
            let mut ops: Vec<&str> = Vec::new();
            for o in &mine {
                if !ops.contains(&o.op) {
                    ops.push(o.op);
                }
            }
            self.push(Some(mine[0]), say(&ops));
        }
        if origins.is_empty() || origins.contains(&None) {
            self.push(None, say(&["work recorded outside any backend op"]));
        }
    }

    /// Takes the errors for `instance` (the one running on this thread; `None`: none is):
    /// its own and those no instance raised, described for device `tag`. Other instances'
    /// errors stay for them.
    pub(crate) fn take_for(&self, instance: Option<u64>, tag: &str) -> Vec<String> {
        let mut errs = lock(&self.errors);
        let (mine, rest): (Vec<Recorded>, Vec<Recorded>) = std::mem::take(&mut *errs)
            .into_iter()
            .partition(|r| r.origin.is_none() || r.origin.map(|o| o.instance) == instance);
        *errs = rest;
        mine.iter().map(|r| r.describe(tag)).collect()
    }

    /// Drops the errors of `instance` (it is gone), returning them described for `tag`.
    pub(crate) fn forget(&self, instance: u64, tag: &str) -> Vec<String> {
        let mut errs = lock(&self.errors);
        let (gone, rest): (Vec<Recorded>, Vec<Recorded>) = std::mem::take(&mut *errs)
            .into_iter()
            .partition(|r| r.origin.is_some_and(|o| o.instance == instance));
        *errs = rest;
        gone.iter().map(|r| r.describe(tag)).collect()
    }

    /// The device is lost for `reason` (the first reason given is kept).
    pub(crate) fn lose(&self, reason: String) {
        lock(&self.lost).get_or_insert(reason);
    }

    /// Why the device was lost, if it was.
    pub(crate) fn lost(&self) -> Option<String> {
        lock(&self.lost).clone()
    }
}

/// A log for `device`, installed as its uncaptured-error handler (in place of wgpu's default,
/// which panics) and its device-lost callback.
pub(crate) fn install(device: &wgpu::Device) -> Arc<ErrorLog> {
    let log = Arc::new(ErrorLog::default());
    let sink = log.clone();
    device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
        // Called on the thread whose call raised the error: `current` is who raised it.
        sink.push(current(), e.to_string());
    }));
    let sink = log.clone();
    device.set_device_lost_callback(move |reason, message| {
        sink.lose(match message.trim() {
            "" => format!("{reason:?}"),
            m => format!("{reason:?}: {m}"),
        });
    });
    log
}

/// `f()`, or the message of the panic it raised: for wgpu calls that panic on a device error
/// instead of returning it (`Device::poll`). wgpu raises that panic after its own call
/// returned, holding none of its locks, so nothing is left half-done by catching it.
pub(crate) fn guarded<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|p| {
        p.downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "a panic without a message".into())
    })
}

/// How a wait for the device ended.
pub(crate) enum Waited {
    Idle,
    /// wgpu returned an error (a timeout): the device may still be usable.
    Failed(String),
    /// wgpu panicked on a device error (the device lost, out of memory): the device is lost.
    Lost(String),
}

/// Waits until `device` is idle.
pub(crate) fn wait_idle(device: &wgpu::Device) -> Waited {
    match guarded(|| device.poll(wgpu::PollType::wait_indefinitely())) {
        Ok(Ok(_)) => Waited::Idle,
        Ok(Err(e)) => Waited::Failed(e.to_string()),
        Err(panic) => Waited::Lost(panic.trim().to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Origin = Origin {
        instance: 1,
        op: "matmul",
    };
    const B: Origin = Origin {
        instance: 2,
        op: "download",
    };

    #[test]
    fn an_error_goes_to_the_instance_that_raised_it() {
        let log = ErrorLog::default();
        log.push(Some(A), "bad binding".into());
        assert!(log.take_for(Some(B.instance), "wgpu:0").is_empty());
        let got = log.take_for(Some(A.instance), "wgpu:0");
        assert_eq!(got, ["bad binding (raised by matmul of wgpu:0#1)"]);
        assert!(log.take_for(Some(A.instance), "wgpu:0").is_empty());
        // Raised outside any op: the next to look hears of it.
        log.push(None, "stray".into());
        assert_eq!(log.take_for(Some(B.instance), "wgpu:0").len(), 1);
    }

    #[test]
    fn a_rejected_submission_tells_every_instance_whose_work_it_held() {
        let log = ErrorLog::default();
        let other = Origin { op: "scale", ..A };
        log.rejected(&[Some(A), Some(other), Some(B)], "usage conflict");
        let a = log.take_for(Some(A.instance), "wgpu:0");
        assert_eq!(a.len(), 1, "{a:?}");
        assert!(
            a[0].contains("matmul, scale") && a[0].contains("usage conflict"),
            "{a:?}"
        );
        let b = log.take_for(Some(B.instance), "wgpu:0");
        assert!(b.len() == 1 && b[0].contains("download"), "{b:?}");
        assert!(log.take_for(None, "wgpu:0").is_empty());
    }

    #[test]
    fn forgetting_an_instance_leaves_the_others_errors() {
        let log = ErrorLog::default();
        log.push(Some(A), "a".into());
        log.push(Some(B), "b".into());
        assert_eq!(log.forget(A.instance, "wgpu:0").len(), 1);
        assert!(log.take_for(Some(A.instance), "wgpu:0").is_empty());
        assert_eq!(log.take_for(Some(B.instance), "wgpu:0").len(), 1);
    }

    #[test]
    fn the_first_loss_is_kept() {
        let log = ErrorLog::default();
        assert_eq!(log.lost(), None);
        log.lose("Destroyed: ".into());
        log.lose("Unknown: later".into());
        assert_eq!(log.lost().as_deref(), Some("Destroyed: "));
    }

    #[test]
    fn the_origin_is_restored_when_a_call_returns() {
        assert_eq!(current(), None);
        {
            let _a = enter(A);
            {
                let _b = enter(B);
                assert_eq!(current(), Some(B));
            }
            assert_eq!(current(), Some(A));
        }
        assert_eq!(current(), None);
    }

    /// wgpu's `handle_error_fatal` panics with a formatted `String`.
    #[test]
    fn a_panic_in_a_guarded_call_is_an_error_with_its_message() {
        let r: Result<(), String> = guarded(|| panic!("Error in Device::poll: {}", "Lost"));
        assert_eq!(r, Err("Error in Device::poll: Lost".to_string()));
        assert_eq!(guarded(|| 7), Ok(7));
    }
}
