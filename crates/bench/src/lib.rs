//! Benchmarks of dflash-rs against the measured PyTorch baselines of docs/design.md §4.
//!
//! Written once over `&dyn Backend`, so they run on any registered backend:
//! - DFlash-mask attention (ctx 4096 + 256 blocks, 8192 + 512, 2048 + 128; 32 q / 8 kv heads,
//!   d = 128, block 16) and causal attention (S = 8192, 32 heads), forward and forward +
//!   backward, in TFLOP/s over visible pairs ([`attention`]);
//! - the Qwen3-8B-shape target forward, 4 x 4096 tokens, features of layers [1, 9, 17, 25, 33]
//!   (so it stops after layer 33), in K tok/s ([`target`]);
//! - the drafter training step of the Qwen3-8B recipe (5 layers, S = 3072, 512 anchors,
//!   block 16, k = 5) at batch 1 and 4: K tok/s and peak device memory ([`drafter`]);
//! - the job end to end ([`e2e`]);
//! - decoding with the target as `dflash regenerate` does, batch 1, 16 and 64 ([`generate`]),
//!   against HF `generate` measured in the same run (`BenchOptions::baselines`).
//!
//! Every result carries its baseline and `ratio`, oriented so that > 1.0 is better than the
//! PyTorch stack (ours / baseline for speed, baseline / ours for memory). [`Scale::Smoke`] runs the
//! same code paths on tiny shapes (CI, the reference backend); its ratios are against the same
//! baselines and flagged `"scale": "smoke"`, meaningful only as a check that the suite runs.
//!
//! Timing: warm-up runs, then the median of N runs, with `synchronize()` before each clock read.

pub mod attention;
pub mod baselines;
mod checkpoint;
pub mod drafter;
pub mod e2e;
pub mod gemm;
pub mod generate;
mod load;
pub mod loss;
mod results;
mod rss;
pub mod target;
mod util;

use std::sync::Arc;
use std::time::Instant;

use dflash_core::Backend;
use serde::{Deserialize, Serialize};

pub use baselines::{BASELINES, Baseline, Orientation, baseline};
pub use results::{device_slug, merge_results, read_json, results_slug, write_json};

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error(transparent)]
    Backend(#[from] dflash_core::Error),
    #[error(transparent)]
    Model(#[from] dflash_models::ModelError),
    #[error(transparent)]
    Train(#[from] dflash_training::TrainError),
    #[error(transparent)]
    Config(#[from] dflash_config::ConfigError),
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    #[error(transparent)]
    Pipeline(#[from] dflash_pipeline::PipelineError),
    #[error("benchmark {bench}: {detail}")]
    Invalid { bench: String, detail: String },
}

pub type Result<T, E = BenchError> = std::result::Result<T, E>;

/// Problem sizes: the §4 shapes, or tiny ones over the same code paths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scale {
    /// The shapes of docs/design.md §4 (for a GPU such as the H200).
    Full,
    /// Tiny shapes, same code paths: seconds on the reference backend.
    Smoke,
}

impl Scale {
    pub fn as_str(self) -> &'static str {
        match self {
            Scale::Full => "full",
            Scale::Smoke => "smoke",
        }
    }
}

impl std::fmt::Display for Scale {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Scale {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "full" => Ok(Scale::Full),
            "smoke" => Ok(Scale::Smoke),
            _ => Err(format!("unknown scale {s:?}; expected full or smoke")),
        }
    }
}

/// One measured figure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchResult {
    /// Same as its baseline's name, e.g. `attention.dflash.ctx4096.fwd`.
    pub name: String,
    pub value: f64,
    pub unit: String,
    /// The PyTorch figure of docs/design.md §4 (always the full-scale one).
    #[serde(alias = "anchor")]
    pub baseline: f64,
    /// `value / baseline` (higher is better) or `baseline / value` (lower is better): > 1.0 beats
    /// the baseline.
    pub ratio: f64,
    pub orientation: Orientation,
    pub scale: Scale,
    /// Median wall time of one timed run, seconds.
    pub seconds: f64,
    /// Shapes and what one timed run covers.
    pub detail: String,
    pub backend: String,
    pub device: String,
    pub attention: String,
}

