//! The fault suite: a run with two target workers and two drafter replicas (gradients
//! all-reduced between them) in which one worker fails, as a device fault would, through
//! `DFLASH_FAULT=fail:POINT@K` (`dflash_models::fault`), or panics, as a bug would
//! (`panic:POINT@K`: the other replica must not be left waiting for it in the all-reduce, nor
//! a target worker on its queue). The failure must stop every worker
//! (none left waiting in the all-reduce or on a queue), exit non-zero with the whole cause
//! chain on stderr and in `RUN_DIR/error.txt`, keep the last good checkpoint intact, and
//! `train --resume` must then end with the losses, drafter, checkpoint and summary of the same
//! run done in one go, bit for bit.
//!
//! The job is `common::Job`'s, with `pipeline.target_workers = 2` and
//! `pipeline.drafter_workers = 2`.

mod common;

use common::{FAULT_ENV, Job, Outcome, STEPS, figures};

const SETS: [&str; 2] = ["pipeline.target_workers=2", "pipeline.drafter_workers=2"];

/// Runs `name` fresh with `DFLASH_FAULT=fault`; it must fail. Returns its stderr.
fn run_failing(job: &Job, name: &str, fault: &str) -> String {
    let out = job
        .command(name, false)
        .env(FAULT_ENV, fault)
        .output()
        .expect("the dflash binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !out.status.success(),
        "run {name} with {fault} succeeded:\n{stderr}"
    );
    stderr
}

#[test]
fn a_failing_worker_stops_every_worker_and_the_run_resumes_from_its_last_checkpoint() {
    let job = Job::new().with_sets(&SETS);
    let (whole_line, _) = job.finish("whole", false);
    let whole = Outcome::read(&job.run_dir("whole"));
    assert_eq!(whole.records.len() as u64, STEPS);

    // (run, fault, the worker it names, the checkpoint left: `None` where the step at which
    // the failure lands depends on which target worker takes which micro-batch, so there may
    // be none yet). The target fault is worker 1's third batch: the two workers share the
    // run's 12 batches, and a later one (its 6th was used) may never come.
    let cases = [
        (
            "drafter",
            "fail:drafter-step:1@5",
            "drafter replica 1",
            Some(3),
        ),
        ("target", "fail:target-batch:1@3", "target worker 1", None),
        (
            "drafter-panic",
            "panic:drafter-step:1@5",
            "drafter replica 1",
            Some(3),
        ),
    ];
    for (name, fault, worker, kept) in cases {
        let stderr = run_failing(&job, name, fault);
        let dir = job.run_dir(name);
        let injected = match fault.starts_with("panic:") {
            true => format!("{worker} failed: panicked: fault injected by DFLASH_FAULT={fault}"),
            false => format!("{worker} failed: fault injected by DFLASH_FAULT={fault}"),
        };
        assert!(
            stderr.contains(&injected),
            "{name}: expected {injected:?} in\n{stderr}"
        );
        let error_txt = std::fs::read_to_string(dir.join("error.txt")).unwrap();
        assert!(
            error_txt.contains(&injected),
            "{name}: error.txt is\n{error_txt}"
        );
        let latest = std::fs::read_to_string(dir.join("checkpoints/latest")).ok();
        if let Some(step) = kept {
            let latest = latest.as_deref().map(str::trim);
            assert_eq!(latest, Some(format!("step-{step}").as_str()), "{name}");
        }
        assert!(
            !dir.join("summary.json").exists(),
            "{name}: a failed run wrote a summary"
        );

        let (line, stderr) = job.finish(name, true);
        let resumed = match &latest {
            Some(l) => format!(
                "resuming {}",
                dir.join("checkpoints").join(l.trim()).display()
            ),
            None => "no checkpoint yet; starting the run from step 0".to_string(),
        };
        assert!(
            stderr.contains(&resumed),
            "{name}: expected {resumed:?} ({latest:?}):\n{stderr}"
        );
        assert_eq!(figures(&line), figures(&whole_line), "{name}");
        let got = Outcome::read(&dir);
        assert!(
            got == whole,
            "{name}: the resumed run differs from the whole one\nwhole: {:?}\ngot:   {:?}",
            (&whole.records, &whole.summary),
            (&got.records, &got.summary),
        );
    }
}
