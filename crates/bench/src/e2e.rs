//! The job itself, end to end: `dflash train`'s own code (loader, target worker, bounded
//! queue, drafter replica with `finish_step`, reporting and the final checkpoint), run through
//! [`dflash_pipeline::job::train_plan`] on the bench's backend by name, on synthetic data.
//!
//! - `e2e.8b.1gpu`: the 8B recipe (`configs/qwen3-8b.toml`) with a random-weight
//!   Qwen3-8B-shaped target generated on the device, 400 sequences of 600–3072 tokens;
//! - `e2e.small.1gpu`: a 6-layer hidden-256 target and a 1-layer drafter, block 16, 32 anchors,
//!   32 sequences of 256 tokens a step;
//! - `load.8b` (`load.rs`): seconds from the start of `dflash train` to the end of its first
//!   step with the target read from a sharded bf16 safetensors checkpoint on local disk.
//!
//! Throughput is the tokens of the steps after the warm-up over their wall time, read from
//! the run's own `metrics.jsonl`; `detail` gives each worker's phases over the same steps and
//! the peak anonymous host memory (`RssAnon`) sampled while the job ran.

use std::path::Path;

use dflash_config::{Qwen3Config, TrainConfig};
use dflash_pipeline::job::{JobPlan, TargetSource, TrainOutcome, train_plan};

use crate::rss::RssSampler;
use crate::util::SplitMix;
use crate::{BenchError, Result, Scale, Suite};

pub const E2E_8B: &str = "e2e.8b.1gpu";
pub const E2E_SMALL: &str = "e2e.small.1gpu";
/// The 8B recipe on two GPUs: target on the bench's device, drafter on the next.
pub const E2E_8B_2GPU: &str = "e2e.8b.2gpu";
/// The 8B recipe on two GPUs, each hosting a target worker and a drafter replica, gradients
/// summed by the device collective.
pub const E2E_8B_2GPU_DP: &str = "e2e.8b.2gpu.dp";
pub const LOAD_8B: &str = "load.8b";
const RECIPE_8B: &str = include_str!("../../../configs/qwen3-8b.toml");
pub(crate) const SEED: u64 = 0xE2E0_0001;

pub fn figure_names() -> Vec<String> {
    [E2E_8B, E2E_8B_2GPU, E2E_8B_2GPU_DP, E2E_SMALL, LOAD_8B]
        .map(String::from)
        .to_vec()
}

/// One end-to-end job: the target's shape, the recipe and the synthetic data.
pub(crate) struct Case {
    name: &'static str,
    pub(crate) target: Qwen3Config,
    recipe: &'static str,
    overrides: Vec<(String, String)>,
    /// Number of sequences and their length range (inclusive).
    pub(crate) seqs: usize,
    pub(crate) lens: (usize, usize),
    warmup_steps: u64,
    measured_steps: u64,
}

fn set(k: &str, v: impl ToString) -> (String, String) {
    (k.to_string(), v.to_string())
}

pub(crate) fn case_8b(scale: Scale) -> Case {
    let target = crate::target::config(scale);
    let mut overrides = vec![set("drafter.mask_token_id", target.vocab_size - 1)];
    let (seqs, lens, warmup, measured) = match scale {
        Scale::Full => (400, (600, 3072), 5, 30),
        Scale::Smoke => {
            overrides.extend([
                set("data.max_len", 96),
                set("data.bucket_bounds", "[32, 64, 96]"),
                set("data.token_budget", 96),
                set("data.num_anchors", 8),
            ]);
            (24, (20, 96), 2, 3)
        }
    };
    Case {
        name: E2E_8B,
        target,
        recipe: RECIPE_8B,
        overrides,
        seqs,
        lens,
        warmup_steps: warmup,
        measured_steps: measured,
    }
}