/// What to run and how.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchOptions {
    pub scale: Scale,
    /// Run only results whose name contains this substring, or any of several separated by
    /// commas (`gemm,attention.dflash.ctx4096`).
    pub only: Option<String>,
    /// Override the warm-up runs per figure.
    pub warmup: Option<usize>,
    /// Override the timed runs per figure (the median is reported).
    pub runs: Option<usize>,
    /// Baselines measured in this run (e.g. HF `generate` by `bench/hf_generate.py`), by
    /// figure name: they replace the table's value for that figure.
    pub baselines: Vec<(String, f64)>,
    /// Job config overrides (`key.path`, TOML value) applied to every end-to-end figure after
    /// its own recipe, so a variant of the recipe is timed through the job's own code path.
    pub job_overrides: Vec<(String, String)>,
    /// The `dflash` executable whose `train` runs `load.8b` as a process of its own, so that
    /// the figure counts a user's whole start-up (process, device, kernel compilation).
    /// `None`: the job runs in this process, after the device start-up of earlier figures.
    pub train_exe: Option<std::path::PathBuf>,
    /// The device ordinal the backend was created on: the one-device jobs (`e2e.*.1gpu`,
    /// `load.8b`) run their target and drafter there, and the two-device ones on it and the
    /// next, rather than where the job's round robin would put them (devices 0 and 1).
    pub device: usize,
    /// The backend's worker threads (0: all cores), passed to the jobs as `backend.threads`
    /// so that they run on what the other figures ran on.
    pub threads: usize,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            scale: Scale::Full,
            only: None,
            warmup: None,
            runs: None,
            baselines: Vec::new(),
            job_overrides: Vec::new(),
            train_exe: None,
            device: 0,
            threads: 0,
        }
    }
}

impl BenchOptions {
    pub fn smoke() -> Self {
        BenchOptions {
            scale: Scale::Smoke,
            ..Self::default()
        }
    }
    fn wants(&self, name: &str) -> bool {
        self.only
            .as_deref()
            .is_none_or(|s| s.split(',').any(|part| name.contains(part.trim())))
    }
    /// The parts of `only` that match no figure of the suite (a typo would otherwise run
    /// nothing, or less than asked, without a word).
    pub fn unmatched_only(&self) -> Vec<String> {
        let all = figure_names();
        self.only
            .as_deref()
            .map(|s| {
                s.split(',')
                    .map(str::trim)
                    .filter(|part| !all.iter().any(|n| n.contains(part)))
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    }
    /// The baseline of `name` measured in this run, if one was given.
    pub fn measured_baseline(&self, name: &str) -> Option<f64> {
        self.baselines
            .iter()
            .find(|(n, _)| n == name)
            .map(|&(_, v)| v)
    }
}

/// Warm-up and timed run counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    pub warmup: usize,
    pub runs: usize,
}

/// Runs `f` `warmup` times, then `runs` times, synchronizing the backend around each timed
/// run; returns the median seconds of the timed runs.
pub fn median_seconds(
    b: &dyn Backend,
    t: Timing,
    mut f: impl FnMut() -> Result<()>,
) -> Result<f64> {
    for _ in 0..t.warmup {
        f()?;
    }
    let mut times = Vec::with_capacity(t.runs.max(1));
    for _ in 0..t.runs.max(1) {
        b.synchronize()?;
        let t0 = Instant::now();
        f()?;
        b.synchronize()?;
        times.push(t0.elapsed().as_secs_f64());
    }
    Ok(median(&mut times))
}

/// Median (mean of the middle two for an even count).
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

/// The running suite: backend, options, and the results so far (streamed to a callback).
pub struct Suite<'a> {
    pub backend: Arc<dyn Backend>,
    pub opts: BenchOptions,
    on_result: Box<dyn FnMut(&BenchResult) + 'a>,
    results: Vec<BenchResult>,
    /// Selected figures not measured on this backend or machine, with why.
    skipped: Vec<(String, String)>,
    /// The optimizer's median seconds within each `drafter.step.*.throughput` figure, by name:
    /// a job pays it once a step, not once a document.
    optimizer_s: std::collections::HashMap<String, f64>,
}

