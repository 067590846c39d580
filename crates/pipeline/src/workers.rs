//! Worker loops. Every blocking call uses a short timeout so that an abort (another
//! worker's error) is noticed promptly; a stall longer than the configured timeout is itself
//! an error naming the side that stalled.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dflash_core::pipeline::{HiddenBatch, HiddenSeq, Target};
use dflash_data::{Dataset, SkipCounts, TooLongPolicy, validate};
use dflash_queue::{BoundedQueue, Queue, QueueError};

use crate::error::{PipelineError, Result};

const POLL: Duration = Duration::from_millis(100);

/// One micro-batch to featurise.
#[derive(Debug, Clone)]
pub struct WorkItem {
    pub epoch: u64,
    pub step: u64,
    pub micro: u32,
    pub samples: Vec<usize>,
}

/// State shared by all workers of a run.
pub struct Shared {
    pub abort: AtomicBool,
    pub first_error: Mutex<Option<PipelineError>>,
    pub work: BoundedQueue<WorkItem>,
    /// One features queue per drafter replica.
    pub features: Vec<BoundedQueue<HiddenBatch>>,
    pub skips: Mutex<SkipCounts>,
    pub stall_timeout: Duration,
    /// Called once on the first failure (aborts the all-reduce group).
    pub on_abort: Box<dyn Fn() + Send + Sync>,
    /// Nanoseconds each target worker spent working (not waiting on queues).
    pub target_busy: Vec<AtomicU64>,
    /// Nanoseconds each drafter replica spent working (not waiting on queues or peers).
    pub drafter_busy: Vec<AtomicU64>,
    /// When the workers started, for busy fractions.
    pub started: Instant,
}

/// Adds the time since `since` to a busy counter.
pub fn add_busy(counter: &AtomicU64, since: Instant) {
    counter.fetch_add(since.elapsed().as_nanos() as u64, Ordering::Relaxed);
}

/// Live gauges of the pipeline, reported with every step.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Gauges {
    /// Depth of each replica's feature queue.
    pub queue_depths: Vec<usize>,
    /// Seconds the target workers spent blocked on full feature queues so far (drafters are
    /// the bottleneck when this grows).
    pub producer_stall_s: f64,
    /// Seconds the drafter replicas spent waiting on empty queues so far (targets are the
    /// bottleneck when this grows).
    pub consumer_starved_s: f64,
    /// Fraction of wall time each target worker was busy.
    pub target_busy: Vec<f64>,
    /// Fraction of wall time each drafter replica was busy (its all-reduce waits excluded).
    pub drafter_busy: Vec<f64>,
}

impl Shared {
    pub fn gauges(&self) -> Gauges {
        let wall = self.started.elapsed().as_nanos().max(1) as f64;
        let frac = |v: &[AtomicU64]| {
            v.iter()
                .map(|c| c.load(Ordering::Relaxed) as f64 / wall)
                .collect()
        };
        let stats: Vec<_> = self.features.iter().map(|q| q.stats()).collect();
        Gauges {
            queue_depths: stats.iter().map(|s| s.depth).collect(),
            producer_stall_s: stats.iter().map(|s| s.push_wait.as_secs_f64()).sum(),
            consumer_starved_s: stats.iter().map(|s| s.pop_wait.as_secs_f64()).sum(),
            target_busy: frac(&self.target_busy),
            drafter_busy: frac(&self.drafter_busy),
        }
    }

    /// Records the first error and stops everyone.
    pub fn fail(&self, e: PipelineError) {
        let mut first = self.first_error.lock().unwrap_or_else(|p| p.into_inner());
        if first.is_none() {
            *first = Some(e);
        }
        drop(first);
        if !self.abort.swap(true, Ordering::SeqCst) {
            self.work.close();
            for q in &self.features {
                q.close();
            }
            (self.on_abort)();
        }
    }

    pub fn aborted(&self) -> bool {
        self.abort.load(Ordering::SeqCst)
    }

    /// Pushes with short timeouts until accepted, aborted or stalled for too long.
    pub fn push_patiently<T: Send>(
        &self,
        q: &BoundedQueue<T>,
        mut item: T,
        who: &str,
    ) -> Result<()> {
        let since = Instant::now();
        loop {
            match q.push(item, POLL) {
                Ok(()) => return Ok(()),
                Err((back, QueueError::Timeout(_))) => {
                    if self.aborted() {
                        return Err(PipelineError::Job(format!("{who}: stopped (run aborted)")));
                    }
                    if since.elapsed() > self.stall_timeout {
                        return Err(PipelineError::Job(format!(
                            "{who}: queue full for {:?}; the consumer has stopped making progress",
                            self.stall_timeout
                        )));
                    }
                    item = back;
                }
                Err((_, e)) => return Err(PipelineError::Job(format!("{who}: {e}"))),
            }
        }
    }

