//! `dflash`: train DFlash drafters, evaluate them, inspect runs.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use dflash_config::TrainConfig;

mod status;

#[derive(Parser)]
#[command(
    name = "dflash",
    version,
    about = "Train DFlash block-diffusion drafters online"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args, Clone)]
struct ConfigArgs {
    /// Job config (TOML). Layered: defaults <- this file <- DFLASH_* env vars <- --set.
    #[arg(long, short)]
    config: Option<PathBuf>,
    /// Override a config key, e.g. `--set train.lr=3e-4` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// Run on this backend (see `dflash backends`): sets `backend.name`, and
    /// `backend.attention` to the backend's preferred kernel unless `--attention` names one.
    /// `--set` still overrides both.
    #[arg(long, value_name = "NAME")]
    backend: Option<String>,
    /// Attention kernel: sets `backend.attention`.
    #[arg(long, value_name = "NAME")]
    attention: Option<String>,
}

impl ConfigArgs {
    /// The config keys `--backend` / `--attention` set, as `--set` pairs (before the user's).
    fn backend_overrides(&self) -> Result<Vec<(String, String)>> {
        let quote = |v: &str| serde_json::to_string(v).expect("a string serialises");
        let attention = match (&self.backend, &self.attention) {
            (_, Some(a)) => Some(a.clone()),
            (Some(b), None) => Some(
                dflash_core::registry::preferred_attention(b)
                    .with_context(|| format!("--backend {b:?}"))?
                    .to_string(),
            ),
            (None, None) => None,
        };
        let mut out = Vec::new();
        if let Some(b) = &self.backend {
            out.push(("backend.name".to_string(), quote(b)));
        }
        if let Some(a) = attention {
            out.push(("backend.attention".to_string(), quote(&a)));
        }
        Ok(out)
    }
}

#[derive(Subcommand)]
enum Command {
    /// Train a drafter; prints `run_dir=... tau_before=... tau_after=...` at the end.
    Train {
        #[command(flatten)]
        cfg: ConfigArgs,
        /// Continue the run in RUN_DIR from its latest checkpoint.
        #[arg(long, value_name = "RUN_DIR")]
        resume: Option<PathBuf>,
    },
    /// How to split this machine's devices between target workers and drafter replicas:
    /// times the job's first steps (target and drafter, each alone on device 0), prints every
    /// split with its expected tok/s and its memory per device, best first, and the settings
    /// of the best that fits (`pipeline.placement = "auto"` makes `train` do this itself).
    Plan {
        #[command(flatten)]
        cfg: ConfigArgs,
        /// Steps to time, after one warm-up step.
        #[arg(long, default_value_t = 3)]
        steps: u64,
        /// Also write the report as JSON here.
        #[arg(long, value_name = "FILE")]
        json: Option<PathBuf>,
    },
    /// Acceptance length tau of a drafter on held-out data (docs/design.md §2.5).
    Eval {
        #[command(flatten)]
        cfg: ConfigArgs,
        /// Drafter directory (config.json + model.safetensors).
        #[arg(long)]
        drafter: PathBuf,
        /// Evaluation data; defaults to the config's `data.eval`.
        #[arg(long)]
        data: Option<PathBuf>,
    },
    /// Chat data to training data: renders each conversation (JSONL, Parquet or a datasets
    /// save_to_disk directory; OpenAI `messages` or ShareGPT `conversations`) with the target's
    /// chat template, tokenizes it with its tokenizer.json and masks the assistant content;
    /// writes `input_ids` + `loss_mask` as a save_to_disk directory for `data.train`.
    Prepare(PrepareArgs),
    /// The target writes the answers: for each conversation it generates every assistant turn
    /// in order, each conditioned on its own earlier answers, and answers a final user turn
    /// (KV cache, batched; greedy by default). Answers cut by --max-new-tokens or --capacity
    /// are dropped unless --keep-truncated. Writes JSONL conversations for `prepare`;
    /// re-running continues the file.
    Regenerate(RegenerateArgs),
    /// Progress and last error of a run directory.
    Status { run_dir: PathBuf },
    /// Registered backends and attention kernels.
    Backends,
    /// Benchmarks against the measured PyTorch anchors of docs/design.md §4: prints a table and
    /// writes the results as a JSON list.
    Bench(BenchArgs),
}

