//! `dflash status RUN_DIR`: the last logged step (progress, queues, each worker's time per
//! phase), the rate of the last steps, how long ago the run last logged, whether it finished,
//! the latest checkpoint and the last error. Each part is shown when it exists, so a run that
//! failed before its first step still shows why; a run with an error exits non-zero, so a
//! script polling it stops.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;
use std::time::SystemTime;

use anyhow::{Result, bail};
use serde_json::Value;

/// What `summary.json` says about the run, against the last step record (`last`): the run
/// finished; an invocation stopped early (`train.stop_at_step`) and the run goes on with
/// `--resume`; or a later invocation trained past the summary's step. `None` without one.
fn summary_line(run_dir: &Path, last: Option<&Value>) -> Option<String> {
    let path = run_dir.join("summary.json");
    let text = std::fs::read_to_string(&path).ok()?;
    let Some(steps) = serde_json::from_str::<Value>(&text)
        .ok()
        .and_then(|v| v["steps"].as_u64())
    else {
        return Some(format!(
            "{}: not a summary this version reads (no \"steps\")",
            path.display()
        ));
    };
    let logged = last.and_then(|v| v["step"].as_u64()).map(|s| s + 1);
    let total = last.and_then(|v| v["total_steps"].as_u64());
    Some(match (logged, total) {
        (Some(logged), _) if logged > steps => format!(
            "not finished: summary.json records step {steps}, an earlier invocation's; the \
             log has reached step {logged}"
        ),
        (_, Some(total)) if steps < total => format!(
            "stopped at step {steps} of {total} (train.stop_at_step); `dflash train --resume \
             {}` goes on",
            run_dir.display()
        ),
        (_, Some(total)) => format!("finished: step {steps} of {total} (summary.json)"),
        // A log written before records carried the schedule's length.
        (_, None) => format!("finished: step {steps} (summary.json)"),
    })
}

/// Records the recent rate is taken over: enough to smooth a step's jitter, few enough to
/// show a slow-down the average since the start (each record's `tokens_per_s`) hides.
const RECENT: usize = 10;

/// Prints the status of `run_dir` (see the module docs). A reader that closes the pipe early
/// (`dflash status RUN | head -1`) ends the printing, not the process with a panic.
pub fn print(run_dir: &Path) -> Result<()> {
    let mut out = String::new();
    let result = write(run_dir, &mut out);
    match std::io::stdout().lock().write_all(out.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            return Err(anyhow::Error::from(e).context("writing the status to stdout"));
        }
        _ => {}
    }
    result
}

/// A line of the status into `out` (a `String`, which cannot fail to take it).
macro_rules! outln {
    ($out:expr, $($arg:tt)*) => {{
        let _ = writeln!($out, $($arg)*);
    }};
}

/// The files of which a run directory holds at least one: `dflash train` writes its
/// config.toml before the first step, then the log, checkpoints, the summary or the error.
const RUN_FILES: [&str; 5] = [
    "config.toml",
    "metrics.jsonl",
    "checkpoints/latest",
    "summary.json",
    "error.txt",
];

