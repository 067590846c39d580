//! The seams of the training pipeline: what a target emits, what a queue carries, what a
//! drafter consumes. Concrete models live in `dflash-models`, queues in `dflash-queue`.

use std::time::Duration;

/// One sequence's target features, ready for the drafter.
#[derive(Debug, Clone, PartialEq)]
pub struct HiddenSeq {
    /// Stable id of the sample in the dataset (anchor sampling is seeded by it).
    pub sample_id: u64,
    /// `(S)` token ids.
    pub ids: Vec<u32>,
    /// `(S)` 1 where the token is supervised (assistant tokens).
    pub loss_mask: Vec<u8>,
    /// `(S, k*H)`: the k chosen target layers' outputs, concatenated per token in
    /// `target_layer_ids` order (the input of the drafter's `fc`).
    pub features: Vec<f32>,
}

/// A micro-batch of features tagged with its place in the schedule.
#[derive(Debug, Clone, PartialEq)]
pub struct HiddenBatch {
    pub epoch: u64,
    /// Optimizer step this micro-batch belongs to.
    pub step: u64,
    /// Index of the micro-batch within its step.
    pub micro: u32,
    pub seqs: Vec<HiddenSeq>,
}

impl HiddenBatch {
    pub fn tokens(&self) -> usize {
        self.seqs.iter().map(|s| s.ids.len()).sum()
    }
}

/// A frozen target that turns token ids into the chosen layers' features.
pub trait Target: Send + Sync {
    fn hidden_size(&self) -> usize;
    fn vocab_size(&self) -> usize;
    /// Target layer ids whose outputs are emitted, in order.
    fn layer_ids(&self) -> &[usize];
    /// `(S)` ids -> `(S, k*H)` features, running no layer past the deepest needed one.
    fn features(&self, ids: &[u32]) -> crate::Result<Vec<f32>>;
}

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
