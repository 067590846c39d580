//! `dflash status RUN_DIR`: the last logged step (progress, queues, each worker's time per
//! phase), the latest checkpoint and the last error. Each part is shown when it exists, so a
//! run that failed before its first step still shows why.

use std::path::Path;

use anyhow::{Result, bail};
use serde_json::Value;

pub fn print(run_dir: &Path) -> Result<()> {
    if !run_dir.is_dir() {
        bail!("{}: no such run directory", run_dir.display());
    }
    let metrics = run_dir.join("metrics.jsonl");
    match std::fs::read_to_string(&metrics) {
        Ok(text) => match text.lines().rev().find(|l| !l.trim().is_empty()) {
            Some(line) => match serde_json::from_str::<Value>(line) {
                Ok(v) => print_step(&v),
                Err(e) => println!(
                    "{}: the last line is not JSON ({e}); a running job may be writing it",
                    metrics.display()
                ),
            },
            None => println!("no steps recorded yet"),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            println!(
                "no steps recorded yet ({} does not exist)",
                metrics.display()
            )
        }
        Err(e) => println!("{}: cannot be read: {e}", metrics.display()),
    }
    if let Some(ckpt) = dflash_pipeline::job::latest_checkpoint(run_dir) {
        println!("latest checkpoint: {}", ckpt.display());
    }
    let err = run_dir.join("error.txt");
    if let Ok(e) = std::fs::read_to_string(&err) {
        println!("last error ({}):\n{}", err.display(), e.trim_end());
    }
    Ok(())
}

/// One `metrics.jsonl` record: progress, queues and busy gauges, then where each worker's
/// time went, largest phase first (the bottleneck is the side whose working phases fill its
/// wall time).
fn print_step(v: &Value) {
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
    println!(
        "step {} | loss {:.4} | acc {:.3} | {:.0} tok/s | elapsed {:.0}s",
        v["step"].as_u64().map_or(0, |s| s + 1),
        v["loss"].as_f64().unwrap_or(f64::NAN),
        v["accuracy"].as_f64().unwrap_or(f64::NAN),
        v["tokens_per_s"].as_f64().unwrap_or(0.0),
        v["elapsed_s"].as_f64().unwrap_or(0.0),
    );
    println!(
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
            println!("{who} {i}: {}", parts.join(", "));
        }
    }
}
