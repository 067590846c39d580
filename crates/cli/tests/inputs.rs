//! The binary on inputs it must not take silently.

mod common;

use common::Job;

/// A `drafter.mask_token_id` that occurs in the data: the run trains, warns once when it
/// first meets it in the training data and once in the evaluation set, and counts the
/// samples holding it in the data lines; `dflash eval` of that drafter does the same.
#[test]
fn a_mask_token_id_that_occurs_in_the_data_is_a_counted_warning() {
    let job = Job::new();
    let first = std::fs::read_to_string(job.data()).unwrap();
    let first: serde_json::Value = serde_json::from_str(first.lines().next().unwrap()).unwrap();
    let token = first["input_ids"][0].as_u64().unwrap();
    let mut c = job.command("mask", false);
    c.args(["--set", &format!("drafter.mask_token_id={token}")]);
    let out = c.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let held = format!("holds the mask token id {token} (position ");
    assert_eq!(stderr.matches(&held).count(), 2, "{stderr}");
    // Samples come in schedule order: the warning names whichever came first.
    assert_eq!(
        stderr.matches("warning: train sample ").count(),
        1,
        "{stderr}"
    );
    let counted = format!("holding the mask token id {token}, first: sample 0, position 0");
    let line = |prefix: &str| line_of(&stderr, prefix);
    assert!(line("data: ").contains(&counted), "{stderr}");
    // The evaluation set is the first 4 samples, in order.
    let eval_warning = format!("warning: eval sample 0 {held}0)");
    assert_eq!(stderr.matches(&eval_warning).count(), 1, "{stderr}");
    assert!(line("eval data ").contains(&counted), "{stderr}");

    // `dflash eval` of the drafter takes the id from its config.json.
    let out = std::process::Command::new(common::BIN)
        .arg("eval")
        .arg("--config")
        .arg(job.config())
        .arg("--drafter")
        .arg(job.run_dir("mask"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stderr.matches(&eval_warning).count(), 1, "{stderr}");
    assert_eq!(stderr.matches(&held).count(), 1, "{stderr}");
    assert!(line_of(&stderr, "data: ").contains(&counted), "{stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("tau="));

    // The default id (an unused row of this vocabulary) raises nothing.
    let (_, stderr) = job.finish("default", false);
    assert!(!stderr.contains("mask token"), "{stderr}");
}

fn line_of(text: &str, prefix: &str) -> String {
    text.lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_default()
        .to_string()
}

/// `--backend NAME` sets `backend.name` and the backend's preferred attention kernel (what a
/// run records in its config.toml); `--set` still wins over it; an unknown name is an error
/// naming the flag and the registered backends.
#[test]
fn backend_flag_picks_the_backend_and_its_preferred_kernel() {
    let job = Job::new();
    let mut c = job.command("wgpu", false);
    c.args(["--backend", "wgpu", "--set", "train.max_steps=2"]);
    let out = c.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stderr.contains("no wgpu adapter") || stderr.contains("is not available on this machine") {
        eprintln!("backend_flag_picks_the_backend_and_its_preferred_kernel: skipped: {stderr}");
    } else {
        assert!(out.status.success(), "{stderr}");
        let saved = std::fs::read_to_string(job.run_dir("wgpu").join("config.toml")).unwrap();
        assert!(saved.contains("name = \"wgpu\""), "{saved}");
        assert!(saved.contains("attention = \"wgpu-tiled\""), "{saved}");
    }

    let mut c = job.command("unknown", false);
    c.args(["--backend", "nosuch"]);
    let out = c.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("--backend \"nosuch\""), "{stderr}");
    assert!(
        stderr.contains("reference"),
        "the registered backends: {stderr}"
    );

    let mut c = job.command("set-wins", false);
    c.args([
        "--backend",
        "reference",
        "--set",
        "backend.attention=\"nosuch\"",
    ]);
    let out = c.output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("nosuch"), "{stderr}");
}

/// `dflash bench --set` applies to the end-to-end figures, which run last: a key that no
/// config has is refused before the first figure runs.
#[test]
fn a_misspelt_bench_override_is_refused_before_any_figure_runs() {
    let out = std::process::Command::new(common::BIN)
        .args(["bench", "--backend", "reference", "--scale", "smoke"])
        .args(["--only", "gemm", "--set", "train.lrr=1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{stdout}");
    assert!(
        stderr.contains("bench --set") && stderr.contains("lrr"),
        "{stderr}"
    );
    assert!(!stdout.contains("gemm."), "a figure ran first:\n{stdout}");
}
