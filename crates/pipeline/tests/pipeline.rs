//! End-to-end tests of the training job on the embedded tiny target (CPU reference backend)
//! and a small JSONL dataset cut from the embedded tiny data: exact resume, worker-count
//! invariance, determinism, non-finite steps, bad input and failures.
//!
//! One test binary (one link on slow machines); every run is a few seconds at most.

use std::path::{Path, PathBuf};

use dflash_config::TrainConfig;
use dflash_models::checkpoint::load_drafter;
use dflash_models::safetensors_io::{TensorFiles, write_f32_atomic};
use dflash_pipeline::error::cause_chain;
use dflash_pipeline::job::latest_checkpoint;
use dflash_pipeline::schedule::Schedule;
use dflash_pipeline::{PipelineError, train};
use dflash_training::TrainError;
use serde_json::Value;

const TARGET: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../assets/tiny-target");
const TINY_TRAIN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../assets/tiny-data/train");

const MAX_LEN: usize = 64;
const TOKEN_BUDGET: usize = 128;
const SEED: u64 = 7;

fn link() {
    dflash_backend_reference::link();
    dflash_attention_tiled::link();
}

type Samples = Vec<(Vec<u32>, Vec<u8>)>;

/// `n` windows of 40..60 tokens across the prompt/completion boundary of the embedded data:
/// a prompt tail (mask 0) then the target's greedy completion (mask 1).
fn tiny_samples(n: usize) -> Samples {
    let data = dflash_data::open_dataset(TINY_TRAIN).unwrap();
    (0..n)
        .map(|i| {
            let s = data.get(i).unwrap();
            let p0 = s.loss_mask.iter().position(|&m| m != 0).unwrap();
            let len = 40 + (i * 7) % 21;
            let start = p0 - 12 - (i % 8);
            (
                s.ids[start..start + len].to_vec(),
                s.loss_mask[start..start + len].to_vec(),
            )
        })
        .collect()
}

fn write_jsonl(path: &Path, samples: &[(Vec<u32>, Vec<u8>)]) {
    let mut text = String::new();
    for (ids, mask) in samples {
        text += &serde_json::json!({ "input_ids": ids, "loss_mask": mask }).to_string();
        text.push('\n');
    }
    std::fs::write(path, text).unwrap();
}

/// The test job as TOML text; `drafter_extra` replaces the `num_target_features` line.
fn config_text(data: &Path, runs: &Path, drafter_extra: &str) -> String {
    format!(
        r#"
[target]
path = {target:?}

[drafter]
num_layers = 1
block_size = 4
{drafter_extra}

[data]
train = {data:?}
max_len = {MAX_LEN}
bucket_bounds = [{MAX_LEN}]
token_budget = {TOKEN_BUDGET}
num_anchors = 8

[train]
epochs = 2
max_steps = 6
micro_batches_per_step = 1
lr = 3e-3
warmup_ratio = 0.2
seed = {SEED}
save_every = 2
log_every = 100

[backend]
name = "reference"
attention = "tiled"

[pipeline]
target_workers = 1
drafter_workers = 1
queue_capacity = 2
timeout_secs = 60

[run]
dir = {runs:?}
name = "run"
"#,
        target = TARGET,
        data = data.display().to_string(),
        runs = runs.display().to_string(),
    )
}

fn config_from(text: &str, overrides: &[(&str, &str)]) -> TrainConfig {
    let ov: Vec<(String, String)> = overrides
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    TrainConfig::load_toml_str(text, "test", Path::new("/"), &ov).unwrap()
}

fn config(data: &Path, runs: &Path, overrides: &[(&str, &str)]) -> TrainConfig {
    config_from(
        &config_text(data, runs, "num_target_features = 2"),
        overrides,
    )
}

/// A temp dir holding `train.jsonl` (the given samples) and a `runs/` root.
struct Fixture {
    tmp: tempfile::TempDir,
}

impl Fixture {
    fn new(samples: &[(Vec<u32>, Vec<u8>)]) -> Self {
        let tmp = tempfile::tempdir().unwrap();
        write_jsonl(&tmp.path().join("train.jsonl"), samples);
        Fixture { tmp }
    }
    fn data(&self) -> PathBuf {
        self.tmp.path().join("train.jsonl")
    }
    fn runs(&self) -> PathBuf {
        self.tmp.path().join("runs")
    }
    fn path(&self) -> &Path {
        self.tmp.path()
    }
    fn config(&self, overrides: &[(&str, &str)]) -> TrainConfig {
        config(&self.data(), &self.runs(), overrides)
    }
}

fn metrics(run_dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(run_dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Every tensor of a safetensors file as `(name, f32 values)`, sorted by name.
fn tensors(path: &Path) -> Vec<(String, Vec<f32>)> {
    let f = TensorFiles::open_file(path).unwrap();
    f.names()
        .into_iter()
        .map(|n| {
            let shape = f.shape(&n).unwrap();
            let v = f.read_f32(&n, &shape).unwrap();
            (n, v)
        })
        .collect()
}

fn assert_bit_identical(a: &Path, b: &Path) {
    let (ta, tb) = (tensors(a), tensors(b));
    assert_eq!(ta.len(), tb.len());
    for ((na, va), (nb, vb)) in ta.iter().zip(&tb) {
        assert_eq!(na, nb);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert!(
            bits(va) == bits(vb),
            "{na} differs between {} and {}",
            a.display(),
            b.display()
        );
    }
}

/// Fields of a metrics record that must be identical between equivalent runs (everything
/// but wall-clock and queue measurements).
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

fn assert_same_records(a: &[Value], b: &[Value]) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        for k in DETERMINISTIC_FIELDS {
            assert_eq!(x[k], y[k], "field {k} of step {} differs", x["step"]);
        }
    }
}

fn err_text(e: &PipelineError) -> String {
    cause_chain(e)
}

/// Rewrites the tensors of `files` (as f32) into the file `dst`, `edit` applied to each
/// `(name, shape, values)`; returns whether `edit` said it changed one.
fn rewrite_f32(
    files: TensorFiles,
    dst: &Path,
    edit: impl Fn(&str, &[usize], &mut [f32]) -> bool,
) -> bool {
    let mut tensors = Vec::new();
    let mut edited = false;
    for name in files.names() {
        let shape = files.shape(&name).unwrap();
        let mut v = files.read_f32(&name, &shape).unwrap();
        edited |= edit(&name, &shape, &mut v);
        tensors.push((name, shape, v));
    }
    drop(files);
    write_f32_atomic(dst, &tensors, None).unwrap();
    edited
}

