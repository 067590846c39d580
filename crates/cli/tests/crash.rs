//! The crash suite: the `dflash` binary killed with SIGKILL at named moments of a run (at
//! startup, mid-step, during each file of a checkpoint write, right after `checkpoints/latest`
//! switches, at the end, twice in a row), then resumed with `train --resume`. Every
//! interrupted run must end with the per-step losses (`metrics.jsonl`), the final drafter
//! (`model.safetensors`), the last checkpoint and the summary of the same run done in one go,
//! bit for bit.
//!
//! The moments are the fault points of `dflash_models::fault`: with `DFLASH_FAULT=POINT@K`
//! the process announces on stderr that it reached POINT for the K-th time and waits there;
//! the test then kills it (`Child::kill` is SIGKILL), so the kill lands at that instant and
//! nowhere else.
//!
//! The job is `common::Job`'s.

mod common;

use std::path::{Path, PathBuf};

use common::{Job, Outcome, STEPS, figures};
use serde_json::Value;

/// The uninterrupted run, and the job to interrupt the others of.
fn baseline() -> (Job, Outcome, String) {
    let job = Job::new();
    let (line, _) = job.finish("whole", false);
    let whole = Outcome::read(&job.run_dir("whole"));
    assert_eq!(whole.records.len() as u64, STEPS);
    assert_eq!(whole.records[STEPS as usize - 1][1], 1, "two epochs");
    assert_eq!(whole.latest, format!("step-{STEPS}"));
    assert_eq!(whole.checkpoints, [format!("step-{STEPS}")]);
    assert!(whole.summary.iter().all(|v| !v.is_null()), "{whole:?}");
    // Both bad samples are met in the first epoch at least.
    assert!(whole.summary[6].as_u64().unwrap() >= 2, "{whole:?}");
    (job, whole, figures(&line).to_string())
}

/// Kills run `name` at each fault in turn (the first on a fresh run, each next one on the
/// resume of the previous), then resumes it to the end, from checkpoint `step-FROM` (from
/// step 0 without one); it must match the whole run.
fn interrupted(
    (job, whole, whole_line): &(Job, Outcome, String),
    name: &str,
    faults: &[&str],
    from: Option<u64>,
) {
    for (i, fault) in faults.iter().enumerate() {
        job.kill_at(name, i > 0, fault);
    }
    let (line, stderr) = job.finish(name, true);
    let resumed = match from {
        Some(n) => format!(
            "resuming {}/step-{n} at step {n}",
            job.run_dir(name).join("checkpoints").display()
        ),
        None => "no checkpoint yet; starting the run from step 0".to_string(),
    };
    assert!(
        stderr.contains(&resumed),
        "killed at {faults:?}: expected {resumed:?} in\n{stderr}"
    );
    let dir = job.run_dir(name);
    assert!(
        line.starts_with(&format!("run_dir={} ", dir.display())),
        "{line}"
    );
    assert_eq!(figures(&line), whole_line, "killed at {faults:?}");
    let got = Outcome::read(&dir);
    assert!(
        got == *whole,
        "killed at {faults:?}: the resumed run differs from the whole one\n\
         whole: {:?}\ngot:   {:?}",
        (&whole.records, &whole.summary, &whole.checkpoints),
        (&got.records, &got.summary, &got.checkpoints),
    );
}

/// Killed before anything was written (the temp file of `config.toml` not yet renamed), the
/// run is started again with the same command and goes to the same directory, not `NAME-1`;
/// killed at its first micro-batch (no checkpoint yet), it resumes from step 0 in its own
/// directory, tau before training measured as in a fresh run.
#[test]
fn killed_at_startup_then_started_again_or_resumed() {
    let base = baseline();
    let (job, whole, whole_line) = (&base.0, &base.1, base.2.as_str());
    job.kill_at("early", false, "write:config.toml");
    assert!(!job.run_dir("early").join("config.toml").exists());
    let (line, _) = job.finish("early", false);
    assert_eq!(
        line,
        format!("run_dir={} {whole_line}", job.run_dir("early").display())
    );
    assert_eq!(Outcome::read(&job.run_dir("early")), *whole);
    assert!(!job.run_dir("early-1").exists());

    interrupted(&base, "first-batch", &["accumulated@1"], None);
    assert!(!job.run_dir("first-batch-1").exists());
}

/// Killed mid-step (between a micro-batch's backward and the update): once after the first
/// checkpoint, and once right before the second.
#[test]
fn killed_mid_step_then_resumed() {
    let base = baseline();
    interrupted(&base, "step-4", &["accumulated@5"], Some(3));
    interrupted(&base, "step-6", &["accumulated@6"], Some(3));
}