#[derive(clap::Args)]
struct PrepareArgs {
    /// Target directory: tokenizer.json and tokenizer_config.json (with its chat_template).
    #[arg(long)]
    target: PathBuf,
    /// The chat dataset: .jsonl, .parquet, .arrow, a save_to_disk directory, a folder of
    /// Parquet files of one split, or a quoted pattern picking one split's files
    /// ('data/train_sft-*.parquet').
    #[arg(long)]
    data: PathBuf,
    /// Output directory (must not exist, or be empty).
    #[arg(long)]
    out: PathBuf,
    /// A chat template file to use instead of the target's (e.g. with {% generation %} blocks).
    #[arg(long, value_name = "FILE")]
    chat_template: Option<PathBuf>,
    /// Length buckets of the summary's histogram (default: data.bucket_bounds' default).
    #[arg(long, value_delimiter = ',', value_name = "N,N,...")]
    buckets: Option<Vec<usize>>,
}

fn prepare(args: PrepareArgs) -> Result<()> {
    let opts = dflash_prepare::PrepareOptions {
        target: args.target,
        chat_template: args.chat_template,
        data: args.data,
        out: args.out,
        bucket_bounds: args
            .buckets
            .unwrap_or_else(|| dflash_config::DataSection::default().bucket_bounds),
        progress: true,
    };
    let summary = dflash_prepare::prepare(&opts)?;
    print!("{summary}");
    println!("out={}", opts.out.display());
    Ok(())
}