/// Rewrites the safetensors file `path` (as f32) with element 5 of `tensor` set to NaN.
fn poison_tensor(path: &Path, tensor: &str) {
    let files = TensorFiles::open_file(path).unwrap();
    let found = rewrite_f32(files, path, |name, _, v| {
        let hit = name == tensor;
        if hit {
            v[5] = f32::NAN;
        }
        hit
    });
    assert!(found, "{tensor} in {path:?}");
}

// ---------------------------------------------------------------------------------------------
// 1. Exact resume.
// ---------------------------------------------------------------------------------------------

/// A run stopped after step 7 of 12 (`train.stop_at_step`: the schedule and LR still span 12
/// steps, and step 7 is in the second epoch) and then resumed gives the same per-step metrics,
/// final weights and optimizer state, bit for bit, as the same run done in one go.
#[test]
fn stopped_then_resumed_run_matches_uninterrupted_run_bit_for_bit() {
    link();
    let fx = Fixture::new(&tiny_samples(24));
    let common = [
        ("train.epochs", "3"),
        ("train.max_steps", "12"),
        ("train.micro_batches_per_step", "2"),
        ("train.save_every", "3"),
    ];
    let a = train(
        &fx.config(&[&common[..], &[("run.name", "whole")]].concat()),
        None,
    )
    .unwrap();
    assert_eq!(a.steps, 12);
    let ma = metrics(&a.run_dir);
    assert_eq!(ma.len(), 12);
    assert_eq!(ma[11]["epoch"], 1, "the run crosses an epoch boundary");
    assert!(ma.iter().all(|r| r["applied"] == true));

    let stop = [
        &common[..],
        &[("run.name", "parts"), ("train.stop_at_step", "7")],
    ]
    .concat();
    let b = train(&fx.config(&stop), None).unwrap();
    assert_eq!(b.steps, 7);
    let ckpt = latest_checkpoint(&b.run_dir).unwrap();
    assert_eq!(
        ckpt.file_name().unwrap(),
        "step-7",
        "a checkpoint at the stop, off the save cadence"
    );
    assert_eq!(metrics(&b.run_dir).len(), 7);
    assert_same_records(&ma[..7], &metrics(&b.run_dir));
    let saved = std::fs::read_to_string(b.run_dir.join("config.toml")).unwrap();
    assert!(
        !saved.contains("stop_at_step"),
        "stop_at_step is not kept in the run directory:\n{saved}"
    );

    let zero = TrainConfig::load_toml_str(
        &config_text(&fx.data(), &fx.runs(), ""),
        "test",
        Path::new("/"),
        &[("train.stop_at_step".into(), "0".into())],
    );
    assert!(zero.unwrap_err().to_string().contains("train.stop_at_step"));

    // Resume with the config the run was started with (as `train --resume` does).
    let resumed = TrainConfig::load(Some(&b.run_dir.join("config.toml")), &[]).unwrap();
    let c = train(&resumed, Some(&b.run_dir)).unwrap();
    assert_eq!(c.steps, 12);
    assert_eq!(c.final_loss, a.final_loss);
    assert_same_records(&ma, &metrics(&b.run_dir));
    assert_bit_identical(
        &a.run_dir.join("model.safetensors"),
        &b.run_dir.join("model.safetensors"),
    );
    let (ca, cb) = (
        latest_checkpoint(&a.run_dir).unwrap(),
        latest_checkpoint(&b.run_dir).unwrap(),
    );
    assert_eq!(ca.file_name().unwrap(), "step-12");
    assert_eq!(cb.file_name().unwrap(), "step-12");
    assert_bit_identical(
        &ca.join("optimizer.safetensors"),
        &cb.join("optimizer.safetensors"),
    );
    let state = |d: &Path| -> Value {
        serde_json::from_str(&std::fs::read_to_string(d.join("trainer_state.json")).unwrap())
            .unwrap()
    };
    assert_eq!(state(&ca), state(&cb));
    assert_eq!(state(&ca)["adam_step"], 12);

    // Resuming the finished run says so and changes nothing: the same outcome, every file
    // of the run directory byte-identical (summary.json keeps its figures).
    let snapshot = |d: &Path| -> Vec<(PathBuf, Vec<u8>)> {
        let mut files = Vec::new();
        let mut dirs = vec![d.to_path_buf()];
        while let Some(dir) = dirs.pop() {
            for e in std::fs::read_dir(&dir).unwrap().flatten() {
                match e.file_type().unwrap().is_dir() {
                    true => dirs.push(e.path()),
                    false => files.push((e.path(), std::fs::read(e.path()).unwrap())),
                }
            }
        }
        files.sort();
        files
    };
    let before = snapshot(&b.run_dir);
    let again = train(&resumed, Some(&b.run_dir)).unwrap();
    assert_eq!((again.steps, again.final_loss), (12, a.final_loss));
    assert_eq!(again.first_loss, c.first_loss);
    assert!(
        snapshot(&b.run_dir) == before,
        "resuming a finished run changed files"
    );

    // trainer_state.json cross-checks: counters that add up to more steps than were run,
    // and a step beyond the schedule, are errors naming the file.
    let ts = cb.join("trainer_state.json");
    let good = std::fs::read_to_string(&ts).unwrap();
    for (edit, says) in [
        (
            ("adam_step", 13),
            "adam_step 13 + nonfinite_run 0 exceed step 12",
        ),
        (
            ("step", 40),
            "step 40 but the checkpoint directory is step-12",
        ),
    ] {
        let mut v: Value = serde_json::from_str(&good).unwrap();
        v[edit.0] = edit.1.into();
        std::fs::write(&ts, v.to_string()).unwrap();
        let e = train(&resumed, Some(&b.run_dir)).unwrap_err().to_string();
        assert!(e.contains(says) && e.contains("trainer_state.json"), "{e}");
    }
    // A consistent checkpoint at step 40 of a 12-step schedule.
    let ckpts = b.run_dir.join("checkpoints");
    std::fs::rename(&cb, ckpts.join("step-40")).unwrap();
    std::fs::write(ckpts.join("latest"), "step-40").unwrap();
    let e = train(&resumed, Some(&b.run_dir)).unwrap_err().to_string();
    assert!(
        e.contains("step 40 is beyond this run's schedule of 12 steps"),
        "{e}"
    );
}