/// Killed during each file of the second checkpoint's write (`step-6`): a torn temp file of
/// each tensor file, and each file written but not renamed, and `latest` itself; the
/// resumed run goes on from `step-3`.
#[test]
fn killed_during_each_file_of_a_checkpoint_write_then_resumed() {
    let base = baseline();
    for (i, fault) in [
        "stream:model.safetensors@2",
        "write:model.safetensors@2",
        "write:config.json@2",
        "stream:optimizer.st@2",
        "write:optimizer.st@2",
        "write:trainer_state.json@2",
        "write:latest@2",
    ]
    .iter()
    .enumerate()
    {
        interrupted(&base, &format!("ckpt-{i}"), &[fault], Some(3));
    }
}

/// Killed right after `latest` switched to `step-6` (`step-3` not yet removed), and twice in
/// a row: there, then again at the same moment of the resumed run (`step-9`), or first
/// mid-step and then while the resume trims `metrics.jsonl` to the checkpoint.
#[test]
fn killed_after_latest_switches_and_twice_in_a_row_then_resumed() {
    let base = baseline();
    interrupted(&base, "published", &["published@2"], Some(6));
    let twice = ["published@2", "published@1"];
    interrupted(&base, "published-twice", &twice, Some(9));
    let trim = ["accumulated@8", "write:metrics.jsonl"];
    interrupted(&base, "trim", &trim, Some(6));
}

/// Killed at the end: after the last checkpoint is published, while the served drafter is
/// written, and before `summary.json` is; the resume finishes the run with the run's own
/// figures (not nulls, not this invocation's). Resuming the finished run then says so and
/// changes no file.
#[test]
fn killed_at_the_end_then_resumed_and_a_finished_run_resumed_changes_nothing() {
    let base = baseline();
    let (job, whole_line) = (&base.0, base.2.as_str());
    for (name, fault) in [
        ("end-published", "published@4"),
        ("end-model", "write:model.safetensors@5"),
        ("end-summary", "write:summary.json"),
    ] {
        interrupted(&base, name, &[fault], Some(12));
    }
    let dir = job.run_dir("end-summary");
    let snapshot = snapshot(&dir);
    let (line, stderr) = job.finish("end-summary", true);
    assert!(stderr.contains("the run already finished"), "{stderr}");
    assert_eq!(figures(&line), whole_line);
    assert!(snapshot == self::snapshot(&dir), "files changed");
}

/// Every file under `dir` with its bytes, sorted by path.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            match e.file_type().unwrap().is_dir() {
                true => dirs.push(e.path()),
                false => files.push((e.path(), std::fs::read(e.path()).unwrap())),
            }
        }
    }
    files.sort();
    files
}

/// A run stopped early (`train.stop_at_step`) and resumed reports the run's first loss,
/// tau before training and skip counts, not the resumed invocation's; the invocation's
/// counts are reported next to the run's, each for what it is.
#[test]
fn a_resumed_run_reports_the_runs_first_loss_and_tau_before() {
    let (job, whole, whole_line) = baseline();
    let mut first = job.command("stopped", false);
    first.args(["--set", "train.stop_at_step=5"]);
    let out = first.output().unwrap();
    assert!(out.status.success());
    let summary = |name: &str| -> Value {
        let text = std::fs::read_to_string(job.run_dir(name).join("summary.json")).unwrap();
        serde_json::from_str(&text).unwrap()
    };
    let before = summary("stopped")["skipped_samples"].as_u64().unwrap();
    let (line, stderr) = job.finish("stopped", true);
    assert!(stderr.contains("checkpoints/step-5 at step 5"), "{stderr}");
    assert_eq!(figures(&line), whole_line);
    assert_eq!(Outcome::read(&job.run_dir("stopped")), whole);

    let (run, resumed) = (summary("whole"), summary("stopped"));
    let total = run["skipped_samples"].as_u64().unwrap();
    assert!(0 < before && before < total, "{before} of {total}");
    assert_eq!(resumed["skipped_samples"], total, "the run's");
    assert_eq!(resumed["invocation_start_step"], 5);
    assert_eq!(resumed["invocation_skipped_samples"], total - before);
    assert_eq!(run["invocation_start_step"], 0);
    assert_eq!(run["invocation_skipped_samples"], total);
    let data = |who: &str| {
        stderr
            .lines()
            .find(|l| l.starts_with(&format!("data, steps {who}")))
            .unwrap_or_else(|| panic!("no data line for {who} in\n{stderr}"))
            .to_string()
    };
    assert!(
        data("5..12 (this invocation)").contains(&format!("skipped {}:", total - before)),
        "{stderr}"
    );
    assert!(
        data("0..12 (the run)").contains(&format!("skipped {total}:")),
        "{stderr}"
    );
}
