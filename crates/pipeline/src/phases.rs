//! Where each worker's time goes. Every worker owns one [`PhaseClock`]; its loop charges each
//! stretch of wall time to exactly one phase, so the phases of a worker add up to its wall
//! time, `busy` is the sum of its working (non-waiting) phases, and the bottleneck can be
//! read off `metrics.jsonl` and `dflash status` instead of guessed.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// A phase of a target worker or a drafter replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Target: waiting for the loader's next work item.
    WaitWork,
    /// Target: reading and validating samples, then the packed target forward.
    TargetForward,
    /// Target: blocked on a full feature queue (the drafters are behind).
    PushWait,
    /// Drafter: waiting for features (the targets are behind).
    QueueWait,
    /// Drafter: anchors, labels and weights of a micro-batch (host work).
    Prepare,
    /// Drafter: forward and backward of a micro-batch, to the device having finished.
    ForwardBackward,
    /// Drafter: summing gradients across replicas, waiting for peers included.
    AllReduce,
    /// Drafter: grad norm, clipping, AdamW.
    Optimizer,
    /// Drafter: writing a checkpoint.
    Checkpoint,
    /// Drafter: metrics, log lines.
    Report,
}

impl Phase {
    pub const TARGET: [Phase; 3] = [Phase::WaitWork, Phase::TargetForward, Phase::PushWait];
    pub const DRAFTER: [Phase; 7] = [
        Phase::QueueWait,
        Phase::Prepare,
        Phase::ForwardBackward,
        Phase::AllReduce,
        Phase::Optimizer,
        Phase::Checkpoint,
        Phase::Report,
    ];

    const COUNT: usize = 10;

    pub fn name(self) -> &'static str {
        match self {
            Phase::WaitWork => "wait_work",
            Phase::TargetForward => "target_forward",
            Phase::PushWait => "push_wait",
            Phase::QueueWait => "queue_wait",
            Phase::Prepare => "prepare",
            Phase::ForwardBackward => "forward_backward",
            Phase::AllReduce => "all_reduce",
            Phase::Optimizer => "optimizer",
            Phase::Checkpoint => "checkpoint",
            Phase::Report => "report",
        }
    }

    /// Waiting on another worker, not working.
    pub fn is_wait(self) -> bool {
        matches!(self, Phase::WaitWork | Phase::PushWait | Phase::QueueWait)
    }
}

/// Nanoseconds per phase of one worker.
#[derive(Debug)]
pub struct PhaseClock {
    /// The phases this worker reports.
    phases: &'static [Phase],
    /// Indexed by `Phase as usize`.
    nanos: [AtomicU64; Phase::COUNT],
}

impl PhaseClock {
    pub fn target() -> Self {
        Self::new(&Phase::TARGET)
    }
    pub fn drafter() -> Self {
        Self::new(&Phase::DRAFTER)
    }
    fn new(phases: &'static [Phase]) -> Self {
        PhaseClock {
            phases,
            nanos: Default::default(),
        }
    }

    fn slot(&self, p: Phase) -> &AtomicU64 {
        &self.nanos[p as usize]
    }

    /// Charges the seconds given to phase `p`.
    pub fn add_secs(&self, p: Phase, secs: f64) {
        self.slot(p)
            .fetch_add((secs.max(0.0) * 1e9) as u64, Ordering::Relaxed);
    }

    /// Charges the time since `*mark` to phase `p` and moves the mark to now.
    pub fn lap(&self, p: Phase, mark: &mut Instant) {
        let now = Instant::now();
        self.slot(p)
            .fetch_add((now - *mark).as_nanos() as u64, Ordering::Relaxed);
        *mark = now;
    }

    /// Seconds per phase, by name.
    pub fn seconds(&self) -> BTreeMap<&'static str, f64> {
        self.phases
            .iter()
            .map(|&p| (p.name(), self.slot(p).load(Ordering::Relaxed) as f64 / 1e9))
            .collect()
    }

    /// Seconds of working phases.
    pub fn busy_secs(&self) -> f64 {
        self.phases
            .iter()
            .filter(|p| !p.is_wait())
            .map(|&p| self.slot(p).load(Ordering::Relaxed) as f64 / 1e9)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn laps_add_up_and_waits_are_not_busy() {
        let c = PhaseClock::drafter();
        c.add_secs(Phase::QueueWait, 2.0);
        c.add_secs(Phase::ForwardBackward, 3.0);
        c.add_secs(Phase::Optimizer, 0.5);
        let mut mark = Instant::now() - std::time::Duration::from_millis(5);
        c.lap(Phase::Report, &mut mark);
        let s = c.seconds();
        assert_eq!(s["queue_wait"], 2.0);
        assert_eq!(s["forward_backward"], 3.0);
        assert!(s["report"] >= 0.005);
        assert!((c.busy_secs() - 3.5 - s["report"]).abs() < 1e-9);
        assert_eq!(s.len(), Phase::DRAFTER.len());
        assert!(mark.elapsed().as_secs_f64() < 1.0);
    }
}