// ---------------------------------------------------------------------------------------------
// 2. Worker counts and determinism.
// ---------------------------------------------------------------------------------------------

/// 1 target + 1 drafter twice: bit-identical. 2 targets + 2 drafter replicas (micro-batch m
/// of a step on replica m % 2, gradients all-reduced): the same losses up to float rounding
/// (the replicas' gradient sums are grouped differently), and weights that stay close.
#[test]
fn two_plus_two_workers_match_one_plus_one_and_runs_are_deterministic() {
    link();
    let fx = Fixture::new(&tiny_samples(24));
    let common = [
        ("train.micro_batches_per_step", "2"),
        ("train.max_steps", "6"),
    ];
    let run = |name: &str, t: &str, d: &str, q: &str| {
        let ov = [
            &common[..],
            &[
                ("run.name", name),
                ("pipeline.target_workers", t),
                ("pipeline.drafter_workers", d),
                ("pipeline.queue_capacity", q),
            ],
        ]
        .concat();
        train(&fx.config(&ov), None).unwrap()
    };
    let a = run("a11", "1", "1", "2");
    let b = run("b11", "1", "1", "2");
    // Queue capacity 1 forces out-of-order arrival and backpressure with two target workers.
    let c = run("c22", "2", "2", "1");
    let (ma, mb, mc) = (
        metrics(&a.run_dir),
        metrics(&b.run_dir),
        metrics(&c.run_dir),
    );
    assert_eq!(ma.len(), 6);
    assert_same_records(&ma, &mb);
    assert_bit_identical(
        &a.run_dir.join("model.safetensors"),
        &b.run_dir.join("model.safetensors"),
    );

    // 2+2 vs 1+1. Loss statistics travel as f32 sums and gradients are summed per replica
    // and then across replicas, so agreement is to float rounding: 1e-4 relative is ~1000x
    // the rounding seen (<= 3e-7), and far below any real difference (a sample lost or counted twice
    // changes a step's loss by percents).
    assert_eq!(mc.len(), 6);
    // Every worker reports a busy fraction of wall time: one per worker, in (0, 1].
    let last = mc.last().unwrap();
    for (key, n) in [("target_busy", 2), ("drafter_busy", 2)] {
        let v = last[key]
            .as_array()
            .unwrap_or_else(|| panic!("{key} missing: {last}"));
        assert_eq!(v.len(), n, "{key}");
        assert!(
            v.iter()
                .all(|x| (0.0..=1.0).contains(&x.as_f64().unwrap()) && x.as_f64().unwrap() > 0.0),
            "{key}: {v:?}"
        );
    }
    // ... and where its time went: every phase of every worker, the working ones non-zero,
    // together no more than the job's wall time.
    for (key, n, names, working) in [
        (
            "target_phases_s",
            2,
            &["wait_work", "target_forward", "push_wait"][..],
            "target_forward",
        ),
        (
            "drafter_phases_s",
            2,
            &[
                "queue_wait",
                "prepare",
                "forward_backward",
                "all_reduce",
                "optimizer",
                "checkpoint",
                "report",
            ][..],
            "forward_backward",
        ),
    ] {
        let workers = last[key]
            .as_array()
            .unwrap_or_else(|| panic!("{key} missing: {last}"));
        assert_eq!(workers.len(), n, "{key}");
        for w in workers {
            let w = w.as_object().unwrap();
            let mut got: Vec<&str> = w.keys().map(String::as_str).collect();
            let mut want = names.to_vec();
            got.sort_unstable();
            want.sort_unstable();
            assert_eq!(got, want, "{key}");
            assert!(w[working].as_f64().unwrap() > 0.0, "{key}: {w:?}");
            let sum: f64 = w.values().map(|x| x.as_f64().unwrap()).sum();
            assert!(
                sum <= last["job_s"].as_f64().unwrap() + 0.5,
                "{key}: {sum} s > job time"
            );
        }
    }
    assert_close_runs(&a.run_dir, &c.run_dir);
}

/// Runs `a` and `c` of one job with different worker counts or routing: the same step
/// records, and losses, grad norms and weights equal to float rounding. Loss statistics
/// travel as f32 sums and gradients are summed per replica and then across replicas, so
/// agreement is to float rounding: 1e-4 relative is ~1000x the rounding seen (<= 3e-7), and
/// far below any real difference (a sample lost or counted twice changes a step's loss by
/// percents).
fn assert_close_runs(a: &Path, c: &Path) {
    let (ma, mc) = (metrics(a), metrics(c));
    assert_eq!(ma.len(), mc.len());
    for (x, y) in ma.iter().zip(&mc) {
        for k in ["step", "epoch", "tokens", "lr"] {
            assert_eq!(x[k], y[k], "{k}");
        }
        let (lx, ly) = (x["loss"].as_f64().unwrap(), y["loss"].as_f64().unwrap());
        assert!(
            (lx - ly).abs() <= 1e-4 * lx.abs(),
            "step {}: loss {lx} vs {ly}",
            x["step"]
        );
        let (gx, gy) = (
            x["grad_norm"].as_f64().unwrap(),
            y["grad_norm"].as_f64().unwrap(),
        );
        assert!(
            (gx - gy).abs() <= 1e-4 * gx.abs(),
            "step {}: grad norm {gx} vs {gy}",
            x["step"]
        );
    }
    // Weights: relative L2 distance per tensor (seen: <= 3e-7). AdamW normalises each
    // coordinate, so a coordinate whose gradient is ~0 can move by up to lr per step on
    // rounding alone; the tensors as a whole must still agree closely.
    let (ta, tc) = (
        tensors(&a.join("model.safetensors")),
        tensors(&c.join("model.safetensors")),
    );
    for ((name, va), (_, vc)) in ta.iter().zip(&tc) {
        let diff: f64 = va
            .iter()
            .zip(vc)
            .map(|(x, y)| ((x - y) as f64).powi(2))
            .sum::<f64>()
            .sqrt();
        let norm: f64 = va.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
        assert!(
            diff <= 1e-5 * norm,
            "{name}: |a - c| = {diff:e}, |a| = {norm:e}"
        );
    }
}

