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

/// `dflash bench --backend reference --scale smoke` with `extra` arguments.
fn bench(extra: &[&str]) -> std::process::Output {
    std::process::Command::new(common::BIN)
        .args(["bench", "--backend", "reference", "--scale", "smoke"])
        .args(extra)
        .output()
        .unwrap()
}

fn read_results(path: &std::path::Path) -> Vec<serde_json::Value> {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A figure that fails (the job stops after one step, too few to time) fails the command with
/// its cause, and the figures measured before it are in the file all the same.
#[test]
fn a_failed_figure_keeps_those_measured_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("X.json");
    let out = bench(&[
        "--only",
        "gemm.f32,e2e.small",
        "--set",
        "train.stop_at_step=1",
        "--out",
        json.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("e2e.small.1gpu") && stderr.contains("warm-up"),
        "{stderr}"
    );
    let names: Vec<String> = read_results(&json)
        .iter()
        .map(|r| r["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["gemm.f32.8192"]);
}

/// A figure named by --only that cannot run here (two devices on a one-device backend) fails
/// the command, saying why, and leaves the results file as it was rather than emptying it.
#[test]
fn an_only_figure_that_produced_nothing_fails_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("X.json");
    std::fs::write(&json, "[\"earlier results\"]\n").unwrap();
    let out = bench(&["--only", "e2e.8b.2gpu", "--out", json.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("produced nothing")
            && stderr.contains("e2e.8b.2gpu")
            && stderr.contains("need devices 0 and 1"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(&json).unwrap(),
        "[\"earlier results\"]\n"
    );
}

/// With --only into --results-dir, the machine's file keeps the figures not re-measured and
/// gets the new value of those that were; a non-CUDA backend's file names the backend.
#[test]
fn only_into_the_results_dir_merges() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["--only", "gemm.f32", "--results-dir"];
    let run = |args: &[&str]| {
        let mut all = args.to_vec();
        all.push(dir.path().to_str().unwrap());
        let out = bench(&all);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&args);
    let files: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let file = &files[0];
    let name = file.file_name().unwrap().to_str().unwrap();
    assert!(name.starts_with("reference-"), "{name}");
    // An earlier figure of another name, and a stale value of the one re-measured.
    let mut results = read_results(file);
    let mut other = results[0].clone();
    other["name"] = "attention.causal.s8192.fwd".into();
    results[0]["value"] = (-1.0).into();
    results.push(other);
    std::fs::write(file, serde_json::to_string(&results).unwrap()).unwrap();
    run(&args);
    let merged = read_results(file);
    let names: Vec<&str> = merged.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["gemm.f32.8192", "attention.causal.s8192.fwd"]);
    assert!(merged[0]["value"].as_f64().unwrap() > 0.0, "{merged:?}");
}

/// A whole run into --results-dir whose machine file holds figures of another scale (a smoke
/// run beside full ones) is refused before it measures anything; the file is kept.
#[test]
fn a_run_of_another_scale_does_not_replace_the_machines_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let out = bench(&["--only", "gemm.f32", "--results-dir", d]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let file = std::fs::read_dir(dir.path())
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    let mut results = read_results(&file);
    for r in &mut results {
        r["scale"] = "full".into();
    }
    let full = serde_json::to_string(&results).unwrap();
    std::fs::write(&file, &full).unwrap();
    let out = bench(&["--results-dir", d]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("at scale full") && stderr.contains("not writing"),
        "{stderr}"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), full);
}

/// The bench sets its jobs' backend and device placement itself: a --set of them is refused
/// before anything runs.
#[test]
fn set_of_backend_or_devices_is_refused() {
    for set in ["backend.threads=1", "pipeline.drafter_devices=[1]"] {
        let out = bench(&["--only", "e2e.small", "--set", set]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{set}: {stderr}");
        assert!(stderr.contains("cannot be overridden"), "{set}: {stderr}");
    }
}
