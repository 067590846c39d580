//! Worker loops. Every blocking call uses a short timeout so that an abort (another
//! worker's error) is noticed promptly; a stall longer than the configured timeout is itself
//! an error naming the side that stalled.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use dflash_core::pipeline::{HiddenBatch, HiddenSeq, SeqMeta, Target};
use dflash_data::{Dataset, MaskTokenInData, SkipCounts, TooLongPolicy, validate};
use dflash_queue::{BoundedQueue, Queue, QueueError};

use crate::error::{PipelineError, Result};
use crate::phases::{Phase, PhaseClock};

const POLL: Duration = Duration::from_millis(100);

/// One micro-batch to featurise.
#[derive(Debug, Clone)]
pub struct WorkItem {
    pub epoch: u64,
    pub step: u64,
    pub micro: u32,
    pub samples: Vec<usize>,
}

/// What a run calls once on its first failure, with the failure's cause chain.
pub type OnAbort = Box<dyn Fn(&str) + Send + Sync>;

/// State shared by all workers of a run.
pub struct Shared {
    pub abort: AtomicBool,
    pub first_error: Mutex<Option<PipelineError>>,
    pub work: BoundedQueue<WorkItem>,
    /// One features queue per drafter replica.
    pub features: Vec<BoundedQueue<HiddenBatch>>,
    pub skips: Mutex<StepSkips>,
    pub stall_timeout: Duration,
    /// Called once on the first failure with its cause chain (aborts the all-reduce group).
    pub on_abort: OnAbort,
    /// Where each target worker's time goes.
    pub target_clocks: Vec<PhaseClock>,
    /// Where each drafter replica's time goes.
    pub drafter_clocks: Vec<PhaseClock>,
    /// When the workers started, for busy fractions.
    pub started: Instant,
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
    /// Fraction of wall time each target worker was busy (every phase but waiting).
    pub target_busy: Vec<f64>,
    /// Fraction of wall time each drafter replica was busy (every phase but waiting for
    /// features; waiting for peers in the all-reduce counts, as part of the step).
    pub drafter_busy: Vec<f64>,
    /// Seconds per phase of each target worker so far.
    pub target_phases_s: Vec<BTreeMap<&'static str, f64>>,
    /// Seconds per phase of each drafter replica so far.
    pub drafter_phases_s: Vec<BTreeMap<&'static str, f64>>,
}

impl Shared {
    pub fn gauges(&self) -> Gauges {
        let wall = self.started.elapsed().as_secs_f64().max(1e-9);
        let frac = |v: &[PhaseClock]| v.iter().map(|c| c.busy_secs() / wall).collect();
        let phases = |v: &[PhaseClock]| v.iter().map(PhaseClock::seconds).collect();
        let stats: Vec<_> = self.features.iter().map(|q| q.stats()).collect();
        Gauges {
            queue_depths: stats.iter().map(|s| s.depth).collect(),
            producer_stall_s: stats.iter().map(|s| s.push_wait.as_secs_f64()).sum(),
            consumer_starved_s: stats.iter().map(|s| s.pop_wait.as_secs_f64()).sum(),
            target_busy: frac(&self.target_clocks),
            drafter_busy: frac(&self.drafter_clocks),
            target_phases_s: phases(&self.target_clocks),
            drafter_phases_s: phases(&self.drafter_clocks),
        }
    }

