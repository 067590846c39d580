//! Resuming a run: the run's figures and skip counts carried by its checkpoint, a finished
//! run read back (resuming it changes nothing), and the data lines that tell this
//! invocation's counts from the run's.

use std::path::Path;

use dflash_data::SkipCounts;
use dflash_training::{DrafterReplica, state};

use super::TrainOutcome;
use super::checkpoint::{Figures, latest_checkpoint, tidy};
use super::plan::JobPlan;
use crate::error::{PipelineError, Result};

/// Where a resumed run stands, checked before anything is loaded. The outcome of a run that
/// has already finished (its latest checkpoint is at the end of the schedule and
/// `summary.json` records that step), read back, so resuming it says so and changes nothing.
/// `None` when there is work to do: steps to train, or only the finishing (drafter, tau,
/// summary) of a run stopped after its final checkpoint. An error when the checkpoint's step
/// lies beyond the schedule, or beyond this invocation's `train.stop_at_step`.
pub(super) fn finished_run(plan: &JobPlan, run_dir: &Path) -> Result<Option<TrainOutcome>> {
    let Some(ckpt) = latest_checkpoint(run_dir) else {
        return Ok(None);
    };
    let path = ckpt.join(state::TRAINER_STATE);
    let step = state::read_state(&ckpt)?.step;
    let total = plan.total_steps();
    if step > total {
        return Err(PipelineError::Job(format!(
            "{}: step {step} is beyond this run's schedule of {total} steps (train.max_steps, \
             train.epochs or the data changed since it was saved)",
            path.display()
        )));
    }
    if let Some(stop) = plan.cfg.train.stop_at_step
        && stop < step
    {
        // Nothing can be trained, and a summary of step `stop` would describe the
        // checkpoint's later weights.
        return Err(PipelineError::Job(format!(
            "train.stop_at_step = {stop} is before the step the run resumes at: {} holds step \
             {step}; leave train.stop_at_step out or set it to {step} or later",
            path.display()
        )));
    }
    if step < total {
        return Ok(None);
    }
    let summary = run_dir.join("summary.json");
    let recorded = std::fs::read_to_string(&summary)
        .ok()
        .and_then(|t| read_summary(&t, run_dir));
    match recorded {
        Some(outcome) if outcome.steps == total => {
            eprintln!(
                "{}: the run already finished (step {step} of {total}); nothing to do",
                run_dir.display()
            );
            Ok(Some(outcome))
        }
        // The summary is written last: one of an earlier step (a `train.stop_at_step`
        // invocation's), or none, means the invocation that trained the last step stopped
        // before saving the drafter it serves.
        _ => {
            eprintln!(
                "{}: the final checkpoint (step {total}) exists but {} does not record it: \
                 saving the drafter, measuring tau and writing the summary, without training",
                run_dir.display(),
                summary.display()
            );
            Ok(None)
        }
    }
}

/// The outcome `summary.json` (`text`) holds; `None` when it is not JSON or records no step
/// count. Its figures come back bit-identical (serde_json's `float_roundtrip`); a null figure
/// (NaN when written) is NaN again.
fn read_summary(text: &str, run_dir: &Path) -> Option<TrainOutcome> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    let f = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    Some(TrainOutcome {
        run_dir: run_dir.to_path_buf(),
        steps: v["steps"].as_u64()?,
        final_loss: f("final_loss"),
        final_accuracy: f("final_accuracy"),
        first_loss: f("first_loss"),
        tau_before: v["tau_before"].as_f64(),
        tau_after: v["tau_after"].as_f64(),
        skipped_samples: v["skipped_samples"].as_u64(),
        data: serde_json::from_value(v["data"].clone()).ok(),
        invocation_start_step: v["invocation_start_step"].as_u64().unwrap_or(0),
        invocation_skipped_samples: v["invocation_skipped_samples"].as_u64().unwrap_or(0),
        empty_rows: v["empty_rows"].as_u64().unwrap_or(0) as usize,
    })
}