/// The small shape of issue 12: 6 layers, hidden 256, 4/2 heads, d 64, MLP 768, vocab 320.
fn small_target() -> Qwen3Config {
    Qwen3Config {
        vocab_size: 320,
        hidden_size: 256,
        intermediate_size: 768,
        num_hidden_layers: 6,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 64,
        max_position_embeddings: 4096,
        ..crate::target::config(Scale::Smoke)
    }
}

fn case_small(scale: Scale) -> Case {
    let (seqs_per_step, warmup, measured) = match scale {
        Scale::Full => (32, 10, 50),
        Scale::Smoke => (4, 2, 3),
    };
    let steps = warmup + measured;
    Case {
        name: E2E_SMALL,
        target: small_target(),
        recipe: RECIPE_8B,
        overrides: vec![
            set("drafter.num_layers", 1),
            set("drafter.mask_token_id", 319),
            set("drafter.num_target_features", 3),
            set("data.max_len", 256),
            set("data.bucket_bounds", "[256]"),
            set("data.token_budget", 256 * seqs_per_step),
            set("data.num_anchors", 32),
            set("train.micro_batches_per_step", 1),
        ],
        seqs: seqs_per_step * steps as usize,
        lens: (256, 256),
        warmup_steps: warmup,
        measured_steps: measured,
    }
}

/// `n` sequences with lengths in `lens`, ids below `vocab - 1` (the last id is the MASK
/// token), the first eighth of each (a prompt) unsupervised. Returns their total length.
pub(crate) fn write_jsonl(
    path: &Path,
    n: usize,
    lens: (usize, usize),
    vocab: usize,
) -> Result<usize> {
    let mut rng = SplitMix::new(SEED);
    let mut text = String::new();
    let mut total = 0;
    for _ in 0..n {
        let len = lens.0 + (rng.next_u64() as usize) % (lens.1 - lens.0 + 1);
        total += len;
        let ids = rng.tokens(len, vocab - 1);
        let prompt = len / 8;
        let mask: Vec<u8> = (0..len).map(|i| u8::from(i >= prompt)).collect();
        text.push_str(&serde_json::json!({ "input_ids": ids, "loss_mask": mask }).to_string());
        text.push('\n');
    }
    std::fs::write(path, text)
        .map(|()| total)
        .map_err(|source| BenchError::Io {
            path: path.display().to_string(),
            source,
        })
}

/// What the job could reach if it cost exactly its parts, measured earlier in this run: the
/// target forward at `target.forward.4x4096`'s rate for every token, plus one
/// `drafter.step.b1` forward+backward for every document (the drafter's work is per document,
/// not per token: up to `num_anchors` blocks each, so short documents cost it as much as long
/// ones) and one optimizer step. Target and drafter share the GPU, so their times add. `None`
/// when either figure is absent.
fn component_bound(s: &Suite<'_>, tokens_per_step: f64, docs_per_step: f64) -> Option<String> {
    let find = |name: &str| s.results.iter().find(|r| r.name == name);
    let target = find(crate::target::NAME)?;
    let drafter_name = crate::drafter::throughput_name(1, false);
    let drafter = find(&drafter_name)?;
    let optimizer_s = s.optimizer_s.get(&drafter_name).copied().unwrap_or(0.0);
    let parts = PartsPerStep {
        tokens: tokens_per_step,
        docs: docs_per_step,
        target_k_tok_s: target.value,
        drafter_step_s: drafter.seconds,
        optimizer_s,
    };
    Some(format!(
        "component bound for this data {:.2} K tok/s (target {:.1} ms + {docs_per_step:.2} \
         documents x drafter forward+backward {:.1} ms + optimizer {:.1} ms per step)",
        parts.bound_k_tok_s(),
        parts.target_s() * 1e3,
        parts.forward_backward_s() * 1e3,
        optimizer_s * 1e3
    ))
}