impl Suite<'_> {
    /// Whether the figure `name` is selected.
    pub fn wants(&self, name: &str) -> bool {
        self.opts.wants(name)
    }
    /// Whether any of `names` is selected (a group skips its set-up otherwise).
    pub fn wants_any(&self, names: &[String]) -> bool {
        names.iter().any(|n| self.wants(n))
    }
    /// `default` unless overridden by the options.
    pub fn timing(&self, default: Timing) -> Timing {
        Timing {
            warmup: self.opts.warmup.unwrap_or(default.warmup),
            runs: self.opts.runs.unwrap_or(default.runs).max(1),
        }
    }
    /// Notes that the selected figure `name` cannot be measured here, and why (printed now,
    /// and named again by a caller that asked for it: see [`SuiteRun::not_produced`]).
    pub fn skip(&mut self, name: &str, why: String) {
        eprintln!("{name}: skipped: {why}");
        self.skipped.push((name.to_string(), why));
    }
    pub fn b(&self) -> &dyn Backend {
        self.backend.as_ref()
    }

    /// Records the figure `name` (which must be a baseline's name) measured as `value`,
    /// against the baseline measured in this run where one was given, else the table's.
    pub fn record(&mut self, name: &str, value: f64, seconds: f64, detail: String) -> Result<()> {
        let mut a = *baseline(name).ok_or_else(|| BenchError::Invalid {
            bench: name.into(),
            detail: "no baseline of that name in docs/design.md §4".into(),
        })?;
        if let Some(v) = self.opts.measured_baseline(name) {
            a.value = v;
        }
        let b = self.backend.as_ref();
        let r = BenchResult {
            name: name.to_string(),
            value,
            unit: a.unit.to_string(),
            baseline: a.value,
            ratio: a.ratio(value),
            orientation: a.orientation,
            scale: self.opts.scale,
            seconds,
            detail,
            backend: b.name().to_string(),
            device: b.device(),
            attention: b.attention_kernel().to_string(),
        };
        (self.on_result)(&r);
        self.results.push(r);
        Ok(())
    }
}

/// Config keys the bench sets for its jobs itself: the backend (the bench's own, on its device
/// and threads) and the workers' placement (one device, or the two of a `2gpu` figure). An
/// override of one would time a job on other devices than the figure's name and `device`
/// field say.
const BENCH_OWNED_KEYS: &[&str] = &[
    "backend",
    "pipeline.target_devices",
    "pipeline.drafter_devices",
    "pipeline.target_workers",
    "pipeline.drafter_workers",
    "pipeline.placement",
];

/// An error naming the first of `overrides` that would change a key the bench sets for its
/// jobs ([`BENCH_OWNED_KEYS`], or a table holding one such as `pipeline`).
pub fn check_job_overrides(overrides: &[(String, String)]) -> Result<()> {
    for (key, _) in overrides {
        let key = key.trim();
        let owned = BENCH_OWNED_KEYS.iter().any(|owned| {
            key == *owned
                || key.starts_with(&format!("{owned}."))
                || owned.starts_with(&format!("{key}."))
        });
        if owned {
            return Err(BenchError::Invalid {
                bench: "--set".into(),
                detail: format!(
                    "{key} cannot be overridden: the bench sets the jobs' backend and device \
                     placement itself (keys {}) from its own --backend, --attention, --device \
                     and --threads",
                    BENCH_OWNED_KEYS.join(", ")
                ),
            });
        }
    }
    Ok(())
}

/// Every figure name the suite can produce, in run order.
pub fn figure_names() -> Vec<String> {
    let mut v = gemm::figure_names();
    v.extend(loss::figure_names());
    v.extend(attention::figure_names());
    v.extend(target::figure_names());
    v.extend(drafter::figure_names());
    v.extend(e2e::figure_names());
    v.extend(generate::figure_names());
    v
}

/// What a run of the suite gave: the figures measured, those skipped, and the error that
/// stopped it, if one did (the figures measured before it are kept).
#[derive(Debug)]
pub struct SuiteRun {
    pub results: Vec<BenchResult>,
    /// Selected figures that cannot be measured here (too few devices, no memory figures),
    /// with why.
    pub skipped: Vec<(String, String)>,
    pub error: Option<BenchError>,
}