/// Loads the latest checkpoint of `run_dir` into every replica; returns the run's figures
/// and skip counts it carries (`None`: a checkpoint that did not record them). `owner`: this
/// process writes the run's checkpoints (rank 0), so it also removes what an interrupted
/// write left there; other ranks only read.
pub(super) fn resume(
    run_dir: &Path,
    replicas: &mut [DrafterReplica],
    owner: bool,
) -> Result<(Figures, Option<SkipCounts>)> {
    if owner {
        tidy(run_dir);
    }
    let Some(ckpt) = latest_checkpoint(run_dir) else {
        // Killed before its first checkpoint: the run starts over, in its own directory.
        eprintln!(
            "{}: no checkpoint yet; starting the run from step 0",
            run_dir.display()
        );
        return Ok((Figures::default(), Some(SkipCounts::default())));
    };
    let mut extra = serde_json::Value::Null;
    for r in replicas.iter_mut() {
        extra = state::load_into(&ckpt, r)?.extra;
    }
    eprintln!("resuming {} at step {}", ckpt.display(), replicas[0].step);
    let skips = serde_json::from_value(extra["skips"].clone()).ok();
    Ok((Figures::from_extra(&extra), skips))
}

/// The data line(s) at the end: this invocation's counts and, after a resume, the run's.
pub(super) fn report_data(
    start: u64,
    end: u64,
    mine: &SkipCounts,
    run: Option<&SkipCounts>,
    empty: &str,
) {
    if start == 0 {
        if *mine != SkipCounts::default() || !empty.is_empty() {
            eprintln!("data: {mine}{empty}");
        }
        return;
    }
    // An invocation that only finished the run trained no step of its own.
    if start < end {
        eprintln!("data, steps {start}..{end} (this invocation): {mine}");
    }
    match run {
        Some(r) => eprintln!("data, steps 0..{end} (the run): {r}{empty}"),
        None => eprintln!(
            "data, steps 0..{end} (the run): not known (the checkpoint of step {start} did not \
             record the counts of the steps before it){empty}"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `run_plan` writes as `summary.json` reads back bit for bit: random finite f64
    /// bit patterns (and f32 losses widened, as the replicas report them), NaN as NaN.
    #[test]
    fn summary_figures_read_back_bit_identical() {
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let dir = Path::new("/runs/r");
        for i in 0..20_000 {
            let mut figure = || loop {
                let v = match i % 2 {
                    0 => f64::from_bits(next()),
                    _ => f64::from(f32::from_bits(next() as u32)),
                };
                if v.is_finite() {
                    return v;
                }
            };
            let out = TrainOutcome {
                run_dir: dir.to_path_buf(),
                steps: 12,
                final_loss: figure(),
                final_accuracy: figure(),
                first_loss: if i == 0 { f64::NAN } else { figure() },
                tau_before: Some(figure()),
                tau_after: None,
                skipped_samples: Some(3),
                data: Some(SkipCounts {
                    seen: 5,
                    kept: 2,
                    too_few_supervised: 3,
                    ..SkipCounts::default()
                }),
                invocation_start_step: 6,
                invocation_skipped_samples: 1,
                empty_rows: 2,
            };
            let text = serde_json::to_string_pretty(&out).unwrap();
            let back = read_summary(&text, dir).unwrap();
            assert_eq!(back.steps, 12);
            let bits = |o: &TrainOutcome| {
                [
                    o.final_loss,
                    o.final_accuracy,
                    o.first_loss,
                    o.tau_before.unwrap(),
                ]
                .map(f64::to_bits)
            };
            if i == 0 {
                assert!(back.first_loss.is_nan());
                continue;
            }
            assert_eq!(bits(&back), bits(&out), "{text}");
            assert_eq!(back.tau_after, None);
            assert_eq!(
                (&back.data, back.skipped_samples, back.invocation_start_step),
                (&out.data, Some(3), 6)
            );
            assert_eq!((back.invocation_skipped_samples, back.empty_rows), (1, 2));
        }
    }
}
