//! Several processes as one job: two `dflash train` processes started as a launcher would
//! (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`), one drafter replica
//! each, must train exactly what one process with two replicas trains (the same micro-batch
//! shares, gradients summed in rank order): the same step records, drafter and optimizer
//! state, bit for bit. A failure on one rank must stop the other with the failing rank's
//! error, and the pair must then resume from rank 0's last checkpoint to the same end.

mod common;

use std::process::{Child, Command, Output, Stdio};

use common::{FAULT_ENV, Job, Outcome};

/// Two micro-batches a step, so that each rank (each replica) has a share of every step.
const SHARED: [&str; 1] = ["train.micro_batches_per_step=2"];

/// A port nothing listens on right now.
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// `cmd` as rank `rank` of `world` processes meeting at `port`.
fn as_rank(mut cmd: Command, rank: usize, world: usize, port: u16) -> Command {
    cmd.env("RANK", rank.to_string())
        .env("WORLD_SIZE", world.to_string())
        .env("LOCAL_RANK", rank.to_string())
        .env("MASTER_ADDR", "127.0.0.1")
        .env("MASTER_PORT", port.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Runs run `name` of `job` as two processes (`fault`: `(rank, point)` set on that rank only)
/// and returns each rank's output.
fn run_pair(job: &Job, name: &str, resume: bool, fault: Option<(usize, &str)>) -> Vec<Output> {
    let port = free_port();
    let children: Vec<Child> = (0..2)
        .map(|rank| {
            let mut cmd = as_rank(job.command(name, resume), rank, 2, port);
            if let Some((_, f)) = fault.filter(|(r, _)| *r == rank) {
                cmd.env(FAULT_ENV, f);
            }
            cmd.spawn().expect("the dflash binary starts")
        })
        .collect();
    children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// What two runs must share: every step's record, the drafter and the optimizer state, the
/// trainer state and summary (with the whole run's data counts, gathered from every rank).
fn assert_same_training(a: &Outcome, b: &Outcome, what: &str) {
    assert_eq!(a.records, b.records, "{what}: step records differ");
    assert!(a.model == b.model, "{what}: drafter weights differ");
    assert!(
        a.optimizer == b.optimizer,
        "{what}: optimizer state differs"
    );
    assert_eq!(a.latest, b.latest, "{what}: latest checkpoint differs");
    assert_eq!(
        a.trainer_state, b.trainer_state,
        "{what}: trainer state differs"
    );
    assert_eq!(a.summary, b.summary, "{what}: summary differs");
}

#[test]
fn two_processes_train_what_one_process_with_two_replicas_trains() {
    let job = Job::new().with_sets(&SHARED);
    let one = Job::new().with_sets(&[SHARED[0], "pipeline.drafter_workers=2"]);
    one.finish("one", false);
    let want = Outcome::read(&one.run_dir("one"));

    let outs = run_pair(&job, "two", false, None);
    for (rank, o) in outs.iter().enumerate() {
        assert!(o.status.success(), "rank {rank} failed:\n{}", stderr(o));
        assert!(
            stderr(o).contains(&format!("rank {rank} of 2")),
            "rank {rank} does not say who it is:\n{}",
            stderr(o)
        );
    }
    let dir = job.run_dir("two");
    assert_same_training(&want, &Outcome::read(&dir), "2 processes x 1 replica");
    // Rank 1 keeps its own log beside rank 0's run, and saves nothing.
    let r1 = dir.join("rank-1");
    assert!(
        r1.join("metrics.jsonl").exists(),
        "rank 1 has no metrics.jsonl"
    );
    assert!(!r1.join("checkpoints").exists(), "rank 1 wrote checkpoints");
    // ... but it takes part in each checkpoint's exchange of skip counts, and its clock says
    // so: that time is the checkpoint's, not waiting for features.
    let log = std::fs::read_to_string(r1.join("metrics.jsonl")).unwrap();
    let last: serde_json::Value = serde_json::from_str(log.lines().last().unwrap()).unwrap();
    let spent = last["drafter_phases_s"][0]["checkpoint"].as_f64();
    assert!(
        spent.is_some_and(|s| s > 0.0),
        "rank 1's checkpoint phase after step-3: {spent:?} in {last}"
    );
    assert!(
        !r1.join("model.safetensors").exists(),
        "rank 1 saved a drafter"
    );
}

/// Writes `n` samples of 30..54 tokens, the first 8 unsupervised, to `path`.
fn write_samples(path: &std::path::Path, n: usize) {
    std::fs::write(path, common::sample_lines(n, 0x9E37_79B9_7F4A_7C15)).unwrap();
}

/// Rank 0 alone featurises the evaluation set and measures tau before training, for as long
/// as the set takes (here longer than `pipeline.timeout_secs`): the other rank waits for it
/// instead of timing out in step 0's all-reduce, or on its full feature queues.
#[test]
fn ranks_wait_for_rank_0_to_measure_tau_however_long_it_takes() {
    let job = Job::new();
    let eval = job.config().with_file_name("eval.jsonl");
    write_samples(&eval, 120);
    let sets = [
        SHARED[0].to_string(),
        "pipeline.timeout_secs=1".into(),
        format!("data.eval={:?}", eval.display().to_string()),
        "eval.max_samples=120".into(),
        "train.max_steps=3".into(),
    ];
    let job = job.with_sets(&sets.iter().map(String::as_str).collect::<Vec<_>>());
    let outs = run_pair(&job, "eval", false, None);
    for (rank, o) in outs.iter().enumerate() {
        assert!(o.status.success(), "rank {rank} failed:\n{}", stderr(o));
    }
    let e0 = stderr(&outs[0]);
    assert!(
        e0.contains("kept 120/120") && e0.contains("tau before training"),
        "rank 0 measured no tau:\n{e0}"
    );
}

#[test]
fn a_failing_rank_stops_the_other_and_the_pair_resumes_from_rank_0s_checkpoint() {
    let one = Job::new().with_sets(&[SHARED[0], "pipeline.drafter_workers=2"]);
    one.finish("one", false);
    let want = Outcome::read(&one.run_dir("one"));

    // Either rank failing at step 5 (its 5th step) stops both; rank 0's step-3 checkpoint
    // stays, and the pair resumes from it to the same end.
    for failing in [1, 0] {
        let job = Job::new().with_sets(&SHARED);
        let fault = "fail:drafter-step:0@5";
        let outs = run_pair(&job, "two", false, Some((failing, fault)));
        let injected = format!(
            "rank {failing} drafter replica 0 failed: fault injected by {}",
            fault.replace("fail:", "DFLASH_FAULT=fail:")
        );
        for (rank, o) in outs.iter().enumerate() {
            assert!(!o.status.success(), "rank {rank} succeeded despite {fault}");
            assert!(
                stderr(o).contains(&injected),
                "rank {failing} failing, rank {rank}: expected {injected:?} in\n{}",
                stderr(o)
            );
        }
        let dir = job.run_dir("two");
        let error = std::fs::read_to_string(dir.join("error.txt")).expect("rank 0 wrote error.txt");
        assert!(error.contains(&injected), "rank 0's error.txt: {error}");
        let latest = std::fs::read_to_string(dir.join("checkpoints/latest")).unwrap();
        assert_eq!(latest.trim(), "step-3", "the last good checkpoint is kept");

        let outs = run_pair(&job, "two", true, None);
        for (rank, o) in outs.iter().enumerate() {
            assert!(
                o.status.success(),
                "resumed rank {rank} failed:\n{}",
                stderr(o)
            );
        }
        let what = format!("rank {failing} failed at step 5, resumed");
        assert_same_training(&want, &Outcome::read(&dir), &what);
    }
}

#[test]
fn a_device_collective_the_backend_lacks_stops_every_rank_with_rank_0s_reason() {
    let job = Job::new().with_sets(&[SHARED[0], "pipeline.collective=\"device\""]);
    let outs = run_pair(&job, "device", false, None);
    for (rank, o) in outs.iter().enumerate() {
        assert!(
            !o.status.success(),
            "rank {rank} trained without a device group"
        );
    }
    let e0 = stderr(&outs[0]);
    assert!(
        e0.contains("pipeline.collective = \"device\" across 2 processes on backend reference")
            && e0.contains("host memory only"),
        "rank 0:\n{e0}"
    );
    let e1 = stderr(&outs[1]);
    assert!(
        e1.contains("rank 0 could not make the device group's id"),
        "rank 1:\n{e1}"
    );
}

/// A rank started with another recipe (a per-rank `--set train.seed=$RANK`, a torch habit)
/// would train its replica on other samples from other weights: both ranks refuse to start,
/// each naming the difference.
#[test]
fn ranks_with_different_recipes_refuse_to_start() {
    let job = Job::new().with_sets(&SHARED);
    let port = free_port();
    let children: Vec<Child> = (0..2)
        .map(|rank| {
            let mut cmd = job.command("seeds", false);
            cmd.args(["--set", &format!("train.seed={}", 7 + rank)]);
            as_rank(cmd, rank, 2, port).spawn().unwrap()
        })
        .collect();
    for (rank, c) in children.into_iter().enumerate() {
        let out = c.wait_with_output().unwrap();
        let err = stderr(&out);
        assert!(!out.status.success(), "rank {rank} trained:\n{err}");
        assert!(
            err.contains("train.seed is 7 on rank 0 and 8 on rank 1"),
            "rank {rank}:\n{err}"
        );
    }
}