impl SuiteRun {
    /// The parts of `opts.only` that no measured figure matches, each with why (a skip
    /// reason, or the error that stopped the suite before it).
    pub fn not_produced(&self, opts: &BenchOptions) -> Vec<(String, String)> {
        let Some(only) = opts.only.as_deref() else {
            return Vec::new();
        };
        only.split(',')
            .map(str::trim)
            .filter(|part| !self.results.iter().any(|r| r.name.contains(part)))
            .map(|part| {
                let skips: Vec<String> = self
                    .skipped
                    .iter()
                    .filter(|(n, _)| n.contains(part))
                    .map(|(n, why)| format!("{n}: {why}"))
                    .collect();
                let why = match (skips.is_empty(), &self.error) {
                    (false, _) => skips.join("; "),
                    (true, Some(_)) => "the suite stopped on an error first".to_string(),
                    (true, None) => "no figure of that name ran on this backend".to_string(),
                };
                (part.to_string(), why)
            })
            .collect()
    }
}

/// Runs the selected benchmarks on `backend`, calling `on_result` as each figure is measured;
/// an error stops the suite and is returned in place of every figure measured before it (see
/// [`run_suite_partial`] to keep them).
pub fn run_suite<'a>(
    backend: Arc<dyn Backend>,
    opts: &BenchOptions,
    on_result: impl FnMut(&BenchResult) + 'a,
) -> Result<Vec<BenchResult>> {
    let run = run_suite_partial(backend, opts, on_result);
    match run.error {
        Some(e) => Err(e),
        None => Ok(run.results),
    }
}

/// Runs the selected benchmarks on `backend`, calling `on_result` as each figure is measured,
/// until the first error: the figures measured before it are returned with it.
pub fn run_suite_partial<'a>(
    backend: Arc<dyn Backend>,
    opts: &BenchOptions,
    on_result: impl FnMut(&BenchResult) + 'a,
) -> SuiteRun {
    if let Err(e) = check_job_overrides(&opts.job_overrides) {
        return SuiteRun {
            results: Vec::new(),
            skipped: Vec::new(),
            error: Some(e),
        };
    }
    let mut s = Suite {
        backend,
        opts: opts.clone(),
        on_result: Box::new(on_result),
        results: Vec::new(),
        skipped: Vec::new(),
        optimizer_s: Default::default(),
    };
    let error = run_groups(&mut s).err();
    SuiteRun {
        results: s.results,
        skipped: s.skipped,
        error,
    }
}

fn run_groups(s: &mut Suite<'_>) -> Result<()> {
    gemm::run(s)?;
    loss::run(s)?;
    attention::run(s)?;
    target::run(s)?;
    drafter::run(s)?;
    e2e::run(s)?;
    generate::run(s)
}

fn fmt_num(x: f64) -> String {
    if !x.is_finite() {
        format!("{x}")
    } else if x == 0.0 || (1e-2..1e5).contains(&x.abs()) {
        format!("{x:.3}")
    } else {
        format!("{x:.3e}")
    }
}

/// The header line of [`table_row`]'s table.
pub fn table_header() -> String {
    format!(
        "{:<34} {:>11} {:<8} {:>9} {:>10} {:>11}  {}",
        "name", "value", "unit", "baseline", "ratio", "median s", "detail"
    )
}

/// One aligned table line for a result.
pub fn table_row(r: &BenchResult) -> String {
    format!(
        "{:<34} {:>11} {:<8} {:>9} {:>10} {:>11}  {}",
        r.name,
        fmt_num(r.value),
        r.unit,
        fmt_num(r.baseline),
        fmt_num(r.ratio),
        fmt_num(r.seconds),
        r.detail
    )
}

/// The whole table.
pub fn format_table(results: &[BenchResult]) -> String {
    let mut s = table_header();
    for r in results {
        s.push('\n');
        s.push_str(&table_row(r));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::results_slug;

    #[test]
    fn results_slugs_keep_backends_apart_and_cuda_files_named_as_before() {
        let h200 = "cuda:0 (NVIDIA H200, sm_90)";
        assert_eq!(results_slug("cuda", h200), "nvidia-h200");
        assert_eq!(
            results_slug("wgpu", "wgpu:0 (NVIDIA H200, Vulkan)"),
            "wgpu-nvidia-h200"
        );
        assert_eq!(
            results_slug("reference", "cpu (16 threads, all cores)"),
            "reference-16-threads"
        );
    }
}
