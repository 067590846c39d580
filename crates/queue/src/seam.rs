//! The queue seam of the pipeline: what target workers push into and drafter replicas pop
//! from, whatever the queue's implementation.

use std::time::Duration;

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct QueueStats {
    pub depth: usize,
    pub capacity: usize,
    pub pushed: u64,
    pub popped: u64,
    /// Total time producers spent blocked on a full queue.
    pub push_wait: Duration,
    /// Total time consumers spent blocked on an empty queue.
    pub pop_wait: Duration,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum QueueError {
    #[error("queue {0:?} timed out")]
    Timeout(String),
    #[error("queue {0:?} is closed")]
    Closed(String),
}

/// A bounded, closable, blocking queue with timeouts and counters.
pub trait Queue<T: Send>: Send + Sync {
    /// Blocks while full; gives the item back on timeout or close.
    fn push(&self, item: T, timeout: Duration) -> Result<(), (T, QueueError)>;
    /// Blocks while empty; `Closed` once closed *and* drained.
    fn pop(&self, timeout: Duration) -> Result<T, QueueError>;
    fn close(&self);
    fn stats(&self) -> QueueStats;
}