#[derive(clap::Args)]
struct RegenerateArgs {
    /// Target directory: config.json, weights, tokenizer.json, tokenizer_config.json.
    #[arg(long)]
    target: PathBuf,
    /// The chat dataset: .jsonl, .parquet, .arrow, a save_to_disk directory, a folder of
    /// Parquet files of one split, or a quoted pattern picking one split's files
    /// ('data/train_sft-*.parquet').
    #[arg(long)]
    data: PathBuf,
    /// Output JSONL file; an existing one written with the same settings is continued.
    /// Dropped samples are recorded in OUT.skipped.jsonl, so a restart skips them too.
    #[arg(long)]
    out: PathBuf,
    /// A chat template file to use instead of the target's.
    #[arg(long, value_name = "FILE")]
    chat_template: Option<PathBuf>,
    /// Registered backend to run on (see `dflash backends`).
    #[arg(long, default_value = "reference")]
    backend: String,
    /// Attention kernel of the backend (default: the backend's preferred kernel).
    #[arg(long)]
    attention: Option<String>,
    /// Device ordinal (GPU backends).
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// Worker threads (CPU backends; 0 = all cores).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Conversations decoded together.
    #[arg(long, default_value_t = 16)]
    batch: usize,
    /// New tokens an answer (each assistant turn) may have.
    #[arg(long, default_value_t = 1024)]
    max_new_tokens: usize,
    /// Tokens per sequence, prompt and answer, the earlier answers of a conversation in its
    /// later prompts: a sample whose first prompt is longer is skipped, and one whose later
    /// prompt outgrows it is written up to its last answer. The KV cache holds --batch x
    /// --capacity tokens in f32 and is checked against free memory where the backend
    /// reports it (default: 4096 + --max-new-tokens, at most the target's
    /// max_position_embeddings).
    #[arg(long)]
    capacity: Option<usize>,
    /// Prompt tokens prefilled in one call, at most.
    #[arg(long, default_value_t = 8192)]
    prefill_tokens: usize,
    /// 0 = greedy; otherwise sample at this temperature.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Sample among the K most likely tokens only (0 = all).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Sample among the most likely tokens holding this much probability (1 = all).
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Seed of the sampling streams (one per conversation turn).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Write conversations with an answer cut by --max-new-tokens or --capacity (their
    /// finish_reason says so) instead of dropping them.
    #[arg(long)]
    keep_truncated: bool,
}

fn regenerate(args: RegenerateArgs) -> Result<()> {
    let backend = create_backend(&args.backend, args.attention, args.device, args.threads)?;
    let opts = dflash_regenerate::RegenerateOptions {
        target: args.target,
        chat_template: args.chat_template,
        data: args.data,
        out: args.out,
        batch: args.batch,
        max_new_tokens: args.max_new_tokens,
        capacity: args.capacity,
        prefill_tokens: args.prefill_tokens,
        sampling: dflash_models::generate::Sampling {
            temperature: args.temperature,
            top_k: args.top_k,
            top_p: args.top_p,
            seed: args.seed,
        },
        keep_truncated: args.keep_truncated,
        progress: true,
    };
    println!(
        "regenerate: backend {} on {}, attention {}",
        backend.name(),
        backend.device(),
        backend.attention_kernel()
    );
    let summary = dflash_regenerate::regenerate(backend, &opts)?;
    print!("{summary}");
    println!("out={}", opts.out.display());
    Ok(())
}

/// A registered backend with its preferred attention kernel unless one is named.
fn create_backend(
    name: &str,
    attention: Option<String>,
    device: usize,
    threads: usize,
) -> Result<std::sync::Arc<dyn dflash_core::Backend>> {
    let attention = match attention {
        Some(a) => a,
        None => dflash_core::registry::preferred_attention(name)
            .with_context(|| format!("creating backend {name:?}"))?
            .to_string(),
    };
    let opts = dflash_core::registry::BackendOptions {
        attention,
        device,
        threads,
    };
    dflash_core::registry::create_backend(name, &opts)
        .with_context(|| format!("creating backend {name:?}"))
}

#[derive(clap::Args)]
struct BenchArgs {
    /// Registered backend to run on (see `dflash backends`).
    #[arg(long)]
    backend: String,
    /// Attention kernel of the backend (default: the backend's preferred kernel, see
    /// `dflash backends`).
    #[arg(long)]
    attention: Option<String>,
    /// `full`: the §4 shapes (a GPU); `smoke`: tiny shapes over the same code paths.
    #[arg(long, default_value = "full")]
    scale: dflash_bench::Scale,
    /// Run only the figures whose name contains SUBSTRING (several, comma-separated: any).
    #[arg(long, value_name = "SUBSTRING")]
    only: Option<String>,
    /// Write the JSON list here (parent directories are created), rewritten after each figure
    /// so that a later failure keeps those measured; never written empty.
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Without --out: write `DIR/<slug>.json`, the slug taken from the backend's device name
    /// (`nvidia-h200` for CUDA), prefixed by the backend's for any other (`wgpu-nvidia-h200`).
    /// With --only, the figures measured replace those of the same name in an existing file
    /// and the others are kept.
    #[arg(long, value_name = "DIR", conflicts_with = "out")]
    results_dir: Option<PathBuf>,
    /// Device ordinal (GPU backends).
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// Worker threads (CPU backends; 0 = all cores).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Warm-up runs per figure (default per benchmark).
    #[arg(long)]
    warmup: Option<usize>,
    /// Timed runs per figure, median reported (default per benchmark).
    #[arg(long)]
    runs: Option<usize>,
    /// Baselines measured in this run, a JSON object `{"figure name": value}` (e.g. written
    /// by `bench/hf_generate.py`): they replace the built-in baselines of those figures.
    #[arg(long, value_name = "FILE")]
    baselines: Option<PathBuf>,
    /// Override a key of the end-to-end figures' recipe, e.g. `--set data.token_budget=6144`
    /// (repeatable): the job's own code path on a variant of the recipe.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
}

/// The `--baselines` file: figure names known to the suite, finite positive values.
fn read_baselines(path: &std::path::Path) -> Result<Vec<(String, f64)>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading baselines {}", path.display()))?;
    let map: std::collections::BTreeMap<String, f64> =
        serde_json::from_str(&text).with_context(|| {
            format!(
                "{}: expected a JSON object of figure name -> number",
                path.display()
            )
        })?;
    let names = dflash_bench::figure_names();
    for (name, v) in &map {
        if !names.contains(name) {
            anyhow::bail!("{}: {name:?} is not a figure of the suite", path.display());
        }
        if !(v.is_finite() && *v > 0.0) {
            anyhow::bail!(
                "{}: {name}: the baseline must be a finite number > 0, got {v}",
                path.display()
            );
        }
    }
    Ok(map.into_iter().collect())
}

