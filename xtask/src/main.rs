//! `cargo xtask <task>`: the project's entry points, with no set-up beyond cargo.
//!
//! - `train [ARGS]`  build `dflash` in release and train on the embedded default
//!   (`configs/default.toml`) unless `--config` is given; other args pass through.
//! - `conformance`   run the backend/attention-kernel conformance suite; with
//!   `--plugin PATH`, the foreign-plugin conformance table of the shared library at `PATH`.
//! - `test`          the test command CI runs.
//! - `bench [ARGS]`  build `dflash` in release and run `dflash bench ARGS` (table + JSON of the
//!   docs/design.md §4 comparisons; without `--attention` the backend's preferred kernel from
//!   the registry, e.g. the tuned flash kernel on CUDA). With `--backend cuda` and without
//!   `--out` it writes `bench/results/<gpu-name-slug>.json`.
//! - `gen-wgmma`     rewrite the generated wgmma wrappers of the CUDA attention kernels.
//! - `emu [--quick]` run the kernel lab's CPU emulators of the CUDA kernels (no GPU; needs
//!   g++, python3 and numpy).

mod emu;
mod wgmma;

use std::path::Path;
use std::process::{Command, ExitCode};

fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

fn status(mut c: Command) -> ExitCode {
    match c.status() {
        Ok(s) if s.success() => ExitCode::SUCCESS,
        Ok(s) => ExitCode::from(s.code().unwrap_or(1).clamp(1, 255) as u8),
        Err(e) => {
            eprintln!("xtask: could not run {c:?}: {e}");
            ExitCode::FAILURE
        }
    }
}

fn main() -> ExitCode {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask is in the workspace")
        .to_path_buf();
    let mut args = std::env::args().skip(1);
    let task = args.next().unwrap_or_default();
    let rest: Vec<String> = args.collect();
    match task.as_str() {
        "train" | "eval" | "status" | "backends" => status(cli_command(&root, &task, &rest)),
        "bench" => status(bench_command(&root, &rest)),
        "conformance" if rest.first().is_some_and(|a| a == "--plugin") => {
            let Some(path) = rest.get(1) else {
                eprintln!("usage: cargo xtask conformance --plugin PATH/TO/libplugin.so");
                return ExitCode::FAILURE;
            };
            status(plugin_conformance_command(&root, path))
        }
        "conformance" => {
            let mut c = cargo();
            c.current_dir(&root)
                .args(["test", "-p", "dflash-tests"])
                .args(&rest);
            status(c)
        }
        "test" => {
            let mut c = cargo();
            c.current_dir(&root)
                .args(["test", "--workspace"])
                .args(&rest);
            status(c)
        }
        "gen-wgmma" => write_wgmma(&root),
        "emu" => emu::run(&root, rest.iter().any(|a| a == "--quick")),
        _ => {
            eprintln!(
                "usage: cargo xtask <train|eval|status|backends|bench|conformance|test|gen-wgmma|emu> [ARGS]"
            );
            ExitCode::FAILURE
        }
    }
}

/// `dflash TASK REST` in release; `train` gets the embedded default config unless `REST`
/// names a config or a run to resume.
fn cli_command(root: &Path, task: &str, rest: &[String]) -> Command {
    let mut c = cargo();
    c.current_dir(root).args([
        "run",
        "--release",
        "--quiet",
        "-p",
        "dflash-cli",
        "--",
        task,
    ]);
    if task == "train" && !names_config_or_run(rest) {
        c.args(["--config", "configs/default.toml"]);
    }
    c.args(rest);
    c
}

/// Whether `dflash train` arguments name a config or a run to resume, in any form clap takes
/// (`--config P`, `--config=P`, `-c P`, `-cP`, `-c=P`, `--resume D`, `--resume=D`).
fn names_config_or_run(rest: &[String]) -> bool {
    rest.iter()
        .take_while(|a| *a != "--")
        .any(|a| has_flag(a, "--config") || has_flag(a, "--resume") || a.starts_with("-c"))
}

/// Whether the argument `a` is `flag` or `flag=VALUE`.
fn has_flag(a: &str, flag: &str) -> bool {
    a.strip_prefix(flag)
        .is_some_and(|r| r.is_empty() || r.starts_with('='))
}

/// `dflash bench REST` in release; with `--backend cuda` and neither `--out` nor
/// `--results-dir`, the results go to `bench/results`.
fn bench_command(root: &Path, rest: &[String]) -> Command {
    // `--flag value` or `--flag=value`.
    let value = |flag: &str| -> Option<String> {
        let eq = format!("{flag}=");
        rest.iter().enumerate().find_map(|(i, a)| {
            if a == flag {
                rest.get(i + 1).cloned()
            } else {
                a.strip_prefix(&eq).map(str::to_string)
            }
        })
    };
    let has = |flag: &str| rest.iter().any(|a| has_flag(a, flag));
    let cuda = value("--backend").as_deref() == Some("cuda");
    let mut c = cargo();
    c.current_dir(root)
        .args(["run", "--release", "--quiet", "-p", "dflash-cli"]);
    c.args(["--", "bench"]).args(rest);
    if cuda && !has("--out") && !has("--results-dir") {
        c.args(["--results-dir", "bench/results"]);
    }
    c
}

/// The foreign-plugin conformance table of the shared library at `path` (the caller's path,
/// made absolute when it exists: cargo runs from the workspace root).
fn plugin_conformance_command(root: &Path, path: &str) -> Command {
    let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.into());
    let mut c = cargo();
    c.current_dir(root)
        .args(["run", "--quiet", "-p", "dflash-plugin-conformance", "--"])
        .arg(path);
    c
}

/// Rewrites the generated wgmma wrappers under `root`.
fn write_wgmma(root: &Path) -> ExitCode {
    let path = root.join(wgmma::PATH);
    match std::fs::write(&path, wgmma::generate()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: write {}: {e}", path.display());
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::names_config_or_run;

    #[test]
    fn a_config_or_run_is_seen_in_every_form_clap_takes() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        for named in [
            &["--config", "x.toml"][..],
            &["--config=x.toml"],
            &["-c", "x.toml"],
            &["-cx.toml"],
            &["--set", "train.lr=1e-3", "--resume", "runs/a"],
            &["--resume=runs/a"],
        ] {
            assert!(names_config_or_run(&args(named)), "{named:?}");
        }
        for plain in [
            &[][..],
            &["--set", "train.lr=1e-3"],
            &["--backend", "wgpu"],
            &["--configure"],
            &["--set", "run.name=--config"],
        ] {
            assert!(!names_config_or_run(&args(plain)), "{plain:?}");
        }
    }
}