fn write(run_dir: &Path, out: &mut String) -> Result<()> {
    if !run_dir.is_dir() {
        bail!("{}: no such run directory", run_dir.display());
    }
    if !RUN_FILES.iter().any(|f| run_dir.join(f).exists()) {
        bail!(
            "{}: not a run directory (none of {}); pass the directory a `dflash train` made, \
             RUN.DIR/RUN.NAME (it prints it as run_dir=...)",
            run_dir.display(),
            RUN_FILES.join(", ")
        );
    }
    let metrics = run_dir.join("metrics.jsonl");
    let mut last: Option<Value> = None;
    match std::fs::read_to_string(&metrics) {
        Ok(text) => {
            let records: Vec<Value> = text
                .lines()
                .filter(|l| !l.trim().is_empty())
                .map_while(|l| serde_json::from_str(l).ok())
                .collect();
            match text.lines().rev().find(|l| !l.trim().is_empty()) {
                Some(line) => match serde_json::from_str::<Value>(line) {
                    Ok(v) => {
                        print_step(out, &v);
                        last = Some(v);
                    }
                    Err(e) => outln!(
                        out,
                        "{}: the last line is not JSON ({e}); a running job may be writing it",
                        metrics.display()
                    ),
                },
                None => outln!(out, "no steps recorded yet"),
            }
            if let Some((rate, steps)) = recent_rate(&records) {
                outln!(out, "last {steps} steps: {rate:.0} tok/s");
            }
            if let Some(age) = age_s(&metrics) {
                outln!(out, "last record written {} ago", fmt_age(age));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            outln!(
                out,
                "no steps recorded yet ({} does not exist)",
                metrics.display()
            )
        }
        Err(e) => outln!(out, "{}: cannot be read: {e}", metrics.display()),
    }
    if let Some(line) = summary_line(run_dir, last.as_ref()) {
        outln!(out, "{line}");
    }
    if let Some(ckpt) = dflash_pipeline::job::latest_checkpoint(run_dir) {
        outln!(out, "latest checkpoint: {}", ckpt.display());
    }
    let err = run_dir.join("error.txt");
    if let Ok(e) = std::fs::read_to_string(&err) {
        outln!(out, "last error ({}):\n{}", err.display(), e.trim_end());
        bail!("{}: the run failed (its error is above)", err.display());
    }
    Ok(())
}

/// Tokens per second over the last [`RECENT`] records of the latest invocation (Σ tokens of
/// the steps after the window's first record ÷ the elapsed seconds between its ends), and
/// the steps it covers; `None` with fewer than two records. A resumed run restarts
/// `elapsed_s`, so the window stops where it goes back.
fn recent_rate(records: &[Value]) -> Option<(f64, usize)> {
    let elapsed = |v: &Value| v["elapsed_s"].as_f64();
    let mut first = records.len().checked_sub(1)?;
    while first > 0
        && records.len() - first < RECENT + 1
        && elapsed(&records[first - 1])? < elapsed(&records[first])?
    {
        first -= 1;
    }
    let window = &records[first..];
    let steps = window.len() - 1;
    let secs = elapsed(window.last()?)? - elapsed(&window[0])?;
    if steps == 0 || secs <= 0.0 {
        return None;
    }
    let tokens: u64 = window[1..]
        .iter()
        .map(|v| v["tokens"].as_u64().unwrap_or(0))
        .sum();
    Some((tokens as f64 / secs, steps))
}

/// Seconds since `path` was last modified.
fn age_s(path: &Path) -> Option<f64> {
    let modified = std::fs::metadata(path).ok()?.modified().ok()?;
    Some(
        SystemTime::now()
            .duration_since(modified)
            .map_or(0.0, |d| d.as_secs_f64()),
    )
}

fn fmt_age(s: f64) -> String {
    match s {
        s if s < 120.0 => format!("{s:.0} s"),
        s if s < 7200.0 => format!("{:.0} min", s / 60.0),
        s => format!("{:.1} h", s / 3600.0),
    }
}

/// One `metrics.jsonl` record: progress, queues and busy gauges, then where each worker's
/// time went, largest phase first (the bottleneck is the side whose working phases fill its
/// wall time).
fn print_step(out: &mut String, v: &Value) {
    let pct = |key: &str| -> String {
        let v: Vec<String> = v[key]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|x| format!("{:.0}%", x.as_f64().unwrap_or(0.0) * 100.0))
                    .collect()
            })
            .unwrap_or_default();
        v.join(" ")
    };
    outln!(
        out,
        "step {} | loss {:.4} | acc {:.3} | {:.0} tok/s since start | elapsed {:.0}s",
        v["step"].as_u64().map_or(0, |s| s + 1),
        v["loss"].as_f64().unwrap_or(f64::NAN),
        v["accuracy"].as_f64().unwrap_or(f64::NAN),
        v["tokens_per_s"].as_f64().unwrap_or(0.0),
        v["elapsed_s"].as_f64().unwrap_or(0.0),
    );
    outln!(
        out,
        "queues {} | producer stall {:.1}s | consumer starved {:.1}s | busy: targets [{}] drafters [{}]",
        v["queue_depths"],
        v["producer_stall_s"].as_f64().unwrap_or(0.0),
        v["consumer_starved_s"].as_f64().unwrap_or(0.0),
        pct("target_busy"),
        pct("drafter_busy"),
    );
    for (key, who) in [
        ("target_phases_s", "target"),
        ("drafter_phases_s", "drafter"),
    ] {
        for (i, phases) in v[key].as_array().into_iter().flatten().enumerate() {
            let mut p: Vec<(&String, f64)> = phases
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, x)| (k, x.as_f64().unwrap_or(0.0)))
                .collect();
            p.sort_by(|a, b| b.1.total_cmp(&a.1));
            let total: f64 = p.iter().map(|x| x.1).sum::<f64>().max(1e-9);
            let parts: Vec<String> = p
                .iter()
                .map(|(k, x)| format!("{k} {x:.1}s ({:.0}%)", 100.0 * x / total))
                .collect();
            outln!(out, "{who} {i}: {}", parts.join(", "));
        }
    }
}