fn bench(args: BenchArgs) -> Result<()> {
    let backend = create_backend(&args.backend, args.attention, args.device, args.threads)?;
    let bench_opts = dflash_bench::BenchOptions {
        scale: args.scale,
        only: args.only,
        warmup: args.warmup,
        runs: args.runs,
        baselines: match &args.baselines {
            Some(p) => read_baselines(p)?,
            None => Vec::new(),
        },
        job_overrides: dflash_config::parse_overrides(&args.set)?,
        // load.8b starts `dflash train` from this very executable.
        train_exe: std::env::current_exe().ok(),
        // The jobs run where the other figures do.
        device: args.device,
        threads: args.threads,
    };
    // Checked before any figure runs: the e2e figures, which apply them, come last.
    dflash_bench::check_job_overrides(&bench_opts.job_overrides).context("bench --set")?;
    TrainConfig::check_overrides(&bench_opts.job_overrides).context("bench --set")?;
    let unmatched = bench_opts.unmatched_only();
    if !unmatched.is_empty() {
        anyhow::bail!(
            "no figure matches --only {:?}; figures: {}",
            unmatched.join(","),
            dflash_bench::figure_names().join(", ")
        );
    }
    println!(
        "bench: backend {} on {}, attention {}, scale {}",
        backend.name(),
        backend.device(),
        backend.attention_kernel(),
        args.scale
    );
    // A partial run (--only) into the results directory updates its figures in the
    // machine's file and keeps the others, as `cargo xtask bench --only X` is used to
    // re-measure a few figures of a full run.
    let merge = bench_opts.only.is_some() && args.results_dir.is_some();
    // The machine's file in the results directory holds one backend at one scale: a run of
    // another (a smoke run beside full figures) is refused, not written over it.
    let into_results = args.out.is_none() && args.results_dir.is_some();
    let out = args.out.or_else(|| {
        args.results_dir.map(|d| {
            d.join(format!(
                "{}.json",
                dflash_bench::results_slug(backend.name(), &backend.device())
            ))
        })
    });
    let base = match &out {
        Some(path) if (merge || into_results) && path.exists() => {
            let old = dflash_bench::read_json(path)
                .with_context(|| format!("reading {} to merge into", path.display()))?;
            if let Some(r) = old
                .iter()
                .find(|r| r.backend != backend.name() || r.scale != args.scale)
            {
                anyhow::bail!(
                    "{}: holds {} measured on backend {} at scale {}; not writing figures of \
                     backend {} at scale {} into it (pass --out to write elsewhere)",
                    path.display(),
                    r.name,
                    r.backend,
                    r.scale,
                    backend.name(),
                    args.scale
                );
            }
            if merge { old } else { Vec::new() }
        }
        _ => Vec::new(),
    };
    println!("{}", dflash_bench::table_header());
    // The file is rewritten after each figure, so a figure that fails later (or a killed run)
    // keeps those measured before it.
    let mut measured = Vec::new();
    let mut write_error = None;
    let run = dflash_bench::run_suite_partial(backend, &bench_opts, |r| {
        println!("{}", dflash_bench::table_row(r));
        measured.push(r.clone());
        if let (Some(path), None) = (&out, &write_error) {
            let all = dflash_bench::merge_results(base.clone(), &measured);
            write_error = dflash_bench::write_json(path, &all).err();
        }
    });
    if let Some(e) = write_error {
        return Err(e).context("writing the results");
    }
    match &out {
        Some(path) if !run.results.is_empty() => println!(
            "wrote {} results to {}{}",
            run.results.len(),
            path.display(),
            if base.is_empty() {
                String::new()
            } else {
                format!(" (merged with the {} already there)", base.len())
            }
        ),
        // An empty list would replace a file of earlier results with nothing.
        Some(path) => println!("nothing measured: {} left as it was", path.display()),
        None => {}
    }
    if let Some(e) = run.error {
        return Err(e).context(format!(
            "the bench stopped after {} figure(s)",
            run.results.len()
        ));
    }
    let missing = run.not_produced(&bench_opts);
    if !missing.is_empty() {
        anyhow::bail!(
            "--only named figures that produced nothing: {}",
            missing
                .iter()
                .map(|(part, why)| format!("{part} ({why})"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if run.results.is_empty() {
        anyhow::bail!("nothing measured on this backend");
    }
    Ok(())
}

/// The config file (or the embedded default) under the `--backend`/`--attention` flags and
/// then the `--set KEY=VALUE` flags.
fn load_config(args: &ConfigArgs) -> Result<TrainConfig> {
    let mut overrides = args.backend_overrides()?;
    overrides.extend(dflash_config::parse_overrides(&args.set)?);
    Ok(TrainConfig::load(args.config.as_deref(), &overrides)?)
}

fn fmt_tau(t: Option<f64>) -> String {
    t.map_or("na".into(), |t| format!("{t:.3}"))
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Train { cfg, resume } => {
            // Absolute, as the run_dir= line scripts parse promises (and the resume hint).
            let resume = resume.map(|d| std::path::absolute(&d).unwrap_or(d));
            // A directory that is no run at all (a typo, the runs root, a checkpoint) is named as
            // such first: advice about its missing config would send the user after the wrong
            // thing. A run writes its config.toml before its first step, so any run has one or,
            // having lost it, still its checkpoints.
            if let Some(dir) = &resume {
                let has = |p: &str| dir.join(p).is_file();
                if !has("config.toml") && !has("checkpoints/latest") {
                    anyhow::bail!(
                        "--resume {}: not a run directory (no config.toml, no \
                         checkpoints/latest); pass the directory a `dflash train` made, \
                         RUN.DIR/RUN.NAME (it prints it as run_dir=...)",
                        dir.display()
                    );
                }
            }
            // A resumed run continues with the config it was started with, plus --set (checked
            // against that config, not the defaults).
            let saved = resume.as_ref().map(|dir| dir.join("config.toml"));
            let config = match saved {
                Some(saved) if cfg.config.is_none() => {
                    if !saved.exists() {
                        anyhow::bail!(
                            "{}: the run's config is missing; pass the config it was started \
                             with (--config), or the defaults would silently replace it",
                            saved.display()
                        );
                    }
                    load_config(&ConfigArgs {
                        config: Some(saved),
                        ..cfg.clone()
                    })?
                }
                _ => load_config(&cfg)?,
            };
            // A launcher's RANK / WORLD_SIZE / ... make this process one rank of a group.
            let timeout = std::time::Duration::from_secs(config.pipeline.timeout_secs.max(1));
            let procs = dflash_pipeline::Processes::from_env(timeout)?;
            let out = dflash_pipeline::train_in(&config, resume.as_deref(), procs.as_ref())?;
            println!(
                "run_dir={} steps={} loss_first={:.4} loss_last={:.4} acc_last={:.3} tau_before={} tau_after={}",
                out.run_dir.display(),
                out.steps,
                out.first_loss,
                out.final_loss,
                out.final_accuracy,
                fmt_tau(out.tau_before),
                fmt_tau(out.tau_after)
            );
        }
        Command::Plan { cfg, steps, json } => {
            let report = dflash_pipeline::job::plan_placement(&load_config(&cfg)?, steps)?;
            println!("{}", report.table());
            if let Some(path) = json {
                let text = serde_json::to_string_pretty(&report)?;
                std::fs::write(&path, text + "\n")
                    .with_context(|| format!("writing {}", path.display()))?;
            }
        }
        Command::Eval { cfg, drafter, data } => {
            let config = load_config(&cfg)?;
            let data = data
                .or_else(|| config.data.eval.clone())
                .context("no evaluation data: pass --data or set data.eval")?;
            let out = dflash_pipeline::evaluate(&config, &drafter, &data)?;
            eprintln!("data: {}", out.data);
            println!(
                "tau={:.3} sequences={} cycles={} skipped={}",
                out.report.tau, out.report.sequences, out.report.cycles, out.skipped_samples
            );
        }
        Command::Prepare(args) => prepare(args)?,
        Command::Regenerate(args) => regenerate(args)?,
        Command::Status { run_dir } => status::print(&run_dir)?,
        Command::Bench(args) => bench(args)?,
        Command::Backends => {
            use dflash_core::registry;
            println!("backends: {}", registry::backend_names().join(", "));
            println!(
                "host attention kernels (any backend): {}",
                registry::attention_kernel_names().join(", ")
            );
            for name in registry::backend_names() {
                let device = registry::device_attention_kernel_names(&name);
                if !device.is_empty() {
                    println!("{name} attention kernels: {}", device.join(", "));
                }
            }
            for name in registry::backend_names() {
                let n = registry::device_count(&name).unwrap_or(0);
                let preferred = registry::preferred_attention(&name).unwrap_or("?");
                println!("{name}: {n} device(s) here, preferred attention {preferred}");
            }
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    dflash_backend_reference::link();
    dflash_attention_tiled::link();
    dflash_backend_cuda::link();
    dflash_backend_wgpu::link();
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{}", dflash_pipeline::error::cause_chain(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}
