//! Shared fixtures of the job tests: the tiny samples and their JSONL file, the test job's
//! config, and readers and comparisons of a run's metrics and tensors.

use std::path::{Path, PathBuf};

use dflash_config::TrainConfig;
use dflash_models::safetensors_io::{TensorFiles, write_f32_atomic};
use dflash_pipeline::PipelineError;
use dflash_pipeline::error::cause_chain;
use serde_json::Value;

pub(crate) const TARGET: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../assets/tiny-target");
pub(crate) const TINY_TRAIN: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/../../assets/tiny-data/train");

pub(crate) const MAX_LEN: usize = 64;
pub(crate) const TOKEN_BUDGET: usize = 128;
pub(crate) const SEED: u64 = 7;

pub(crate) fn link() {
    dflash_backend_reference::link();
    dflash_attention_tiled::link();
}

pub(crate) type Samples = Vec<(Vec<u32>, Vec<u8>)>;

/// `n` windows of 40..60 tokens across the prompt/completion boundary of the embedded data:
/// a prompt tail (mask 0) then the target's greedy completion (mask 1).
pub(crate) fn tiny_samples(n: usize) -> Samples {
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
pub(crate) fn config_text(data: &Path, runs: &Path, drafter_extra: &str) -> String {
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

pub(crate) fn config_from(text: &str, overrides: &[(&str, &str)]) -> TrainConfig {
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
pub(crate) struct Fixture {
    tmp: tempfile::TempDir,
}

impl Fixture {
    pub(crate) fn new(samples: &[(Vec<u32>, Vec<u8>)]) -> Self {
        let tmp = tempfile::tempdir().unwrap();
        write_jsonl(&tmp.path().join("train.jsonl"), samples);
        Fixture { tmp }
    }
    pub(crate) fn data(&self) -> PathBuf {
        self.tmp.path().join("train.jsonl")
    }
    pub(crate) fn runs(&self) -> PathBuf {
        self.tmp.path().join("runs")
    }
    pub(crate) fn path(&self) -> &Path {
        self.tmp.path()
    }
    pub(crate) fn config(&self, overrides: &[(&str, &str)]) -> TrainConfig {
        config(&self.data(), &self.runs(), overrides)
    }
}

pub(crate) fn metrics(run_dir: &Path) -> Vec<Value> {
    std::fs::read_to_string(run_dir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Every tensor of a safetensors file as `(name, f32 values)`, sorted by name.
pub(crate) fn tensors(path: &Path) -> Vec<(String, Vec<f32>)> {
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

pub(crate) fn assert_bit_identical(a: &Path, b: &Path) {
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

pub(crate) fn assert_same_records(a: &[Value], b: &[Value]) {
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        for k in DETERMINISTIC_FIELDS {
            assert_eq!(x[k], y[k], "field {k} of step {} differs", x["step"]);
        }
    }
}

pub(crate) fn err_text(e: &PipelineError) -> String {
    cause_chain(e)
}

/// Rewrites the tensors of `files` (as f32) into the file `dst`, `edit` applied to each
/// `(name, shape, values)`; returns whether `edit` said it changed one.
pub(crate) fn rewrite_f32(
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
pub(crate) fn poison_tensor(path: &Path, tensor: &str) {
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
