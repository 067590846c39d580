//! `dflash plan` and the placement settings it leads to, on the reference backend (one
//! device): the report's numbers are consistent with its own model, `placement = "auto"`
//! trains with the placement the plan picks and records it for `--resume`, and device lists
//! that name a missing device or disagree with the worker counts, or a device collective the
//! backend lacks, are refused by field.

mod common;

use common::{BIN, Job, Outcome};
use serde_json::Value;

#[test]
fn plan_reports_measured_rates_and_a_split_that_fits() {
    let job = Job::new();
    let json = job.run_dir("plan.json");
    std::fs::create_dir_all(json.parent().unwrap()).unwrap();
    let out = std::process::Command::new(BIN)
        .arg("plan")
        .arg("--config")
        .arg(job.config())
        .args(["--steps", "2", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("best that fits: --set pipeline.target_devices='[0]'"),
        "{stdout}"
    );
    let r: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(r["devices"], 1);
    assert_eq!(r["measured"]["steps"], 2);
    let (rt, rd) = (
        r["rates"]["target_tok_s"].as_f64().unwrap(),
        r["rates"]["drafter_tok_s"].as_f64().unwrap(),
    );
    assert!(
        rt.is_finite() && rt > 0.0 && rd.is_finite() && rd > 0.0,
        "{r}"
    );
    let tokens = r["measured"]["tokens"].as_f64().unwrap();
    let target_s = r["measured"]["target_s"].as_f64().unwrap();
    assert!((tokens / target_s - rt).abs() <= 1e-9 * rt, "{r}");
    // One device: the only split shares it, at the harmonic rate of the two.
    let splits = r["splits"].as_array().unwrap();
    assert_eq!(splits.len(), 1, "{r}");
    let s = &splits[0];
    assert_eq!(s["split"]["shared"], 1);
    let expected = s["split"]["expected_tok_s"].as_f64().unwrap();
    let harmonic = 1.0 / (1.0 / rt + 1.0 / rd);
    assert!(
        (expected - harmonic).abs() <= 1e-9 * harmonic,
        "{expected} vs {harmonic}"
    );
    assert_eq!(s["fits"], true);
    let peak = s["memory"][0][1].as_u64().unwrap();
    assert!(peak > 0, "{r}");
}

#[test]
fn auto_placement_trains_as_the_planned_lists_do_and_is_kept_for_resume() {
    let job = Job::new();
    job.finish("plain", false);
    let auto = job
        .command("auto", false)
        .args(["--set", "pipeline.placement=\"auto\""])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&auto.stderr);
    assert!(auto.status.success(), "{stderr}");
    assert!(
        stderr.contains("pipeline.placement = \"auto\":"),
        "{stderr}"
    );
    assert_planned_lists_kept(&job.run_dir("auto"));
    // The one placement of one device: the same run as the default placement, bit for bit.
    let (plain, auto) = (
        Outcome::read(&job.run_dir("plain")),
        Outcome::read(&job.run_dir("auto")),
    );
    assert!(plain.records == auto.records && plain.model == auto.model);
}

/// `train --resume DIR --config X` reads X in place of the run's saved config: with
/// `placement = "auto"` there, the resume takes the run's planned lists from the saved
/// config (it used to fall back to one target and one drafter and overwrite the saved
/// config with "auto" and no lists, losing the split for every later resume), and ends as
/// the uninterrupted run does.
#[test]
fn auto_placement_resumed_with_config_keeps_the_planned_lists() {
    let job = Job::new();
    job.finish("plain", false);
    let auto = ["--set", "pipeline.placement=\"auto\""];
    let first = job
        .command("auto", false)
        .args(auto)
        .args(["--set", "train.stop_at_step=6"])
        .output()
        .unwrap();
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let resumed = std::process::Command::new(BIN)
        .arg("train")
        .arg("--resume")
        .arg(job.run_dir("auto"))
        .arg("--config")
        .arg(job.config())
        .args(auto)
        .env_remove(common::FAULT_ENV)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&resumed.stderr);
    assert!(resumed.status.success(), "{stderr}");
    assert_planned_lists_kept(&job.run_dir("auto"));
    assert!(
        stderr.contains("resuming with the run's planned placement"),
        "{stderr}"
    );
    let (plain, auto) = (
        Outcome::read(&job.run_dir("plain")),
        Outcome::read(&job.run_dir("auto")),
    );
    assert!(plain.records == auto.records && plain.model == auto.model);
}

#[test]
fn placement_and_collective_settings_that_cannot_work_are_refused() {
    let job = Job::new();
    for (sets, expect) in [
        (
            &["pipeline.drafter_devices=[1]"][..],
            "pipeline.drafter_devices: device 1 does not exist: backend reference has 1 device(s)",
        ),
        (
            &[
                "pipeline.target_devices=[0, 0]",
                "pipeline.target_workers=3",
            ][..],
            "pipeline.target_workers",
        ),
        (
            &["pipeline.target_devices=[0]", "pipeline.placement=\"auto\""][..],
            "pipeline.target_devices",
        ),
        (
            &["pipeline.target_devices=[]"][..],
            "must name at least one device",
        ),
        // The reference backend has no device collective: said by setting and reason.
        (
            &[
                "pipeline.drafter_workers=2",
                "pipeline.collective=\"device\"",
            ][..],
            "pipeline.collective = \"device\" with 2 drafter replicas on backend reference: \
             backend \"device collective\" is not available on this machine: this backend \
             sums gradients through host memory only",
        ),
    ] {
        let mut c = job.command("bad", false);
        for s in sets {
            c.args(["--set", s]);
        }
        let out = c.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{sets:?} was accepted");
        assert!(
            stderr.contains(expect),
            "{sets:?}: expected {expect:?} in\n{stderr}"
        );
    }
}

/// The run's saved config holds the lists auto placement chose on one device (round robin,
/// device 0 for both), not `placement = "auto"`.
fn assert_planned_lists_kept(run_dir: &std::path::Path) {
    let kept = dflash_config::TrainConfig::load(Some(&run_dir.join("config.toml")), &[]).unwrap();
    let p = &kept.pipeline;
    assert_eq!(p.placement, dflash_config::PlacementMode::RoundRobin);
    assert_eq!(p.target_devices, Some(vec![0]));
    assert_eq!(p.drafter_devices, Some(vec![0]));
}