/// Least-loaded routing (one shared feature queue, each micro-batch to whichever replica is
/// free) trains as fixed routing does, to float rounding, with 3 micro-batches a step over
/// 2 replicas (uneven shares) and 2 target workers racing to fill the queue.
#[test]
fn least_loaded_routing_matches_fixed_routing() {
    link();
    let fx = Fixture::new(&tiny_samples(24));
    let run = |name: &str, routing: &str, t: &str, d: &str| {
        let routing = format!("\"{routing}\"");
        let ov = [
            ("train.micro_batches_per_step", "3"),
            ("train.max_steps", "5"),
            ("run.name", name),
            ("pipeline.target_workers", t),
            ("pipeline.drafter_workers", d),
            ("pipeline.queue_capacity", "1"),
            ("pipeline.routing", routing.as_str()),
        ];
        train(&fx.config(&ov), None).unwrap()
    };
    let one = run("one", "fixed", "1", "1");
    let fixed = run("fixed", "fixed", "2", "2");
    let shared = run("shared", "least-loaded", "2", "2");
    assert_eq!(metrics(&shared.run_dir).len(), 5);
    assert_close_runs(&one.run_dir, &shared.run_dir);
    assert_close_runs(&fixed.run_dir, &shared.run_dir);
}

// ---------------------------------------------------------------------------------------------
// 3. Non-finite steps.
// ---------------------------------------------------------------------------------------------

/// The load check is process-wide: tests that switch it off exclude, for that time, the
/// tests that need it on (which hold [`load_check_on`]).
static LOAD_CHECK: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// The load check off until the value drops (the check comes back before the lock goes).
fn load_check_off() -> (
    dflash_models::finite::LoadCheckOff,
    std::sync::RwLockWriteGuard<'static, ()>,
) {
    let guard = LOAD_CHECK.write().unwrap_or_else(|p| p.into_inner());
    (dflash_models::finite::LoadCheckOff::new(), guard)
}

/// The load check on while the guard lives.
fn load_check_on() -> std::sync::RwLockReadGuard<'static, ()> {
    LOAD_CHECK.read().unwrap_or_else(|p| p.into_inner())
}

/// A copy of the tiny target whose embedding row `token` is NaN: any sequence containing
/// `token` gets NaN target features from that position on, and so a NaN drafter gradient
/// (the `fc` weight gradient multiplies every feature row), while sequences without it are
/// untouched. This injects a non-finite step exactly where the test wants one, through the
/// real data path. The loader refuses such a target (the NaN policy, tested in
/// dflash-models), so the tests that use it hold a `LoadCheckOff`; finite weights cannot do
/// it (the models' norms absorb even `f32::MAX`).
fn poisoned_target(dir: &Path, token: usize) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::copy(
        Path::new(TARGET).join("config.json"),
        dir.join("config.json"),
    )
    .unwrap();
    let files = TensorFiles::open(Path::new(TARGET)).unwrap();
    rewrite_f32(files, &dir.join("model.safetensors"), |name, shape, v| {
        let hit = name == "model.embed_tokens.weight";
        if hit {
            let h = shape[1];
            v[token * h..(token + 1) * h].fill(f32::NAN);
        }
        hit
    });
}

/// `--resume` on a directory that no run created says so (not what the config then lacks)
/// and writes nothing there; a run killed before its first checkpoint resumes from step 0 in
/// its own directory, with the records and losses of an uninterrupted run.
#[test]
fn resume_of_a_non_run_dir_says_so_and_a_run_without_checkpoint_starts_over() {
    link();
    let fx = Fixture::new(&tiny_samples(12));
    let cfg = fx.config(&[("train.max_steps", "3"), ("train.save_every", "0")]);
    let empty = fx.path().join("not-a-run");
    std::fs::create_dir_all(&empty).unwrap();
    let e = train(&cfg, Some(&empty)).unwrap_err().to_string();
    assert!(e.contains("not a run directory"), "{e}");
    assert!(std::fs::read_dir(&empty).unwrap().next().is_none());

    let a = train(&cfg, None).unwrap();
    let ma = metrics(&a.run_dir);
    std::fs::remove_dir_all(a.run_dir.join("checkpoints")).unwrap();
    std::fs::remove_file(a.run_dir.join("summary.json")).unwrap();
    let again = train(&cfg, Some(&a.run_dir)).unwrap();
    assert_eq!(again.run_dir, a.run_dir);
    assert_eq!((again.steps, again.final_loss), (3, a.final_loss));
    assert_same_records(&ma, &metrics(&a.run_dir));
}

/// Samples longer than the target's `max_position_embeddings` are skipped and counted, not
/// trained on with positions the target never saw.
#[test]
fn samples_beyond_max_position_embeddings_are_skipped_and_counted() {
    link();
    let samples = tiny_samples(12);
    let longer = samples
        .iter()
        .filter(|s| s.0.len().min(MAX_LEN) > 50)
        .count();
    assert!(longer > 0 && longer < samples.len());
    let fx = Fixture::new(&samples);
    let short = fx.path().join("short-target");
    std::fs::create_dir_all(&short).unwrap();
    let text = std::fs::read_to_string(Path::new(TARGET).join("config.json")).unwrap();
    let mut json: Value = serde_json::from_str(&text).unwrap();
    json["max_position_embeddings"] = 50.into();
    std::fs::write(short.join("config.json"), json.to_string()).unwrap();
    std::fs::copy(
        Path::new(TARGET).join("model.safetensors"),
        short.join("model.safetensors"),
    )
    .unwrap();
    let mut cfg = fx.config(&[("train.epochs", "1")]);
    cfg.target.path = Some(short);
    let out = train(&cfg, None).unwrap();
    assert_eq!(out.skipped_samples, Some(longer as u64));
}