/// One step of the job priced at its parts' measured rates.
#[derive(Clone, Copy)]
struct PartsPerStep {
    tokens: f64,
    docs: f64,
    target_k_tok_s: f64,
    /// A whole `drafter.step.b1` step (one document), its optimizer included.
    drafter_step_s: f64,
    /// The optimizer's share of `drafter_step_s`.
    optimizer_s: f64,
}

impl PartsPerStep {
    fn target_s(&self) -> f64 {
        self.tokens / (self.target_k_tok_s * 1e3)
    }
    /// One document's forward+backward: the whole step less its optimizer. (The two are
    /// medians of different runs, so their difference is kept from going below 0.)
    fn forward_backward_s(&self) -> f64 {
        (self.drafter_step_s - self.optimizer_s).max(0.0)
    }
    /// The drafter's seconds a step: a forward+backward per document, the optimizer once.
    fn drafter_s(&self) -> f64 {
        self.docs * self.forward_backward_s() + self.optimizer_s
    }
    fn bound_k_tok_s(&self) -> f64 {
        self.tokens / (self.target_s() + self.drafter_s()) / 1e3
    }
}

/// A scratch directory under the system temp dir, removed on drop.
pub(crate) fn scratch(tag: &str) -> Result<tempfile::TempDir> {
    tempfile::Builder::new()
        .prefix(&format!("dflash-bench-{tag}-"))
        .tempdir()
        .map_err(|source| BenchError::Io {
            path: std::env::temp_dir().display().to_string(),
            source,
        })
}

/// One line of `metrics.jsonl`, the fields the bench reads.
#[derive(serde::Deserialize)]
pub(crate) struct Record {
    tokens: u64,
    elapsed_s: f64,
    /// Seconds from the job's start (inside its process) to this record.
    pub(crate) job_s: f64,
    target_phases_s: Vec<std::collections::BTreeMap<String, f64>>,
    drafter_phases_s: Vec<std::collections::BTreeMap<String, f64>>,
}

pub(crate) fn read_records(run_dir: &Path) -> Result<Vec<Record>> {
    let path = run_dir.join("metrics.jsonl");
    let text = std::fs::read_to_string(&path).map_err(|source| BenchError::Io {
        path: path.display().to_string(),
        source,
    })?;
    text.lines()
        .map(|l| serde_json::from_str(l).map_err(BenchError::from))
        .collect()
}

