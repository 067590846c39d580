//! The test job of the binary's tests: a 1-layer drafter on the embedded tiny target, 12
//! steps over two epochs of 16 synthetic samples (and 2 that are skipped), a checkpoint every 3 steps (step-3, step-6,
//! step-9, step-12); a run takes well under a second. Runs the `dflash` binary to the end,
//! or until a fault point where it is killed.
#![allow(dead_code)] // each test binary uses its part

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_dflash");
pub const TARGET: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../assets/tiny-target");
pub const STEPS: u64 = 12;
/// How long a run may take to reach its fault point or to finish before the test gives up.
pub const PATIENCE: Duration = Duration::from_secs(120);
pub const FAULT_ENV: &str = "DFLASH_FAULT";

/// A temp dir with the job's data and config; runs go to `runs/NAME`.
pub struct Job {
    tmp: tempfile::TempDir,
    /// `--set` overrides every fresh run of this job gets.
    sets: Vec<String>,
}

impl Job {
    pub fn new() -> Job {
        let tmp = tempfile::tempdir().unwrap();
        let mut text = sample_lines(16, 0x2545_F491_4F6C_DD1D);
        // Two samples every run skips (counted at each visit): an id beyond the tiny target's
        // 264-token vocabulary, and no supervised token.
        for (ids, mask) in [
            (vec![5u32, 300, 7, 9], vec![1u8; 4]),
            (vec![5, 6, 7], vec![0; 3]),
        ] {
            text += &serde_json::json!({ "input_ids": ids, "loss_mask": mask }).to_string();
            text.push('\n');
        }
        let data = tmp.path().join("train.jsonl");
        std::fs::write(&data, text).unwrap();
        let config = format!(
            r#"
[target]
path = {TARGET:?}

[drafter]
num_layers = 1
block_size = 4
num_target_features = 2

[data]
train = {data:?}
eval = {data:?}
max_len = 64
bucket_bounds = [64]
token_budget = 128
num_anchors = 8

[train]
epochs = 2
max_steps = {STEPS}
lr = 3e-3
warmup_ratio = 0.2
seed = 7
save_every = 3
log_every = 100

[eval]
max_samples = 4

[backend]
name = "reference"
attention = "tiled"
threads = 1

[pipeline]
queue_capacity = 2
timeout_secs = 60

[run]
dir = {runs:?}
"#,
            data = data.display().to_string(),
            runs = tmp.path().join("runs").display().to_string(),
        );
        std::fs::write(tmp.path().join("job.toml"), config).unwrap();
        Job {
            tmp,
            sets: Vec::new(),
        }
    }

    /// The job with `KEY=VALUE` overrides on every fresh run.
    pub fn with_sets(mut self, sets: &[&str]) -> Job {
        self.sets = sets.iter().map(|s| s.to_string()).collect();
        self
    }

    /// The training (and evaluation) data, JSONL.
    pub fn data(&self) -> PathBuf {
        self.tmp.path().join("train.jsonl")
    }

    /// The job's config file.
    pub fn config(&self) -> PathBuf {
        self.tmp.path().join("job.toml")
    }

    pub fn run_dir(&self, name: &str) -> PathBuf {
        self.tmp.path().join("runs").join(name)
    }

    /// `dflash train` of the run `name`: a fresh one, or `--resume` of its directory.
    pub fn command(&self, name: &str, resume: bool) -> Command {
        let mut c = Command::new(BIN);
        c.arg("train");
        match resume {
            true => c.arg("--resume").arg(self.run_dir(name)),
            false => c
                .arg("--config")
                .arg(self.config())
                .args(["--set", &format!("run.name={name}")])
                .args(self.sets.iter().flat_map(|s| ["--set", s.as_str()])),
        };
        c.env_remove(FAULT_ENV).stdin(Stdio::null());
        c
    }