    /// Pops with short timeouts; `Ok(None)` once the queue is closed and drained.
    pub fn pop_patiently<T: Send>(&self, q: &BoundedQueue<T>, who: &str) -> Result<Option<T>> {
        let since = Instant::now();
        loop {
            match q.pop(POLL) {
                Ok(item) => return Ok(Some(item)),
                Err(QueueError::Closed(_)) => return Ok(None),
                Err(QueueError::Timeout(_)) => {
                    if self.aborted() {
                        return Err(PipelineError::Job(format!("{who}: stopped (run aborted)")));
                    }
                    if since.elapsed() > self.stall_timeout {
                        return Err(PipelineError::Job(format!(
                            "{who}: no input for {:?}; the producer has stopped making progress",
                            self.stall_timeout
                        )));
                    }
                }
            }
        }
    }
}

/// How target workers vet samples.
#[derive(Debug, Clone, Copy)]
pub struct SampleRules {
    pub vocab_size: usize,
    pub max_len: usize,
    pub min_supervised: usize,
    pub too_long: TooLongPolicy,
}

/// Loads, validates and featurises sample `i`; `None` when it is skipped (counted).
pub fn featurise(
    target: &dyn Target,
    data: &dyn Dataset,
    i: usize,
    rules: &SampleRules,
    skips: &Mutex<SkipCounts>,
) -> Result<Option<HiddenSeq>> {
    let sample = match data.get(i) {
        Ok(s) => s,
        Err(e) => {
            // A corrupt record is counted and skipped; the file-level errors surface at open.
            skips
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .record_error(i as u64, &e);
            return Ok(None);
        }
    };
    let verdict = validate(
        sample,
        rules.vocab_size,
        rules.max_len,
        rules.min_supervised,
        rules.too_long,
    );
    skips
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .record(&verdict);
    let Some(sample) = verdict.into_sample() else {
        return Ok(None);
    };
    let features = target.features(&sample.ids)?;
    Ok(Some(HiddenSeq {
        sample_id: sample.id,
        ids: sample.ids,
        loss_mask: sample.loss_mask,
        features,
    }))
}

/// A target worker: work items in, feature batches out to replica `micro % D`.
pub fn target_worker(
    index: usize,
    shared: &Shared,
    target: &dyn Target,
    data: &dyn Dataset,
    rules: SampleRules,
) -> Result<()> {
    let name = format!("target worker {index}");
    let d = shared.features.len();
    while let Some(item) = shared.pop_patiently(&shared.work, &name)? {
        let t0 = Instant::now();
        let mut seqs = Vec::with_capacity(item.samples.len());
        for &i in &item.samples {
            if let Some(seq) = featurise(target, data, i, &rules, &shared.skips)? {
                seqs.push(seq);
            }
        }
        let batch = HiddenBatch {
            epoch: item.epoch,
            step: item.step,
            micro: item.micro,
            seqs,
        };
        add_busy(&shared.target_busy[index], t0);
        shared.push_patiently(&shared.features[item.micro as usize % d], batch, &name)?;
    }
    Ok(())
}

/// Delivers a replica's batches in (step, micro) order whatever order they arrive in.
pub struct Reorder {
    stash: BTreeMap<(u64, u32), HiddenBatch>,
}

impl Reorder {
    pub fn new() -> Self {
        Reorder {
            stash: BTreeMap::new(),
        }
    }

    pub fn next(
        &mut self,
        shared: &Shared,
        q: &BoundedQueue<HiddenBatch>,
        step: u64,
        micro: u32,
        who: &str,
    ) -> Result<HiddenBatch> {
        loop {
            if let Some(b) = self.stash.remove(&(step, micro)) {
                return Ok(b);
            }
            match shared.pop_patiently(q, who)? {
                Some(b) => {
                    self.stash.insert((b.step, b.micro), b);
                }
                None => {
                    return Err(PipelineError::Job(format!(
                        "{who}: feature queue closed before step {step} micro-batch {micro} arrived"
                    )));
                }
            }
        }
    }
}

impl Default for Reorder {
    fn default() -> Self {
        Self::new()
    }
}
