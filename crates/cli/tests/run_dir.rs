//! The binary on a run directory: `dflash status` of a run at any stage, and `train --resume`
//! with `--set`, whose overrides apply to the run's saved config.

mod common;

use std::process::Command;

use common::{BIN, Job};

fn status(dir: &std::path::Path) -> (bool, String) {
    let out = Command::new(BIN).arg("status").arg(dir).output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// A run that fails before its first step has no `metrics.jsonl`; its status still shows the
/// error that stopped it.
#[test]
fn status_shows_the_error_of_a_run_that_failed_before_its_first_step() {
    let job = Job::new();
    let mut c = job.command("early", false);
    // More target features than the 8-layer tiny target can give distinct layers for.
    c.args(["--set", "drafter.num_target_features=20"]);
    let out = c.output().unwrap();
    assert!(!out.status.success(), "the run was accepted");
    let dir = job.run_dir("early");
    let error = std::fs::read_to_string(dir.join("error.txt"))
        .unwrap_or_else(|e| panic!("{}: no error.txt: {e}", dir.display()));
    let (ok, text) = status(&dir);
    // A failed run's status fails too, so that a script polling it stops.
    assert!(!ok, "{text}");
    assert!(text.contains("no steps recorded yet"), "{text}");
    assert!(
        text.contains("last error") && text.contains(error.trim_end()),
        "{text}"
    );

    let (ok, text) = status(&job.run_dir("never-started"));
    assert!(!ok && text.contains("no such run directory"), "{text}");
}

/// `--set` on a resume is checked against the run's saved config: a token budget of 128 is
/// the run's own (its max_len is 64) and below the built-in default max_len (3072).
#[test]
fn a_resume_checks_its_overrides_against_the_runs_saved_config() {
    let job = Job::new();
    let mut c = job.command("resumed", false);
    c.args(["--set", "train.stop_at_step=3"]);
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Its summary is an invocation's, not the run's end.
    let (ok, text) = status(&job.run_dir("resumed"));
    assert!(ok && text.contains("stopped at step 3 of "), "{text}");
    // Resumed by a relative path: the run_dir= line scripts parse is absolute all the same.
    let run_dir = job.run_dir("resumed");
    let out = Command::new(BIN)
        .current_dir(run_dir.parent().unwrap())
        .args([
            "train",
            "--resume",
            "resumed",
            "--set",
            "data.token_budget=128",
        ])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("steps=12"), "{stdout}");
    let line = stdout.lines().find(|l| l.starts_with("run_dir=")).unwrap();
    assert!(
        line.starts_with(&format!("run_dir={} ", run_dir.display())),
        "{line}"
    );
    let (ok, text) = status(&job.run_dir("resumed"));
    assert!(ok && text.contains("step 12 "), "{text}");
}

/// A resume without the run's saved config and without `--config` is refused: the defaults
/// would otherwise replace the run's recipe without a word.
#[test]
fn a_resume_without_the_runs_config_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::create_dir(tmp.path().join("checkpoints")).unwrap();
    // A run that lost its config keeps its checkpoints (without either it is no run at all).
    std::fs::write(tmp.path().join("checkpoints/latest"), "step-3").unwrap();
    let out = Command::new(BIN)
        .arg("train")
        .arg("--resume")
        .arg(tmp.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("config.toml") && stderr.contains("--config"),
        "{stderr}"
    );
}
