//! `dflash bench` through the binary: what only the executable can show.

mod common;

/// `load.8b` starts `dflash train` as a process of its own, so its figure counts the whole
/// start-up a user pays, and says how much of it came before the job.
#[test]
fn load_8b_times_a_train_process_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("out.json");
    let out = std::process::Command::new(common::BIN)
        .args(["bench", "--backend", "reference", "--scale", "smoke"])
        .args(["--only", "load.8b", "--out"])
        .arg(&json)
        .env("DFLASH_BENCH_CACHE", dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let results: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(results.len(), 1, "{results:?}");
    let r = &results[0];
    assert_eq!(r["name"], "load.8b");
    let detail = r["detail"].as_str().unwrap();
    assert!(
        detail.contains("`dflash train` as a process of its own")
            && detail.contains("s before the job's clock starts: process start"),
        "{detail}"
    );
    let secs = r["value"].as_f64().unwrap();
    // The child's own clock for the job is inside the figure, which also counts its start.
    let in_job: f64 = detail
        .split(" s on it: device start-up")
        .next()
        .and_then(|head| head.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no seconds on the job's clock: {detail}"));
    assert!(
        in_job > 0.0 && secs >= in_job,
        "{secs} vs {in_job}: {detail}"
    );
    // A restart is timed too, in a run of its own, with the first start's kernel cache.
    assert!(
        detail.contains("a restart with the kernels cached on disk (DFLASH_CUDA_KERNEL_CACHE"),
        "{detail}"
    );
    // The child's memory was sampled, not this process's.
    assert!(!detail.contains("peak RssAnon 0.00 GB"), "{detail}");
}
