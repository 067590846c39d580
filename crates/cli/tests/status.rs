//! `dflash status` on run directories written by hand: the recent rate, the age of the last
//! record, a finished run, and the exit status of a failed one.

use std::path::Path;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_dflash");

fn status(dir: &Path) -> (bool, String) {
    let out = Command::new(BIN).arg("status").arg(dir).output().unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// 20 steps of 1000 tokens of a 40-step schedule: the first 10 one second apart, the last 10
/// two seconds apart (so 500 tok/s lately, against an average since the start of 20000 / 30 s
/// = 667).
fn write_metrics(dir: &Path) {
    let mut text = String::new();
    let mut elapsed = 0.0;
    for step in 0..20u64 {
        elapsed += if step < 10 { 1.0 } else { 2.0 };
        let rec = serde_json::json!({
            "step": step, "total_steps": 40, "loss": 1.0, "accuracy": 0.5, "tokens": 1000,
            "tokens_per_s": 1000.0 * (step + 1) as f64 / elapsed, "elapsed_s": elapsed,
        });
        text += &(rec.to_string() + "\n");
    }
    std::fs::write(dir.join("metrics.jsonl"), text).unwrap();
}

#[test]
fn status_shows_the_recent_rate_the_age_and_a_finished_run() {
    let tmp = tempfile::tempdir().unwrap();
    write_metrics(tmp.path());
    let (ok, text) = status(tmp.path());
    assert!(ok, "{text}");
    assert!(text.contains("667 tok/s since start"), "{text}");
    assert!(text.contains("last 10 steps: 500 tok/s"), "{text}");
    assert!(
        text.contains("last record written") && text.contains(" s ago"),
        "{text}"
    );
    assert!(!text.contains("finished"), "{text}");
    let summary = |steps: u64| {
        let s = serde_json::json!({"steps": steps, "final_loss": 1.0});
        std::fs::write(tmp.path().join("summary.json"), s.to_string()).unwrap();
        status(tmp.path())
    };
    // An invocation stopped by train.stop_at_step at the log's last step: paused, not done.
    let (ok, text) = summary(20);
    assert!(ok && text.contains("stopped at step 20 of 40"), "{text}");
    assert!(
        text.contains("--resume") && !text.contains("finished"),
        "{text}"
    );
    // A later invocation logged past the summary: still training.
    let (ok, text) = summary(12);
    assert!(ok && text.contains("not finished"), "{text}");
    assert!(
        text.contains("step 12") && text.contains("step 20"),
        "{text}"
    );
    // The schedule's last step.
    let (ok, text) = summary(40);
    assert!(ok && text.contains("finished: step 40 of 40"), "{text}");
}

#[test]
fn status_of_a_directory_that_is_no_run_fails_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let (ok, text) = status(tmp.path());
    assert!(!ok && text.contains("not a run directory"), "{text}");
    // config.toml is written before the first step: a run that has not logged one yet.
    std::fs::write(tmp.path().join("config.toml"), "").unwrap();
    let (ok, text) = status(tmp.path());
    assert!(ok && text.contains("no steps recorded yet"), "{text}");
}

/// A reader that closes the pipe after the first line ends the printing, not with a panic.
#[test]
fn status_into_a_closed_pipe_is_not_a_panic() {
    use std::process::Stdio;
    let tmp = tempfile::tempdir().unwrap();
    write_metrics(tmp.path());
    let mut child = Command::new(BIN)
        .arg("status")
        .arg(tmp.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// A resumed run restarts `elapsed_s`: the recent rate covers only the latest invocation.
#[test]
fn the_recent_rate_stays_within_the_latest_invocation() {
    let tmp = tempfile::tempdir().unwrap();
    let mut text = String::new();
    for (step, elapsed) in [(0u64, 5.0), (1, 10.0), (2, 1.0), (3, 3.0), (4, 5.0)] {
        let rec = serde_json::json!({"step": step, "tokens": 100, "elapsed_s": elapsed});
        text += &(rec.to_string() + "\n");
    }
    std::fs::write(tmp.path().join("metrics.jsonl"), text).unwrap();
    let (ok, text) = status(tmp.path());
    assert!(ok && text.contains("last 2 steps: 50 tok/s"), "{text}");
}

#[test]
fn status_of_a_failed_run_exits_non_zero() {
    let tmp = tempfile::tempdir().unwrap();
    write_metrics(tmp.path());
    std::fs::write(tmp.path().join("error.txt"), "error: out of memory\n").unwrap();
    let (ok, text) = status(tmp.path());
    assert!(!ok, "{text}");
    assert!(
        text.contains("out of memory") && text.contains("the run failed"),
        "{text}"
    );
}