    /// Records the first error and stops everyone.
    pub fn fail(&self, e: PipelineError) {
        let why = crate::error::cause_chain(&e);
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
            (self.on_abort)(&why);
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

    /// Pops with short timeouts; `Ok(None)` once the queue is closed and drained. After an
    /// abort it hands out nothing: a closed queue still holds items, and a target worker
    /// given one would run a whole target forward whose features nobody takes.
    pub fn pop_patiently<T: Send>(&self, q: &BoundedQueue<T>, who: &str) -> Result<Option<T>> {
        let since = Instant::now();
        loop {
            if self.aborted() {
                return Err(PipelineError::Job(format!("{who}: stopped (run aborted)")));
            }
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
    /// The target's `max_position_embeddings`: longer kept samples are skipped and counted.
    pub max_positions: usize,
    /// The drafter's mask token id: kept samples holding it are counted (a warning, logged
    /// once); `None` checks nothing.
    pub mask_token_id: Option<u32>,
}

/// The skip counts of a run's work items by step. The target workers run ahead of the
/// drafter, so a checkpoint at step `n` takes the counts of the steps before `n` only
/// ([`StepSkips::before`]): a run resumed there then counts each step once, as an
/// uninterrupted run does.
#[derive(Debug, Default)]
pub struct StepSkips {
    by_step: BTreeMap<u64, SkipCounts>,
    /// Whether the mask-token warning was printed (once per invocation).
    mask_warned: bool,
}

impl StepSkips {
    /// Adds the counts of one work item of `step`; warns the first time a kept sample holds
    /// the mask token id.
    pub fn add(&mut self, step: u64, counts: &SkipCounts) {
        self.by_step.entry(step).or_default().merge(counts);
        if let Some(m) = counts.first_mask_token
            && !std::mem::replace(&mut self.mask_warned, true)
        {
            warn_mask_token(&m, "train");
        }
    }

    /// The counts of the steps before `end` that this invocation ran.
    pub fn before(&self, end: u64) -> SkipCounts {
        let mut all = SkipCounts::default();
        for c in self.by_step.range(..end).map(|(_, c)| c) {
            all.merge(c);
        }
        all
    }
}

/// The warning for a kept sample holding the mask token id; `what` names the data (`train`
/// or `eval`).
pub fn warn_mask_token(m: &MaskTokenInData, what: &str) {
    let effect = match what {
        "train" => "it trains, but the drafter cannot tell it from a masked position",
        _ => "it is measured, but the drafter cannot tell it from a masked position",
    };
    eprintln!(
        "warning: {what} sample {} holds the mask token id {} (position {}): {effect}; pick an \
         unused id with drafter.mask_token_id (counted in the data line at the end)",
        m.sample, m.id, m.position
    );
}

/// Loads and validates sample `i` into `counts`; `None` when it is skipped.
pub fn load_sample(
    data: &dyn Dataset,
    i: usize,
    rules: &SampleRules,
    counts: &mut SkipCounts,
) -> Option<SeqMeta> {
    let sample = match data.get(i) {
        Ok(s) => s,
        Err(e) => {
            // A corrupt record is counted and skipped; the file-level errors surface at open.
            counts.record_error(i as u64, &e);
            return None;
        }
    };
    let verdict = validate(
        sample,
        rules.vocab_size,
        rules.max_len,
        rules.min_supervised,
        rules.too_long,
    )
    .within_positions(rules.max_positions);
    counts.record(&verdict);
    let sample = verdict.into_sample()?;
    if let Some(mask) = rules.mask_token_id {
        counts.record_mask_token(&sample, mask);
    }
    Some(SeqMeta {
        sample_id: sample.id,
        ids: sample.ids,
        loss_mask: sample.loss_mask,
    })
}

/// Loads, validates and featurises sample `i` on its own; `None` when it is skipped
/// (evaluation sets, which keep one tensor per sequence).
pub fn featurise(
    target: &dyn Target,
    data: &dyn Dataset,
    i: usize,
    rules: &SampleRules,
    counts: &mut SkipCounts,
) -> Result<Option<HiddenSeq>> {
    let Some(meta) = load_sample(data, i, rules, counts) else {
        return Ok(None);
    };
    let features = target.features(&meta.ids)?;
    Ok(Some(HiddenSeq {
        sample_id: meta.sample_id,
        ids: meta.ids,
        loss_mask: meta.loss_mask,
        features,
    }))
}

/// The samples of one work item, validated (counted into `skips` under the item's step)
/// and run through the target as one packed forward.
pub fn featurise_packed(
    target: &dyn Target,
    data: &dyn Dataset,
    item: &WorkItem,
    rules: &SampleRules,
    skips: &Mutex<StepSkips>,
) -> Result<HiddenBatch> {
    let mut counts = SkipCounts::default();
    let seqs: Vec<SeqMeta> = item
        .samples
        .iter()
        .filter_map(|&i| load_sample(data, i, rules, &mut counts))
        .collect();
    // Counted before the batch is sent: once a step is done, its counts are all in.
    skips
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .add(item.step, &counts);
    let features = if seqs.is_empty() {
        None
    } else {
        let docs: Vec<&[u32]> = seqs.iter().map(|s| s.ids.as_slice()).collect();
        Some(target.features_packed(&docs)?)
    };
    Ok(HiddenBatch {
        epoch: item.epoch,
        step: item.step,
        micro: item.micro,
        seqs,
        features,
    })
}

/// A target worker: work items in, packed feature batches out to queue `micro % Q` (one
/// queue per replica with fixed routing, one shared queue with least-loaded routing).
pub fn target_worker(
    index: usize,
    shared: &Shared,
    target: &dyn Target,
    data: &dyn Dataset,
    rules: SampleRules,
) -> Result<()> {
    let name = format!("target worker {index}");
    let queues = shared.features.len();
    let clock = &shared.target_clocks[index];
    let mut mark = Instant::now();
    while let Some(item) = shared.pop_patiently(&shared.work, &name)? {
        clock.lap(Phase::WaitWork, &mut mark);
        dflash_models::fault::fail_point(&format!("target-batch:{index}"))
            .map_err(PipelineError::Job)?;
        let batch = featurise_packed(target, data, &item, &rules, &shared.skips)?;
        clock.lap(Phase::TargetForward, &mut mark);
        shared.push_patiently(&shared.features[item.micro as usize % queues], batch, &name)?;
        clock.lap(Phase::PushWait, &mut mark);
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

/// Least-loaded routing (`pipeline.routing = "least-loaded"`): the micro-batches of a step,
/// from one queue all replicas share, to whichever replica asks first; a replica's step ends
/// when every micro-batch of the step is taken. The sum of the step's gradients is the same
/// whoever took what (up to float rounding: the replicas' partial sums group differently).
#[derive(Default)]
pub struct SharedRouter {
    state: Mutex<RouterState>,
}

#[derive(Default)]
struct RouterState {
    /// Batches that arrived, by step, not yet taken.
    stash: BTreeMap<u64, Vec<HiddenBatch>>,
    /// Micro-batches of each step taken so far.
    taken: BTreeMap<u64, usize>,
}

impl SharedRouter {
    /// The next micro-batch of `step` (of `count`), or `None` once all are taken.
    pub fn next(
        &self,
        shared: &Shared,
        q: &BoundedQueue<HiddenBatch>,
        (step, count): (u64, usize),
        who: &str,
    ) -> Result<Option<HiddenBatch>> {
        // Held while popping: the others would wait on the same queue anyway, and the pop
        // gives up on an abort or a stall.
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let taken = s.taken.get(&step).copied().unwrap_or(0);
            if taken >= count {
                return Ok(None);
            }
            if let Some(b) = s.stash.get_mut(&step).and_then(Vec::pop) {
                s.taken.insert(step, taken + 1);
                return Ok(Some(b));
            }
            match shared.pop_patiently(q, who)? {
                Some(b) => s.stash.entry(b.step).or_default().push(b),
                None => {
                    return Err(PipelineError::Job(format!(
                        "{who}: feature queue closed before step {step} had all {count} \
                         micro-batches"
                    )));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use dflash_core::pipeline::Features;
    use dflash_data::{DataError, Sample};

    use super::*;

    /// A target that counts its forwards and has nothing to give.
    struct CountingTarget(AtomicUsize);

    impl Target for CountingTarget {
        fn hidden_size(&self) -> usize {
            4
        }
        fn vocab_size(&self) -> usize {
            16
        }
        fn layer_ids(&self) -> &[usize] {
            &[0]
        }
        fn features_packed(&self, _: &[&[u32]]) -> dflash_core::Result<Features> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Err(dflash_core::Error::Op {
                op: "features_packed",
                device: "test".into(),
                detail: "no features here".into(),
            })
        }
    }

    struct Fixed;

    impl Dataset for Fixed {
        fn len(&self) -> usize {
            4
        }
        fn get(&self, i: usize) -> std::result::Result<Sample, DataError> {
            Ok(Sample {
                id: i as u64,
                ids: vec![1, 2, 3, 4, 5, 6],
                loss_mask: vec![0, 1, 1, 1, 1, 1],
            })
        }
        fn name(&self) -> &str {
            "fixed"
        }
        fn seq_len(&self, _: usize) -> usize {
            6
        }
    }

    fn shared() -> Shared {
        Shared {
            abort: AtomicBool::new(false),
            first_error: Mutex::new(None),
            work: BoundedQueue::new("work", 4),
            features: vec![BoundedQueue::new("features[0]", 4)],
            skips: Mutex::new(StepSkips::default()),
            stall_timeout: Duration::from_secs(5),
            on_abort: Box::new(|_| {}),
            target_clocks: vec![PhaseClock::target()],
            drafter_clocks: vec![PhaseClock::drafter()],
            started: Instant::now(),
        }
    }

    /// Work items still queued when the run aborts are not featurised: the closed work
    /// queue still holds them, and each would cost a full target forward.
    #[test]
    fn a_target_worker_runs_no_forward_after_an_abort() {
        let shared = shared();
        for step in 0..2 {
            let item = WorkItem {
                epoch: 0,
                step,
                micro: 0,
                samples: vec![0, 1],
            };
            shared.work.push(item, POLL).map_err(|(_, e)| e).unwrap();
        }
        shared.fail(PipelineError::Job("another worker failed".into()));
        let target = CountingTarget(AtomicUsize::new(0));
        let rules = SampleRules {
            vocab_size: 16,
            max_len: 64,
            min_supervised: 1,
            too_long: TooLongPolicy::Truncate,
            max_positions: 64,
            mask_token_id: None,
        };
        let e = target_worker(0, &shared, &target, &Fixed, rules).unwrap_err();
        assert!(e.to_string().contains("run aborted"), "{e}");
        assert_eq!(target.0.load(Ordering::SeqCst), 0, "target forwards run");
    }
}
