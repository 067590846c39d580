//! Per-step reporting: a plain log line every `log_every` steps (always — indicatif draws
//! nothing without a terminal), a progress bar when stderr is a terminal, and one JSON line
//! per step in `RUN_DIR/metrics.jsonl`.

use std::fs::File;
use std::io::{IsTerminal, Write};
use std::path::Path;
use std::time::Instant;

use dflash_training::StepSummary;

use crate::error::{PipelineError, Result};
use crate::workers::Gauges;

#[derive(Debug, Clone, serde::Serialize)]
pub struct StepRecord {
    pub step: u64,
    /// Steps in the run's schedule (its last step is `total_steps - 1`): a summary of fewer
    /// is an invocation that stopped early (`train.stop_at_step`), not the run's end.
    pub total_steps: u64,
    pub epoch: u64,
    pub loss: f64,
    pub accuracy: f64,
    pub lr: f64,
    pub grad_norm: f64,
    pub applied: bool,
    /// Tokens the schedule gave the step: every sample it holds at its length cut to
    /// `data.max_len`, including those the target workers then skip (`data.too_long =
    /// "skip"`, ids out of the vocabulary, too few supervised tokens), whose count is only
    /// known once they are read. A measure of the data moved through, not of the tokens the
    /// drafter trained on; the skips are counted in the run's data line and `summary.json`.
    pub tokens: u64,
    /// Scheduled tokens (`tokens`) per second since the workers started.
    pub tokens_per_s: f64,
    /// Seconds since the workers started.
    pub elapsed_s: f64,
    /// Seconds since the job started (loading the target and the drafter included).
    pub job_s: f64,
    /// Queue depths, stalls and per-worker busy fractions at the end of the step.
    #[serde(flatten)]
    pub gauges: Gauges,
}

pub struct Reporter {
    metrics: File,
    bar: Option<indicatif::ProgressBar>,
    start: Instant,
    job_start: Instant,
    tokens_since_start: u64,
    total_steps: u64,
    start_step: u64,
    log_every: u64,
}

impl Reporter {
    pub fn new(
        run_dir: &Path,
        job_start: Instant,
        start_step: u64,
        total_steps: u64,
        log_every: u64,
    ) -> Result<Self> {
        let path = run_dir.join("metrics.jsonl");
        // A resumed run repeats the steps between its checkpoint and the failure: keep only
        // the records of steps before `start_step`, so each step has exactly one record.
        if let Ok(text) = std::fs::read_to_string(&path) {
            let kept: String = text
                .lines()
                .filter(|l| {
                    serde_json::from_str::<serde_json::Value>(l)
                        .ok()
                        .and_then(|v| v.get("step").and_then(serde_json::Value::as_u64))
                        .is_some_and(|s| s < start_step)
                })
                .map(|l| format!("{l}\n"))
                .collect();
            if kept.len() != text.len() {
                dflash_models::safetensors_io::write_atomic(&path, kept.as_bytes())?;
            }
        }
        let metrics = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(PipelineError::io(&path))?;
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = indicatif::ProgressBar::new(total_steps);
            bar.set_position(start_step);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{bar:30} {pos}/{len} steps  {msg}  eta {eta}",
                )
                .expect("valid template"),
            );
            bar
        });
        Ok(Reporter {
            metrics,
            bar,
            start: Instant::now(),
            job_start,
            tokens_since_start: 0,
            total_steps,
            start_step,
            log_every: log_every.max(1),
        })
    }

    pub fn step(
        &mut self,
        s: &StepSummary,
        epoch: u64,
        tokens: u64,
        gauges: Gauges,
    ) -> Result<StepRecord> {
        self.tokens_since_start += tokens;
        let elapsed = self.start.elapsed().as_secs_f64();
        let rec = StepRecord {
            step: s.step,
            total_steps: self.total_steps,
            epoch,
            loss: s.stats.loss(),
            accuracy: s.stats.accuracy(),
            lr: s.lr,
            grad_norm: s.grad_norm,
            applied: s.applied,
            tokens,
            tokens_per_s: self.tokens_since_start as f64 / elapsed.max(1e-9),
            elapsed_s: elapsed,
            job_s: self.job_start.elapsed().as_secs_f64(),
            gauges,
        };
        let line = serde_json::to_string(&rec).expect("record serialises");
        writeln!(self.metrics, "{line}").map_err(PipelineError::io("metrics.jsonl"))?;
        let msg = format!(
            "loss {:.4} acc {:.3} lr {:.2e} {:.0} tok/s",
            rec.loss, rec.accuracy, rec.lr, rec.tokens_per_s
        );
        if let Some(bar) = &self.bar {
            bar.set_position(s.step + 1);
            bar.set_message(msg.clone());
        }
        let n = s.step + 1;
        if n.is_multiple_of(self.log_every) || n == self.total_steps {
            let done = (n - self.start_step).max(1) as f64;
            let eta = elapsed / done * (self.total_steps - n) as f64;
            let line = format!(
                "step {n}/{} | {msg} | grad_norm {:.3}{} | queues {:?} | elapsed {:.0}s eta {eta:.0}s",
                self.total_steps,
                rec.grad_norm,
                skip_note(s),
                rec.gauges.queue_depths,
                elapsed
            );
            self.log(&line);
        }
        Ok(rec)
    }

    /// A log line that does not tear the progress bar (plain stderr without a terminal).
    pub fn log(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.println(line),
            None => eprintln!("{line}"),
        }
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// Why a step changed no weight, for its log line; empty for a step that did.
fn skip_note(s: &StepSummary) -> &'static str {
    match (s.applied, s.stats.weight_sum > 0.0) {
        (true, _) => "",
        // All its samples skipped, or no supervised token after an anchor: nothing to learn
        // from, and nothing went wrong.
        (false, false) => " (skipped: no supervised tokens)",
        (false, true) => " (skipped: non-finite)",
    }
}

#[cfg(test)]
mod tests {
    use dflash_core::LossStats;

    use super::*;

    #[test]
    fn a_step_without_supervised_tokens_is_not_called_non_finite() {
        let summary = |applied: bool, weighted_loss: f64, weight_sum: f64| StepSummary {
            step: 3,
            stats: LossStats {
                weighted_loss,
                weight_sum,
                ..LossStats::default()
            },
            grad_norm: 0.0,
            lr: 1e-3,
            applied,
        };
        assert_eq!(skip_note(&summary(true, 2.0, 1.0)), "");
        assert_eq!(
            skip_note(&summary(false, 0.0, 0.0)),
            " (skipped: no supervised tokens)"
        );
        assert_eq!(
            skip_note(&summary(false, f64::NAN, 1.0)),
            " (skipped: non-finite)"
        );
    }
}