/// `dflash eval` on a drafter with a NaN weight is refused at load (it reported a tau), and
/// eval on data with no usable sequence is an error, never `tau=NaN sequences=0`.
#[test]
fn eval_refuses_a_nan_drafter_and_data_with_nothing_to_measure() {
    link();
    let _check = load_check_on();
    let fx = Fixture::new(&tiny_samples(6));
    let cfg = fx.config(&[("train.max_steps", "2")]);
    let out = train(&cfg, None).unwrap();
    let ok = dflash_pipeline::evaluate(&cfg, &out.run_dir, &fx.data()).unwrap();
    assert!(ok.report.tau.is_finite() && ok.report.sequences > 0);

    // No usable sequence: every loss mask zero.
    let none = fx.path().join("none.jsonl");
    let lines: Vec<String> = tiny_samples(3)
        .iter()
        .map(|(ids, _)| {
            serde_json::json!({ "input_ids": ids, "loss_mask": vec![0; ids.len()] }).to_string()
        })
        .collect();
    std::fs::write(&none, lines.join("\n")).unwrap();
    let e = dflash_pipeline::evaluate(&cfg, &out.run_dir, &none)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("no usable sequence") && e.contains("3 samples skipped"),
        "{e}"
    );

    poison_tensor(&out.run_dir.join("model.safetensors"), "fc.weight");
    let e = dflash_pipeline::evaluate(&cfg, &out.run_dir, &fx.data())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("\"fc.weight\"") && e.contains("non-finite"),
        "{e}"
    );
}

/// The NaN policy on a job's own loads: a checkpoint whose `fc.weight` holds a NaN (the
/// issue's reproduction: it resumed, trained and saved a drafter with NaN weights, exit 0),
/// one whose AdamW moment does, and an `init_from` drafter with a NaN are each refused
/// naming tensor and file, before a step; the checkpoint stays the latest.
#[test]
fn a_non_finite_checkpoint_moment_or_init_from_is_refused_naming_the_tensor() {
    link();
    let _check = load_check_on();
    let fx = Fixture::new(&tiny_samples(8));
    let cfg = fx.config(&[
        ("train.max_steps", "4"),
        ("train.save_every", "0"),
        ("train.stop_at_step", "2"),
    ]);
    let out = train(&cfg, None).unwrap();
    let ckpt = latest_checkpoint(&out.run_dir).unwrap();
    assert_eq!(ckpt.file_name().unwrap(), "step-2");
    let resumed = TrainConfig::load(Some(&out.run_dir.join("config.toml")), &[]).unwrap();
    for (file, tensor) in [
        ("model.safetensors", "fc.weight"),
        ("optimizer.safetensors", "v.fc.weight"),
    ] {
        let path = ckpt.join(file);
        let good = std::fs::read(&path).unwrap();
        poison_tensor(&path, tensor);
        let e = err_text(&train(&resumed, Some(&out.run_dir)).unwrap_err());
        assert!(
            e.contains(&format!("\"{tensor}\"")) && e.contains(file) && e.contains("non-finite"),
            "{e}"
        );
        assert_eq!(metrics(&out.run_dir).len(), 2, "no step ran");
        assert_eq!(latest_checkpoint(&out.run_dir), Some(ckpt.clone()));
        std::fs::write(&path, good).unwrap();
    }

    poison_tensor(&out.run_dir.join("model.safetensors"), "fc.weight");
    let mut init = fx.config(&[("train.max_steps", "2"), ("run.name", "init")]);
    init.drafter.init_from = Some(out.run_dir.clone());
    let e = err_text(&train(&init, None).unwrap_err());
    assert!(
        e.contains("\"fc.weight\"") && e.contains("non-finite"),
        "{e}"
    );
    assert!(!fx.runs().join("init/model.safetensors").exists());
}

/// Empty rows (an Arrow null row reads as one) are never scheduled, so the run's skip counts
/// never see them: the plan counts them, for the data line to report.
#[test]
fn empty_rows_are_counted_by_the_plan() {
    let mut samples = tiny_samples(6);
    samples.insert(2, (Vec::new(), Vec::new()));
    let fx = Fixture::new(&samples);
    let cfg = fx.config(&[("train.max_steps", "2")]);
    let plan = dflash_pipeline::job::JobPlan::new(&cfg).unwrap();
    assert_eq!(plan.empty_samples, 1);
    // The summary says so next to the counts of the rows that were read (the issue: it said
    // every sample was kept).
    link();
    let out = train(&cfg, None).unwrap();
    assert_eq!(out.empty_rows, 1);
    let text = std::fs::read_to_string(out.run_dir.join("summary.json")).unwrap();
    let summary: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(summary["empty_rows"], 1);
    assert_eq!(
        summary["data"]["seen"], summary["data"]["kept"],
        "{summary}"
    );
}

#[test]
fn training_on_nothing_is_an_error_naming_the_skip_counts() {
    link();
    // Every loss mask zero: every sample is skipped as having too few supervised tokens.
    let samples: Samples = tiny_samples(6)
        .into_iter()
        .map(|(ids, m)| {
            let n = m.len();
            (ids, vec![0; n])
        })
        .collect();
    let fx = Fixture::new(&samples);
    let e = train(&fx.config(&[("train.max_steps", "2")]), None)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("trained on nothing")
            && e.contains("kept 0/4; skipped 4: 4 too few supervised tokens"),
        "{e}"
    );
    // Kept samples, but a min_supervised no sample reaches.
    let fx = Fixture::new(&tiny_samples(6));
    let cfg = fx.config(&[("train.max_steps", "2"), ("data.min_supervised", "100000")]);
    let e = train(&cfg, None).unwrap_err().to_string();
    assert!(
        e.contains("trained on nothing") && e.contains("kept 0/"),
        "{e}"
    );
    assert!(
        !fx.runs().join("run/model.safetensors").exists(),
        "no untrained drafter is saved as the run's result"
    );
    // Every sample with an id beyond the 264-token vocabulary, or of one token.
    for (name, samples, says) in [
        (
            "oov",
            tiny_samples(6)
                .into_iter()
                .map(|(mut ids, m)| {
                    ids[3] = 300;
                    (ids, m)
                })
                .collect::<Samples>(),
            "position 3, id 300 >= vocab_size 264)",
        ),
        (
            "one-token",
            (0..6).map(|i| (vec![10 + i], vec![1])).collect(),
            "too few supervised tokens",
        ),
    ] {
        let fx = Fixture::new(&samples);
        let e = train(&fx.config(&[("train.max_steps", "2")]), None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("trained on nothing") && e.contains("kept 0/") && e.contains(says),
            "{name}: {e}"
        );
    }
}