/// `name a.b, ...` of the phases' milliseconds per step between two records.
fn phase_line(
    a: &std::collections::BTreeMap<String, f64>,
    b: &std::collections::BTreeMap<String, f64>,
    steps: f64,
) -> String {
    b.iter()
        .map(|(k, v)| {
            format!(
                "{k} {:.1}",
                (v - a.get(k).copied().unwrap_or(0.0)) * 1e3 / steps
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The step after which the measured window's checkpoint is written (its middle).
fn mid_checkpoint(case: &Case) -> u64 {
    case.warmup_steps + case.measured_steps.div_ceil(2)
}

/// The job's overrides in the order they apply (later wins): the placement on the bench's
/// device and its threads, the case's (a `2gpu` case's own device lists among them), the
/// bench's paths, steps and backend, then the user's `--set` (checked by
/// [`crate::check_job_overrides`] to leave backend and placement alone).
fn job_overrides(
    s: &Suite<'_>,
    case: &Case,
    data: &Path,
    run_dir: &Path,
    steps: u64,
) -> Vec<(String, String)> {
    let b = s.b();
    let d = s.opts.device;
    // Without lists the job places round robin: drafter on device 1 where there are two,
    // and both on 0 whatever the bench's device.
    let mut overrides = vec![
        set("pipeline.target_devices", format!("[{d}]")),
        set("pipeline.drafter_devices", format!("[{d}]")),
        set("backend.threads", s.opts.threads),
    ];
    overrides.extend(case.overrides.iter().cloned());
    overrides.extend([
        set("target.path", run_dir.display()),
        set("data.train", data.display()),
        set("train.max_steps", steps),
        // One checkpoint inside the measured window, as a long run has them: its cost (the
        // drafter's wait, the background write sharing the device) is part of the figure.
        set("train.save_every", mid_checkpoint(case)),
        set("train.epochs", 0),
        set("train.log_every", 10),
        set("backend.name", b.name()),
        set("backend.attention", b.attention_kernel()),
        set("run.dir", run_dir.display()),
    ]);
    overrides.extend(s.opts.job_overrides.iter().cloned());
    overrides
}

pub(crate) fn job_config(
    s: &Suite<'_>,
    case: &Case,
    data: &Path,
    run_dir: &Path,
    steps: u64,
) -> Result<TrainConfig> {
    let overrides = job_overrides(s, case, data, run_dir, steps);
    Ok(TrainConfig::load_toml_str(
        case.recipe,
        case.name,
        run_dir,
        &overrides,
    )?)
}

/// `"; DFLASH_* environment: K=V ..."` for the `DFLASH_SECTION__KEY` variables that reach a
/// job's config (the config layers apply them under the bench's overrides, so those the bench
/// sets itself change nothing), else empty: a figure timed on a changed recipe says so.
pub(crate) fn env_variant(s: &Suite<'_>, case: &Case) -> String {
    let set_by_bench = job_overrides(s, case, Path::new(""), Path::new(""), 0);
    let mut applied: Vec<String> = std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .filter_map(|(k, v)| {
            let rest = k.strip_prefix(dflash_config::ENV_PREFIX)?;
            let key = rest.to_ascii_lowercase().replace("__", ".");
            let overridden = set_by_bench.iter().any(|(o, _)| *o == key);
            (rest.contains("__") && !overridden).then(|| format!("{k}={v}"))
        })
        .collect();
    applied.sort();
    match applied.as_slice() {
        [] => String::new(),
        a => format!("; recipe changed by DFLASH_* environment: {}", a.join(" ")),
    }
}

/// Runs `case` as a job and records its throughput.
fn run_case(s: &mut Suite<'_>, case: Case) -> Result<()> {
    if !s.wants(case.name) {
        return Ok(());
    }
    let job = plan_job(s, &case)?;
    // The job returns its own backends' caches before it plans; the suite's backend keeps
    // caches of its own from earlier figures (on CUDA its loss workspace and uploads; on
    // wgpu, whose instances do not share a pool, its buffers), so it returns them here.
    s.b().release_cached_memory();
    let ran = run_job(&case, &job)?;
    report_case(s, &case, &job, &ran)
}

/// A case's job, planned on its synthetic data and checked to reach all of its steps.
/// Fields drop in order, the scratch directory (data and run) last.
struct PlannedJob {
    plan: JobPlan,
    cfg: TrainConfig,
    /// Mean length of the synthetic sequences.
    mean_len: f64,
    /// Holds the data and the run; removed on drop.
    scratch: tempfile::TempDir,
}

/// What a finished job left to report.
struct FinishedJob {
    out: TrainOutcome,
    /// Seconds of the whole job.
    wall: f64,
    /// Peak `RssAnon` while it ran, in GB.
    peak_rss: f64,
    /// Its `metrics.jsonl`, one record per logged step.
    recs: Vec<Record>,
    /// Whether its memory plan had room for background checkpoints.
    background_checkpoints: bool,
}

/// Writes `case`'s data to a scratch directory and plans its job; an error when the data
/// makes fewer than its warm-up plus measured steps.
fn plan_job(s: &Suite<'_>, case: &Case) -> Result<PlannedJob> {
    let scratch = scratch(case.name)?;
    let data = scratch.path().join("train.jsonl");
    let data_tokens = write_jsonl(&data, case.seqs, case.lens, case.target.vocab_size)?;
    let mean_len = data_tokens as f64 / case.seqs as f64;
    let steps = case.warmup_steps + case.measured_steps;
    let cfg = job_config(s, case, &data, scratch.path(), steps)?;
    let plan = JobPlan::with_target(
        &cfg,
        TargetSource::Random {
            config: case.target.clone(),
            seed: SEED,
        },
    )?;
    if plan.total_steps() < steps {
        return Err(BenchError::Invalid {
            bench: case.name.into(),
            detail: format!(
                "the data makes only {} of {steps} steps",
                plan.total_steps()
            ),
        });
    }
    Ok(PlannedJob {
        plan,
        cfg,
        mean_len,
        scratch,
    })
}

/// Runs the planned job, timing it and sampling the peak RSS, and reads back its metrics.
fn run_job(case: &Case, job: &PlannedJob) -> Result<FinishedJob> {
    let rss = RssSampler::of_this_process();
    let t0 = std::time::Instant::now();
    let out = train_plan(&job.plan, &job.scratch.path().join("run")).map_err(|e| {
        BenchError::Invalid {
            bench: case.name.into(),
            detail: dflash_pipeline::error::cause_chain(&e),
        }
    })?;
    let wall = t0.elapsed().as_secs_f64();
    let peak_rss = rss.peak_gb();
    let recs = read_records(&out.run_dir)?;
    let invalid = |detail: String| BenchError::Invalid {
        bench: case.name.into(),
        detail,
    };
    // A figure over fewer steps than asked (a --set train.stop_at_step) would divide by
    // nothing; one over skipped samples would count tokens the job did not train on.
    if recs.len() <= case.warmup_steps as usize {
        return Err(invalid(format!(
            "the job logged {} steps; {} warm-up and at least one measured are needed",
            recs.len(),
            case.warmup_steps
        )));
    }
    if out.invocation_skipped_samples > 0 {
        return Err(invalid(format!(
            "the job skipped {} samples, whose tokens the figure would count",
            out.invocation_skipped_samples
        )));
    }
    let background_checkpoints = read_checkpoint_mode(&out.run_dir)?;
    Ok(FinishedJob {
        out,
        wall,
        peak_rss,
        recs,
        background_checkpoints,
    })
}

/// Whether the job's memory plan (`memory_plan.json` in its run directory) writes checkpoints
/// in the background; if not (a state too small to be worth it, or no room for a snapshot),
/// each checkpoint stalls the drafter for its whole write.
fn read_checkpoint_mode(run_dir: &Path) -> Result<bool> {
    let path = run_dir.join(dflash_pipeline::job::memory::MEMORY_PLAN_FILE);
    let text = std::fs::read_to_string(&path).map_err(|source| BenchError::Io {
        path: path.display().to_string(),
        source,
    })?;
    let plan: serde_json::Value = serde_json::from_str(&text)?;
    plan["background_checkpoints"]
        .as_bool()
        .ok_or_else(|| BenchError::Invalid {
            bench: "e2e".into(),
            detail: format!("{}: no background_checkpoints flag", path.display()),
        })
}

/// Records the throughput of the steps after the warm-up, with the detail line: shapes,
/// per-step phases of each worker, checkpoint, start-up, memory, loss and any recipe override.
fn report_case(s: &mut Suite<'_>, case: &Case, job: &PlannedJob, ran: &FinishedJob) -> Result<()> {
    let (plan, cfg, recs) = (&job.plan, &job.cfg, &ran.recs);
    let (out, wall, peak_rss) = (&ran.out, ran.wall, ran.peak_rss);
    let w = case.warmup_steps as usize;
    let (first, last) = (&recs[w - 1], &recs[recs.len() - 1]);
    let tokens: u64 = recs[w..].iter().map(|r| r.tokens).sum();
    let secs = last.elapsed_s - first.elapsed_s;
    let n = (recs.len() - w) as f64;
    let phases = |a: &[std::collections::BTreeMap<String, f64>],
                  b: &[std::collections::BTreeMap<String, f64>]| {
        match (a.first(), b.first()) {
            (Some(a), Some(b)) => phase_line(a, b, n),
            _ => String::new(),
        }
    };
    let d = &plan.drafter;
    let per_step = tokens as f64 / n;
    let variant = recipe_variant(s);
    let bound = match case.name {
        E2E_8B => component_bound(s, per_step, per_step / job.mean_len).map(|b| format!("; {b}")),
        _ => None,
    };
    let detail = format!(
        "{} steps after {w} warm-up, {:.0} tokens/step; target {} layers hidden {}, drafter {} \
         layers, block {}, {} anchors, {} micro-batches/step of <= {} tokens; ms/step: target \
         [{}], drafter [{}] (a checkpoint after step {} inside the window, {}); end-of-run \
         checkpoint and save included in the job's {wall:.1} s; \
         first step done at {:.1} s; peak RssAnon {peak_rss:.2} GB; loss {:.3} -> {:.3}{}{variant}{}",
        recs.len() - w,
        per_step,
        case.target.num_hidden_layers,
        case.target.hidden_size,
        d.num_hidden_layers,
        d.block_size,
        plan.spec.num_anchors,
        cfg.train.micro_batches_per_step,
        cfg.data.token_budget,
        phases(&first.target_phases_s, &last.target_phases_s),
        phases(&first.drafter_phases_s, &last.drafter_phases_s),
        mid_checkpoint(case),
        match ran.background_checkpoints {
            true => "written in the background",
            false => "written in place",
        },
        recs[0].job_s,
        out.first_loss,
        out.final_loss,
        bound.unwrap_or_default(),
        env_variant(s, case),
    );
    s.record(case.name, tokens as f64 / secs / 1e3, secs / n, detail)
}

/// `"; recipe overridden: k=v ..."` when the bench overrides the recipe, else empty.
pub(crate) fn recipe_variant(s: &Suite<'_>) -> String {
    match s.opts.job_overrides.as_slice() {
        [] => String::new(),
        o => format!(
            "; recipe overridden: {}",
            o.iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" ")
        ),
    }
}

/// The 8B case placed on two devices (`placement`: device lists and collective).
fn case_8b_on_two(scale: Scale, name: &'static str, placement: &[(&str, String)]) -> Case {
    let mut case = case_8b(scale);
    case.name = name;
    case.overrides
        .extend(placement.iter().map(|(k, v)| set(k, v)));
    case
}

pub(crate) fn run(s: &mut Suite<'_>) -> Result<()> {
    let scale = s.opts.scale;
    run_case(s, case_8b(scale))?;
    let two = [E2E_8B_2GPU, E2E_8B_2GPU_DP].map(String::from);
    if s.wants_any(&two) {
        let devices = dflash_core::registry::device_count(s.b().name())?;
        // The bench's device and the next one, as the 1-GPU figures run on the bench's.
        let (d0, d1) = (s.opts.device, s.opts.device + 1);
        if d1 < devices {
            let split = [
                ("pipeline.target_devices", format!("[{d0}]")),
                ("pipeline.drafter_devices", format!("[{d1}]")),
            ];
            run_case(s, case_8b_on_two(scale, E2E_8B_2GPU, &split))?;
            let dp = [
                ("pipeline.target_devices", format!("[{d0}, {d1}]")),
                ("pipeline.drafter_devices", format!("[{d0}, {d1}]")),
                ("pipeline.collective", "\"device\"".to_string()),
            ];
            run_case(s, case_8b_on_two(scale, E2E_8B_2GPU_DP, &dp))?;
        } else {
            let why = format!(
                "need devices {d0} and {d1}, backend {} has {devices}",
                s.b().name()
            );
            for name in &two {
                if s.wants(name) {
                    s.skip(name, why.clone());
                }
            }
        }
    }
    run_case(s, case_small(scale))?;
    crate::load::run(s)
}

#[cfg(test)]
mod placement_tests;
#[cfg(test)]
mod tests;
