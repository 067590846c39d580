//! `load.8b`: seconds from starting the job to the end of its first step, with the 8B target
//! read from a sharded bf16 safetensors checkpoint on local disk (written first when absent).
//!
//! Where the bench knows its own executable ([`crate::BenchOptions::train_exe`], set by
//! `dflash bench`), the job runs as `dflash train` in a process of its own, timed from its
//! spawn to its first `metrics.jsonl` record: process start, device initialisation and
//! kernel compilation are counted, as a user's start-up pays them. Otherwise (a library
//! caller, the tests) it runs in this process, whose device was started by earlier figures.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use dflash_config::TrainConfig;
use dflash_pipeline::job::{JobPlan, train_plan};

use crate::e2e::{
    LOAD_8B, SEED, case_8b, env_variant, job_config, read_records, recipe_variant, scratch,
    write_jsonl,
};
use crate::rss::{RssSampler, rss_anon_bytes};
use crate::{BenchError, Result, Scale, Suite};

/// Where `load.8b` keeps its checkpoint: `DFLASH_BENCH_CACHE` or the temp dir.
fn cache_dir(scale: Scale) -> PathBuf {
    std::env::var_os("DFLASH_BENCH_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
        .join(format!("dflash-bench-qwen3-8b-random-{scale}"))
}

/// The variable that points the CUDA backend's PTX cache at a directory (the bench does not
/// link the backend, so it names it).
const KERNEL_CACHE_VAR: &str = "DFLASH_CUDA_KERNEL_CACHE";

/// What one timed start-up gave.
struct StartUp {
    /// Seconds from the start to the end of the first step.
    secs: f64,
    /// How the start was timed and what it counts.
    counts: String,
    /// Seconds of `secs` on the job's own clock.
    in_job: f64,
    /// Peak `RssAnon` of the job's process, GB.
    peak_rss: f64,
}

fn invalid(detail: String) -> BenchError {
    BenchError::Invalid {
        bench: LOAD_8B.into(),
        detail,
    }
}

pub(crate) fn run(s: &mut Suite<'_>) -> Result<()> {
    if !s.wants(LOAD_8B) {
        return Ok(());
    }
    let scale = s.opts.scale;
    let case = case_8b(scale);
    let dir = cache_dir(scale);
    let bytes = crate::checkpoint::ensure_random_checkpoint(&dir, &case.target, SEED)?;
    let scratch = scratch(LOAD_8B)?;
    let data = scratch.path().join("train.jsonl");
    write_jsonl(&data, case.seqs.min(16), case.lens, case.target.vocab_size)?;
    let mut cfg = job_config(s, &case, &data, scratch.path(), 1)?;
    cfg.target.path = Some(dir.clone());
    // Read now: the child gets the config resolved here, these variables included.
    let variant = format!("{}{}", recipe_variant(s), env_variant(s, &case));
    s.b().release_cached_memory(); // as the e2e figures do
    let (start, restart) = match s.opts.train_exe.clone() {
        Some(exe) => {
            // A first start compiles the kernels into an empty cache; a restart reads them.
            let kernels = scratch.path().join("kernel-cache");
            let cold = in_child(&exe, cfg.clone(), scratch.path(), "load", &kernels)?;
            let warm = in_child(&exe, cfg, scratch.path(), "reload", &kernels)?;
            let restart = format!(
                "; a restart with the kernels cached on disk ({}, as every start after the \
                 first): {:.2} s, of which {:.2} s on the job's clock",
                KERNEL_CACHE_VAR, warm.secs, warm.in_job,
            );
            (cold, restart)
        }
        None => (in_process(&cfg, scratch.path())?, String::new()),
    };
    s.record(
        LOAD_8B,
        start.secs,
        start.secs,
        format!(
            "{:.2} GB of bf16 safetensors in {} (the page cache as the bench left it: warm where \
             it just wrote them); a first start: {}; peak RssAnon {:.2} GB over the whole job \
             (final checkpoint included){restart}{variant}",
            bytes as f64 / 1e9,
            dir.display(),
            start.counts,
            start.peak_rss,
        ),
    )
}

/// The seconds into the job of its first `metrics.jsonl` record in `run_dir`.
fn first_record_s(run_dir: &Path) -> Result<f64> {
    read_records(run_dir)?
        .first()
        .map(|r| r.job_s)
        .ok_or_else(|| invalid("the job logged no step".into()))
}

/// The job in this process, from its planning (configs, data scan, schedule) on.
fn in_process(cfg: &TrainConfig, scratch: &Path) -> Result<StartUp> {
    let planning = Instant::now();
    let plan = JobPlan::new(cfg)?;
    let planning = planning.elapsed().as_secs_f64();
    let rss = RssSampler::of_this_process();
    let out = train_plan(&plan, &scratch.join("run"))
        .map_err(|e| invalid(dflash_pipeline::error::cause_chain(&e)))?;
    let peak_rss = rss.peak_gb();
    let first = first_record_s(&out.run_dir)?;
    Ok(StartUp {
        secs: planning + first,
        counts: format!(
            "in this process: seconds from planning the job ({planning:.2} s: configs, data \
             scan, schedule) to the end of its first step ({first:.2} s in the job); the device \
             context and kernels this process made for earlier figures are not counted"
        ),
        in_job: first,
        peak_rss,
    })
}

/// A child process, killed on drop unless it has exited.
struct Running {
    child: Child,
    exited: bool,
}

impl Drop for Running {
    fn drop(&mut self) {
        if !self.exited {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The job as `exe train --config ...`, a process of its own: timed from its spawn to the
/// appearance of its first `metrics.jsonl` record, its `RssAnon` sampled every 10 ms until it
/// exits; its run is `scratch/name`, its CUDA kernels cached in `kernel_cache`.
fn in_child(
    exe: &Path,
    mut cfg: TrainConfig,
    scratch: &Path,
    name: &str,
    kernel_cache: &Path,
) -> Result<StartUp> {
    cfg.run.dir = scratch.to_path_buf();
    cfg.run.name = Some(name.into());
    let run_dir = scratch.join(name);
    let config = scratch.join(format!("{name}.toml"));
    let io = |path: &Path| {
        let path = path.display().to_string();
        move |source| BenchError::Io { path, source }
    };
    std::fs::write(&config, cfg.to_toml_string()?).map_err(io(&config))?;
    let log = scratch.join(format!("{name}.log"));
    let out = std::fs::File::create(&log).map_err(io(&log))?;
    let err = out.try_clone().map_err(io(&log))?;
    let metrics = run_dir.join("metrics.jsonl");

    // The file holds the config as resolved here, `DFLASH_*` variables included; in the child
    // they would override it again, over the bench's own settings (its run directory, step
    // count, backend).
    let mut command = Command::new(exe);
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy();
        if key.starts_with(dflash_config::ENV_PREFIX) && key.contains("__") {
            command.env_remove(&*key);
        }
    }
    command.env(KERNEL_CACHE_VAR, kernel_cache);
    let t0 = Instant::now();
    let child = command
        .arg("train")
        .arg("--config")
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(io(exe))?;
    let pid = child.id();
    let mut running = Running {
        child,
        exited: false,
    };
    let mut first_step = None;
    let mut peak = 0u64;
    let status = loop {
        if let Some(b) = rss_anon_bytes(Some(pid)) {
            peak = peak.max(b);
        }
        if first_step.is_none() && has_a_whole_line(&metrics) {
            first_step = Some(t0.elapsed().as_secs_f64());
        }
        if let Some(status) = running.child.try_wait().map_err(io(exe))? {
            running.exited = true;
            break status;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    if !status.success() {
        return Err(invalid(format!(
            "`{} train --config {}` failed ({status}); its output ends:\n{}",
            exe.display(),
            config.display(),
            tail(&log, 2000)
        )));
    }
    let secs = first_step.ok_or_else(|| invalid("the job logged no step".into()))?;
    let in_job = first_record_s(&run_dir)?;
    Ok(StartUp {
        secs,
        counts: format!(
            "`dflash train` as a process of its own: seconds from its spawn to its first step's \
             metrics record, polled every 10 ms ({:.2} s before the job's clock starts: process \
             start, configs, data scan, schedule; {in_job:.2} s on it: device start-up and \
             kernel compilation, memory plan, target load, first step)",
            (secs - in_job).max(0.0)
        ),
        in_job,
        peak_rss: peak as f64 / 1e9,
    })
}

/// Whether `path` holds a whole line yet (a record is written with its newline).
fn has_a_whole_line(path: &Path) -> bool {
    let mut buf = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(1 << 20).read_to_end(&mut buf))
        .is_ok_and(|_| buf.contains(&b'\n'))
}

/// The last `n` bytes of the file at `path`, lossily decoded.
fn tail(path: &Path, n: usize) -> String {
    let bytes = std::fs::read(path).unwrap_or_default();
    String::from_utf8_lossy(&bytes[bytes.len().saturating_sub(n)..]).into_owned()
}