#[test]
fn non_finite_steps_are_skipped_then_stop_the_run_keeping_a_good_checkpoint() {
    link();
    const POISON: u32 = 260; // an unused row of the 264-token vocabulary
    let mut samples = tiny_samples(24);
    // Which samples each step trains on: the schedule is a pure function of lengths and seed.
    let lengths: Vec<usize> = samples.iter().map(|s| s.0.len().min(MAX_LEN)).collect();
    let (schedule, _) = Schedule::new(&lengths, &[MAX_LEN], TOKEN_BUDGET, SEED, 2, 1, Some(8));
    assert_eq!(schedule.len(), 8);
    // Steps 0, 1, 3, 7 clean; 2 isolated bad step; 4, 5, 6 consecutive bad steps.
    for step in [2, 4, 5, 6] {
        for &i in schedule.steps[step].micro.iter().flatten() {
            let p0 = samples[i].1.iter().position(|&m| m != 0).unwrap();
            samples[i].0[p0 + 3] = POISON;
        }
    }
    let fx = Fixture::new(&samples);
    let bad_target = fx.path().join("poisoned-target");
    poisoned_target(&bad_target, POISON as usize);
    let ov = [
        ("train.max_steps", "8"),
        ("train.max_nonfinite_steps", "3"),
        ("train.save_every", "2"),
    ];
    let mut cfg = fx.config(&ov);
    cfg.target.path = Some(bad_target);
    let check_off = load_check_off();
    let err = train(&cfg, None).unwrap_err();
    drop(check_off);
    match &err {
        PipelineError::Worker { worker, source } => {
            assert_eq!(worker, "drafter replica 0");
            assert!(
                matches!(
                    **source,
                    PipelineError::Train(TrainError::NonFinite {
                        count: 3,
                        limit: 3,
                        step: 6,
                        ..
                    })
                ),
                "{source:?}"
            );
        }
        other => panic!("expected a worker error, got {other:?}"),
    }
    let run_dir = fx.runs().join("run");
    let text = std::fs::read_to_string(run_dir.join("error.txt")).unwrap();
    assert!(
        text.starts_with("error: drafter replica 0 failed:"),
        "{text}"
    );
    assert!(
        text.contains(
            "3 consecutive steps had a non-finite loss or gradient (limit 3); last at step 6"
        ),
        "{text}"
    );
    assert!(
        text.contains("caused by:"),
        "error.txt holds the cause chain:\n{text}"
    );
    assert!(
        text.contains("the target's features were already non-finite"),
        "the error says where the NaN came from:\n{text}"
    );

    // Steps 0..=5 were reported (step 6 failed before its record); the bad ones skipped.
    let m = metrics(&run_dir);
    let applied: Vec<bool> = m.iter().map(|r| r["applied"].as_bool().unwrap()).collect();
    assert_eq!(applied, [true, true, false, true, false, false]);
    for r in &m {
        let finite = r["loss"].as_f64().is_some_and(f64::is_finite)
            && r["grad_norm"].as_f64().is_some_and(f64::is_finite);
        assert_eq!(finite, r["applied"] == true, "{r}");
    }

    // The last good checkpoint: after step index 5 (save_every 2), AdamW has applied 3
    // updates (steps 0, 1, 3), and two non-finite steps are pending.
    let ckpt = latest_checkpoint(&run_dir).unwrap();
    assert_eq!(ckpt.file_name().unwrap(), "step-6");
    let state: Value =
        serde_json::from_str(&std::fs::read_to_string(ckpt.join("trainer_state.json")).unwrap())
            .unwrap();
    assert_eq!(state["step"], 6);
    assert_eq!(state["adam_step"], 3);
    assert_eq!(state["nonfinite_run"], 2);
    let b = dflash_core::registry::create_backend("reference", &Default::default()).unwrap();
    let (_, params) = load_drafter(b.as_ref(), &ckpt).unwrap();
    for t in params.tensors() {
        assert!(b.download(t).unwrap().iter().all(|x| x.is_finite()));
    }
    for (name, v) in tensors(&ckpt.join("optimizer.safetensors")) {
        assert!(v.iter().all(|x| x.is_finite()), "{name}");
    }

    // And it resumes: with the healthy target, steps 6 and 7 train and the run completes.
    let good = fx.config(&ov);
    let out = train(&good, Some(&run_dir)).unwrap();
    assert_eq!(out.steps, 8);
    assert!(
        !run_dir.join("error.txt").exists(),
        "a successful resume clears error.txt"
    );
    let m = metrics(&run_dir);
    let steps: Vec<u64> = m.iter().map(|r| r["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, (0..8).collect::<Vec<_>>(), "one record per step");
    assert!(m[6]["applied"] == true && m[7]["applied"] == true);
}

/// After a failure between checkpoints, the resumed run repeats the steps after the last
/// checkpoint: metrics.jsonl keeps one record per step (the repeated ones identical).
#[test]
fn resume_after_failure_between_checkpoints_keeps_one_record_per_step() {
    link();
    const POISON: u32 = 261;
    let mut samples = tiny_samples(24);
    let lengths: Vec<usize> = samples.iter().map(|s| s.0.len().min(MAX_LEN)).collect();
    let (schedule, _) = Schedule::new(&lengths, &[MAX_LEN], TOKEN_BUDGET, SEED, 2, 1, Some(6));
    for &i in schedule.steps[3].micro.iter().flatten() {
        let p0 = samples[i].1.iter().position(|&m| m != 0).unwrap();
        samples[i].0[p0 + 1] = POISON;
    }
    let fx = Fixture::new(&samples);
    let bad_target = fx.path().join("poisoned-target");
    poisoned_target(&bad_target, POISON as usize);
    let ov = [
        ("train.max_nonfinite_steps", "1"),
        ("train.save_every", "2"),
    ];
    let mut cfg = fx.config(&ov);
    cfg.target.path = Some(bad_target);
    let check_off = load_check_off();
    train(&cfg, None).unwrap_err();
    drop(check_off);
    let run_dir = fx.runs().join("run");
    let before = metrics(&run_dir);
    assert_eq!(before.len(), 3, "steps 0..=2 reported, step 3 failed");
    assert_eq!(
        latest_checkpoint(&run_dir).unwrap().file_name().unwrap(),
        "step-2"
    );

    // Resume from step 2 with the healthy target: step 2 runs again.
    train(&fx.config(&ov), Some(&run_dir)).unwrap();
    let after = metrics(&run_dir);
    let steps: Vec<u64> = after.iter().map(|r| r["step"].as_u64().unwrap()).collect();
    assert_eq!(steps, (0..6).collect::<Vec<_>>());
    assert_same_records(&before, &after[..3]);
}

// ---------------------------------------------------------------------------------------------
// 4. Bad input and failures.
// ---------------------------------------------------------------------------------------------

#[test]
fn missing_dataset_is_an_error_naming_the_path_and_written_to_error_txt() {
    link();
    let fx = Fixture::new(&tiny_samples(4));
    let missing = fx.path().join("no-such-data.jsonl");
    let mut cfg = fx.config(&[]);
    cfg.data.train = Some(missing.clone());
    let e = err_text(&train(&cfg, None).unwrap_err());
    assert!(e.contains(&missing.display().to_string()), "{e}");
    let saved = std::fs::read_to_string(fx.runs().join("run/error.txt")).unwrap();
    assert!(saved.contains(&missing.display().to_string()), "{saved}");
}

#[test]
fn truncated_arrow_file_is_an_error_naming_the_file() {
    link();
    let fx = Fixture::new(&tiny_samples(4));
    let dir = fx.path().join("corrupt");
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["state.json", "dataset_info.json"] {
        std::fs::copy(Path::new(TINY_TRAIN).join(f), dir.join(f)).unwrap();
    }
    let arrow = std::fs::read(Path::new(TINY_TRAIN).join("data-00000-of-00001.arrow")).unwrap();
    let file = dir.join("data-00000-of-00001.arrow");
    std::fs::write(&file, &arrow[..arrow.len() / 2 + 13]).unwrap();
    let mut cfg = fx.config(&[]);
    cfg.data.train = Some(dir);
    let e = err_text(&train(&cfg, None).unwrap_err());
    assert!(e.contains(&file.display().to_string()), "{e}");
    assert!(e.contains("truncated") || e.contains("corrupt"), "{e}");
}

#[test]
fn drafter_init_with_another_hidden_size_is_a_clear_error() {
    link();
    let fx = Fixture::new(&tiny_samples(4));
    // A complete, valid drafter directory for a target of hidden size 64.
    let mut small =
        dflash_config::Qwen3Config::from_file(Path::new(TARGET).join("config.json")).unwrap();
    small.hidden_size = 64;
    small.head_dim = 16;
    let shape = dflash_config::DrafterShape {
        num_layers: 1,
        block_size: 4,
        num_target_features: 2,
        dtype: dflash_config::DType::Float32,
        ..dflash_config::DrafterShape::standard(256)
    };
    let dcfg = dflash_config::DrafterConfig::for_target(&small, &shape).unwrap();
    let b = dflash_core::registry::create_backend("reference", &Default::default()).unwrap();
    let params = dflash_models::DrafterParams::init_random(b.as_ref(), &dcfg, 0.02, 0).unwrap();
    let dir = fx.path().join("drafter-h64");
    dflash_models::checkpoint::save_drafter(b.as_ref(), &dir, &dcfg, &params).unwrap();

    let mut cfg = fx.config(&[]);
    cfg.drafter.init_from = Some(dir);
    let e = err_text(&train(&cfg, None).unwrap_err());
    assert!(
        e.contains("hidden_size") && e.contains("64") && e.contains("128"),
        "{e}"
    );
}

#[test]
fn target_layer_ids_out_of_range_is_a_clear_error() {
    link();
    let fx = Fixture::new(&tiny_samples(4));
    let cfg = config_from(
        &config_text(&fx.data(), &fx.runs(), "target_layer_ids = [1, 9]"),
        &[],
    );
    let e = err_text(&train(&cfg, None).unwrap_err());
    assert!(e.contains("layer 9") && e.contains("out of range"), "{e}");
}

#[test]
fn unknown_backend_or_attention_kernel_lists_the_registered_names() {
    link();
    let fx = Fixture::new(&tiny_samples(4));
    let e = err_text(&train(&fx.config(&[("backend.name", "no-such-backend")]), None).unwrap_err());
    assert!(
        e.contains("no-such-backend") && e.contains("reference"),
        "{e}"
    );
    let e =
        err_text(&train(&fx.config(&[("backend.attention", "no-such-kernel")]), None).unwrap_err());
    assert!(
        e.contains("no-such-kernel") && e.contains("reference") && e.contains("tiled"),
        "{e}"
    );
}

#[test]
fn plugins_paths_register_kernels_by_name_and_a_missing_library_is_named() {
    link();
    let fx = Fixture::new(&tiny_samples(4));
    let e = err_text(
        &train(
            &fx.config(&[("plugins.paths", "[\"/no/such/libplugin.so\"]")]),
            None,
        )
        .unwrap_err(),
    );
    assert!(
        e.contains("plugins.paths") && e.contains("/no/such/libplugin.so"),
        "{e}"
    );
    // The C example plugin, loaded from the list, serves `backend.attention` by its own name.
    let lib = format!("[{:?}]", dflash_plugin_c_attention::LIBRARY);
    let cfg = fx.config(&[
        ("plugins.paths", lib.as_str()),
        ("backend.attention", "c-attention"),
        ("train.max_steps", "2"),
    ]);
    let out = train(&cfg, None).expect("a job through the C plugin");
    assert!(out.final_loss.is_finite() && out.final_loss > 0.0);
}

// ---------------------------------------------------------------------------------------------
// 5. Bad samples are skipped and counted.
// ---------------------------------------------------------------------------------------------

fn with_bad_samples() -> (Samples, usize, usize) {
    let mut samples = tiny_samples(24);
    let good = samples[0].clone();
    // Two out-of-vocabulary ids (vocabulary 264).
    for k in [0, 1] {
        let mut s = good.clone();
        s.0[10 + k] = 300 + k as u32;
        samples.push(s);
    }
    // Two with too few supervised tokens: none, and a single one (no anchor possible).
    let mut none = good.clone();
    none.1.fill(0);
    samples.push(none);
    let mut one = good.clone();
    one.1.fill(0);
    one.1[30] = 1;
    samples.push(one);
    // Two longer than max_len (64).
    let data = dflash_data::open_dataset(TINY_TRAIN).unwrap();
    let (too_long, mut long_samples) = (2, Vec::new());
    for i in 100..100 + too_long {
        let s = data.get(i).unwrap();
        let p0 = s.loss_mask.iter().position(|&m| m != 0).unwrap();
        let r = p0 - 20..p0 - 20 + 80;
        long_samples.push((s.ids[r.clone()].to_vec(), s.loss_mask[r].to_vec()));
    }
    samples.extend(long_samples);
    (samples, 4, too_long)
}

#[test]
fn bad_samples_are_skipped_counted_and_training_completes() {
    link();
    let (samples, always_bad, too_long) = with_bad_samples();
    let fx = Fixture::new(&samples);
    // One epoch, no step limit: every sample is seen exactly once.
    let base = [("train.epochs", "1"), ("train.save_every", "0")];
    let summary = |name: &str| -> Value {
        let p = fx.runs().join(name).join("summary.json");
        serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
    };

    let skip = train(
        &fx.config(
            &[
                &base[..],
                &[
                    ("train.max_steps", "1000"),
                    ("data.too_long", "skip"),
                    ("run.name", "skip"),
                ],
            ]
            .concat(),
        ),
        None,
    )
    .unwrap();
    assert_eq!(skip.skipped_samples, Some((always_bad + too_long) as u64));
    assert_eq!(
        summary("skip")["skipped_samples"],
        (always_bad + too_long) as u64
    );
    assert!(skip.steps > 0 && skip.final_loss.is_finite());
    assert!(skip.run_dir.join("model.safetensors").exists());

    // Truncation keeps the long samples (counted as truncated, not skipped).
    let trunc = train(
        &fx.config(
            &[
                &base[..],
                &[
                    ("train.max_steps", "1000"),
                    ("data.too_long", "truncate"),
                    ("run.name", "trunc"),
                ],
            ]
            .concat(),
        ),
        None,
    )
    .unwrap();
    assert_eq!(trunc.skipped_samples, Some(always_bad as u64));
    assert_eq!(summary("trunc")["skipped_samples"], always_bad as u64);
}

// ---------------------------------------------------------------------------------------------
// Config semantics the job must honour.
// ---------------------------------------------------------------------------------------------

/// `drafter.target_layer_ids` alone: `num_target_features` defaults to their count.
#[test]
fn target_layer_ids_alone_define_the_number_of_features() {
    link();
    let fx = Fixture::new(&tiny_samples(8));
    let cfg = config_from(
        &config_text(&fx.data(), &fx.runs(), "target_layer_ids = [2, 6]"),
        &[("train.max_steps", "2")],
    );
    let out = train(&cfg, None).unwrap();
    let saved: Value =
        serde_json::from_str(&std::fs::read_to_string(out.run_dir.join("config.json")).unwrap())
            .unwrap();
    assert_eq!(
        saved["dflash_config"]["target_layer_ids"],
        serde_json::json!([2, 6])
    );
}

/// `train.epochs = 0` with `train.max_steps` (which the config accepts): as many epochs as
/// the step count needs.
#[test]
fn zero_epochs_with_max_steps_runs_max_steps() {
    let lengths = vec![50usize; 10]; // 5 batches of 2 per epoch
    let (s, _) = Schedule::new(&lengths, &[MAX_LEN], TOKEN_BUDGET, SEED, 0, 1, Some(12));
    assert_eq!(s.len(), 12);
    assert_eq!(s.steps[4].epoch, 0);
    assert_eq!(s.steps[5].epoch, 1);
    assert_eq!(s.steps[11].epoch, 2);
    // Epoch-bounded schedules are unchanged: 2 epochs of 5, then truncated.
    let (two, _) = Schedule::new(&lengths, &[MAX_LEN], TOKEN_BUDGET, SEED, 2, 1, None);
    assert_eq!(two.len(), 10);
    let (cut, _) = Schedule::new(&lengths, &[MAX_LEN], TOKEN_BUDGET, SEED, 2, 1, Some(7));
    assert_eq!(cut.steps, two.steps[..7]);
    let (none, _) = Schedule::new(&[], &[MAX_LEN], TOKEN_BUDGET, SEED, 0, 1, Some(5));
    assert!(
        none.is_empty(),
        "an empty dataset plans nothing (and does not loop)"
    );

    link();
    let fx = Fixture::new(&tiny_samples(6));
    let out = train(
        &fx.config(&[("train.epochs", "0"), ("train.max_steps", "5")]),
        None,
    )
    .unwrap();
    assert_eq!(out.steps, 5);
    let m = metrics(&out.run_dir);
    assert_eq!(m.last().unwrap()["epoch"], 1);
}

/// `drafter.save_dtype = "bfloat16"`: the served drafter in the run directory is bf16 (as the
/// published drafters are) and says so in its config; the resumable checkpoint keeps the f32
/// master weights, and the served values are exactly those rounded.
#[test]
fn served_drafter_is_saved_in_the_asked_dtype_and_checkpoints_stay_f32() {
    link();
    let fx = Fixture::new(&tiny_samples(8));
    let cfg = fx.config(&[
        ("train.max_steps", "2"),
        ("train.save_every", "2"),
        ("drafter.save_dtype", "\"bfloat16\""),
    ]);
    let out = train(&cfg, None).unwrap();
    let dtypes = |path: &Path| -> Vec<safetensors::Dtype> {
        let bytes = std::fs::read(path).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        st.tensors().into_iter().map(|(_, v)| v.dtype()).collect()
    };
    let served = out.run_dir.join("model.safetensors");
    assert!(
        dtypes(&served)
            .iter()
            .all(|d| *d == safetensors::Dtype::BF16)
    );
    let saved: Value =
        serde_json::from_str(&std::fs::read_to_string(out.run_dir.join("config.json")).unwrap())
            .unwrap();
    assert_eq!(saved["dtype"], "bfloat16");
    let latest = std::fs::read_to_string(out.run_dir.join("checkpoints/latest")).unwrap();
    let ckpt = out.run_dir.join("checkpoints").join(latest.trim());
    let master = ckpt.join("model.safetensors");
    assert!(
        dtypes(&master)
            .iter()
            .all(|d| *d == safetensors::Dtype::F32)
    );
    for ((n, s), (m, f)) in tensors(&served).iter().zip(tensors(&master)) {
        assert_eq!(n, &m);
        let rounded: Vec<f32> = f
            .iter()
            .map(|&x| half::bf16::from_f32(x).to_f32())
            .collect();
        assert_eq!(s, &rounded, "{n}");
    }
    // A bad value is an error naming the key.
    let err = TrainConfig::load_toml_str(
        &config_text(&fx.data(), &fx.runs(), "save_dtype = \"int8\""),
        "test",
        Path::new("/"),
        &[],
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("save_dtype") || err.contains("int8"), "{err}");
}