    /// Runs to the end; returns the outcome line (`run_dir=... loss_first=...`) and stderr.
    pub fn finish(&self, name: &str, resume: bool) -> (String, String) {
        let out = self
            .command(name, resume)
            .output()
            .expect("the dflash binary runs");
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        );
        assert!(
            out.status.success(),
            "run {name} (resume {resume}) failed: {}\n{stderr}",
            out.status
        );
        let line = stdout
            .lines()
            .find(|l| l.starts_with("run_dir="))
            .unwrap_or_else(|| panic!("no outcome line in:\n{stdout}"))
            .to_string();
        (line, stderr)
    }

    /// Starts the run with `DFLASH_FAULT=fault`, waits until it stops there, and kills it
    /// with SIGKILL.
    pub fn kill_at(&self, name: &str, resume: bool, fault: &str) {
        let mut child = self
            .command(name, resume)
            .env(FAULT_ENV, fault)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("the dflash binary starts");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            let mut seen = String::new();
            for line in BufReader::new(stderr).lines().map_while(|l| l.ok()) {
                let at = line.starts_with(&format!("{FAULT_ENV}: at "));
                seen += &line;
                seen.push('\n');
                if at {
                    let _ = tx.send(());
                }
            }
            seen
        });
        let reached = rx.recv_timeout(PATIENCE).is_ok();
        child.kill().unwrap();
        let status = child.wait().unwrap();
        let seen = reader.join().unwrap();
        assert!(
            reached,
            "run {name} never reached {fault} ({status}):\n{seen}"
        );
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(9), "killed by SIGKILL at {fault}");
    }
}

/// Fields of a metrics record that an interrupted run must reproduce exactly (the others
/// are wall-clock and queue measurements).
const DETERMINISTIC_FIELDS: [&str; 8] = [
    "step",
    "epoch",
    "loss",
    "accuracy",
    "lr",
    "grad_norm",
    "applied",
    "tokens",
];

/// Summary fields that are the run's, whatever interrupted it (`invocation_*` are the last
/// invocation's).
const SUMMARY_FIELDS: [&str; 8] = [
    "steps",
    "final_loss",
    "final_accuracy",
    "first_loss",
    "tau_before",
    "tau_after",
    "skipped_samples",
    "data",
];

/// What a run leaves that an interrupted run must reproduce.
#[derive(Debug, PartialEq)]
pub struct Outcome {
    /// The deterministic fields of each step's record, in file order.
    pub records: Vec<Vec<Value>>,
    pub model: Vec<u8>,
    pub latest: String,
    pub optimizer: Vec<u8>,
    pub trainer_state: Value,
    pub summary: Vec<Value>,
    /// Checkpoint directories left (only the latest should be).
    pub checkpoints: Vec<String>,
}

impl Outcome {
    pub fn read(run_dir: &Path) -> Outcome {
        let records = std::fs::read_to_string(run_dir.join("metrics.jsonl"))
            .unwrap()
            .lines()
            .map(|l| {
                let v: Value = serde_json::from_str(l).unwrap();
                DETERMINISTIC_FIELDS.iter().map(|k| v[k].clone()).collect()
            })
            .collect();
        let ckpts = run_dir.join("checkpoints");
        let latest = std::fs::read_to_string(ckpts.join("latest")).unwrap();
        let ckpt = ckpts.join(latest.trim());
        let summary: Value =
            serde_json::from_str(&std::fs::read_to_string(run_dir.join("summary.json")).unwrap())
                .unwrap();
        let mut checkpoints: Vec<String> = std::fs::read_dir(&ckpts)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("step-"))
            .collect();
        checkpoints.sort();
        Outcome {
            records,
            model: std::fs::read(run_dir.join("model.safetensors")).unwrap(),
            latest,
            optimizer: std::fs::read(ckpt.join("optimizer.st")).unwrap(),
            trainer_state: serde_json::from_str(
                &std::fs::read_to_string(ckpt.join("trainer_state.json")).unwrap(),
            )
            .unwrap(),
            summary: SUMMARY_FIELDS.iter().map(|k| summary[k].clone()).collect(),
            checkpoints,
        }
    }
}

/// The outcome line without its `run_dir=...` field.
pub fn figures(line: &str) -> &str {
    line.split_once(' ').map_or("", |(_, rest)| rest)
}

/// `n` deterministic JSONL samples of 30..54 byte tokens (from `seed`), the first 8 of each
/// unsupervised, one per line.
pub fn sample_lines(n: usize, seed: u64) -> String {
    let mut x = seed;
    let mut text = String::new();
    for i in 0..n {
        let len = 30 + i % 25;
        let ids: Vec<u32> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % 256) as u32
            })
            .collect();
        let mask: Vec<u8> = (0..len).map(|j| u8::from(j >= 8)).collect();
        text += &serde_json::json!({ "input_ids": ids, "loss_mask": mask }).to_string();
        text.push('\n');
    }
    text
}
