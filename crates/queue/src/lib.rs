//! Bounded, closable, blocking queues for the training pipeline.
//!
//! [`BoundedQueue`] implements the [`Queue`] seam: a FIFO of at most `capacity`
//! items guarded by one `Mutex` and two `Condvar`s (`not_full` for producers, `not_empty` for
//! consumers). Both sides block with a timeout; a timed-out or refused push gives the item back.
//! After [`close`](Queue::close), pushes are refused at once, pops keep draining what is left and
//! report `Closed` only when the queue is empty.
//!
//! The counters say which side of the queue is the bottleneck: `push_wait` (time producers spent
//! blocked on a full queue: the consumers are too slow) and `pop_wait` (time consumers spent
//! blocked on an empty queue: the producers are too slow). Waits that end in a timeout count too.
//!
//! Share a queue between threads through an `Arc`.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

mod seam;

pub use seam::{Queue, QueueError, QueueStats};

/// A bounded multi-producer multi-consumer FIFO with timeouts, close and wait counters.
#[derive(Debug)]
pub struct BoundedQueue<T> {
    name: String,
    capacity: usize,
    state: Mutex<State<T>>,
    not_empty: Condvar,
    not_full: Condvar,
}

#[derive(Debug)]
struct State<T> {
    items: VecDeque<T>,
    closed: bool,
    pushed: u64,
    popped: u64,
    push_wait: Duration,
    pop_wait: Duration,
    high_water: usize,
}

/// Where a wait ends: `None` when the timeout is too large to be represented (waits forever).
fn deadline(timeout: Duration) -> Option<Instant> {
    Instant::now().checked_add(timeout)
}

impl<T> BoundedQueue<T> {
    /// A queue holding at most `capacity` items. `name` appears in errors and reports.
    /// A capacity of 0 is treated as 1 (a queue must be able to hold one item to move any).
    pub fn new(name: impl Into<String>, capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            name: name.into(),
            capacity,
            state: Mutex::new(State {
                items: VecDeque::with_capacity(capacity.min(1024)),
                closed: false,
                pushed: 0,
                popped: 0,
                push_wait: Duration::ZERO,
                pop_wait: Duration::ZERO,
                high_water: 0,
            }),
            not_empty: Condvar::new(),
            not_full: Condvar::new(),
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Items currently queued.
    pub fn len(&self) -> usize {
        self.lock().items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// The largest depth the queue has reached since it was created.
    pub fn high_water(&self) -> usize {
        self.lock().high_water
    }

    /// Pushes without blocking: gives the item back with `Timeout` when full, `Closed` when closed.
    pub fn try_push(&self, item: T) -> Result<(), (T, QueueError)> {
        self.push_impl(item, Duration::ZERO)
    }

    /// Pops without blocking: `Timeout` when empty (and open), `Closed` when closed and drained.
    pub fn try_pop(&self) -> Result<T, QueueError> {
        self.pop_impl(Duration::ZERO)
    }

    /// The lock is never held across user code that can panic, so a poisoned lock still guards
    /// consistent state: recover it rather than panic.
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Blocks on `cv` until `decide` settles the call (`Some`), or `timeout` passes
    /// (`Timeout`). Returns the still-held guard, the outcome, and the time spent waiting
    /// (zero when it never had to wait).
    fn wait_for<R>(
        &self,
        cv: &Condvar,
        timeout: Duration,
        mut decide: impl FnMut(&mut State<T>) -> Option<Result<R, QueueError>>,
    ) -> (MutexGuard<'_, State<T>>, Result<R, QueueError>, Duration) {
        let mut st = self.lock();
        let mut waited_since: Option<Instant> = None;
        let end = deadline(timeout);
        let result = loop {
            if let Some(r) = decide(&mut st) {
                break r;
            }
            let now = Instant::now();
            let left = match end {
                Some(end) if now >= end => break Err(QueueError::Timeout(self.name.clone())),
                Some(end) => end - now,
                None => Duration::MAX,
            };
            waited_since.get_or_insert(now);
            st = match end {
                Some(_) => {
                    cv.wait_timeout(st, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
                None => cv.wait(st).unwrap_or_else(|e| e.into_inner()),
            };
        };
        let waited = waited_since.map_or(Duration::ZERO, |t0| t0.elapsed());
        (st, result, waited)
    }

    fn push_impl(&self, item: T, timeout: Duration) -> Result<(), (T, QueueError)> {
        let (mut st, result, waited) = self.wait_for(&self.not_full, timeout, |st| {
            if st.closed {
                Some(Err(QueueError::Closed(self.name.clone())))
            } else if st.items.len() < self.capacity {
                Some(Ok(()))
            } else {
                None
            }
        });
        st.push_wait += waited;
        match result {
            Ok(()) => {
                st.items.push_back(item);
                st.pushed += 1;
                st.high_water = st.high_water.max(st.items.len());
                drop(st);
                self.not_empty.notify_one();
                Ok(())
            }
            Err(e) => Err((item, e)),
        }
    }

    fn pop_impl(&self, timeout: Duration) -> Result<T, QueueError> {
        let (mut st, result, waited) =
            self.wait_for(&self.not_empty, timeout, |st| match st.items.pop_front() {
                Some(item) => Some(Ok(item)),
                None if st.closed => Some(Err(QueueError::Closed(self.name.clone()))),
                None => None,
            });
        st.pop_wait += waited;
        if result.is_ok() {
            st.popped += 1;
            drop(st);
            self.not_full.notify_one();
        }
        result
    }
}

impl<T: Send> Queue<T> for BoundedQueue<T> {
    fn push(&self, item: T, timeout: Duration) -> Result<(), (T, QueueError)> {
        self.push_impl(item, timeout)
    }

    fn pop(&self, timeout: Duration) -> Result<T, QueueError> {
        self.pop_impl(timeout)
    }

    /// Refuses further pushes and wakes every waiter on both sides. Items already queued can
    /// still be popped. Closing twice is harmless.
    fn close(&self) {
        self.lock().closed = true;
        self.not_empty.notify_all();
        self.not_full.notify_all();
    }

    fn stats(&self) -> QueueStats {
        let st = self.lock();
        QueueStats {
            depth: st.items.len(),
            capacity: self.capacity,
            pushed: st.pushed,
            popped: st.popped,
            push_wait: st.push_wait,
            pop_wait: st.pop_wait,
        }
    }
}
