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
//!
//! Cargo runs xtask (the `cargo xtask` alias is `cargo run`) in the directory it was invoked
//! from, and xtask finds the workspace from its own manifest directory. `dflash` runs from the
//! workspace root (where the embedded default config and its relative paths resolve), so the
//! paths a user gives on the command line are made absolute against the invocation directory
//! first ([`absolutise`]): `cd configs && cargo xtask train --config my.toml` reads
//! `configs/my.toml`.

mod emu;
mod wgmma;

use std::ffi::OsString;
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
    // Where the user ran cargo; `None` (a directory since removed): the paths stay as given.
    let cwd = std::env::current_dir().ok();
    let user_args = |task: &str| match &cwd {
        Some(cwd) => absolutise(task, &rest, cwd),
        None => rest.iter().map(OsString::from).collect(),
    };
    match task.as_str() {
        "train" | "eval" | "status" | "backends" => {
            status(cli_command(&root, &task, &rest, &user_args(&task)))
        }
        "bench" => status(bench_command(&root, &rest, &user_args("bench"))),
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
        "emu" => match emu::quick(&rest) {
            Ok(quick) => emu::run(&root, quick),
            Err(e) => {
                eprintln!("xtask emu: {e}; usage: cargo xtask emu [--quick]");
                ExitCode::FAILURE
            }
        },
        _ => {
            eprintln!(
                "usage: cargo xtask <train|eval|status|backends|bench|conformance|test|gen-wgmma|emu> [ARGS]"
            );
            ExitCode::FAILURE
        }
    }
}

/// `dflash TASK ARGS` in release, `ARGS` being `rest` with its paths made absolute; `train`
/// gets the embedded default config unless `rest` names a config or a run to resume.
fn cli_command(root: &Path, task: &str, rest: &[String], args: &[OsString]) -> Command {
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
    c.args(args);
    c
}

/// The flags of the `dflash` commands xtask forwards whose value is a path.
const PATH_FLAGS: [&str; 8] = [
    "--config",
    "--resume",
    "--drafter",
    "--data",
    "--json",
    "--out",
    "--results-dir",
    "--baselines",
];

/// Their flags whose separate value is not a path: skipped whole, so that a value that reads
/// like a flag (`--set run.name=--config` is one argument, `--set --config` would be two) is
/// not taken for one.
const VALUE_FLAGS: [&str; 10] = [
    "--set",
    "--backend",
    "--attention",
    "--only",
    "--scale",
    "--device",
    "--threads",
    "--warmup",
    "--runs",
    "--steps",
];

/// `rest`, the arguments of `dflash TASK`, with each path made absolute against `cwd` (an
/// absolute path stays as it is): the values of [`PATH_FLAGS`] in every form clap takes
/// (`--flag P`, `--flag=P`, and `--config`'s short `-c P`, `-cP`, `-c=P`), and `status`'s run
/// directory. Paths inside configs and `--set` values are not touched: `dflash` resolves those
/// itself.
fn absolutise(task: &str, rest: &[String], cwd: &Path) -> Vec<OsString> {
    let abs = |p: &str| -> OsString {
        match p.is_empty() {
            true => p.into(),
            false => cwd.join(p).into_os_string(),
        }
    };
    let joined = |head: &str, p: &str| {
        let mut s = OsString::from(head);
        s.push(abs(p));
        s
    };
    let takes_path = |a: &str| a == "-c" || PATH_FLAGS.contains(&a);
    let mut out = Vec::with_capacity(rest.len());
    let mut args = rest.iter();
    let mut positionals_only = false;
    while let Some(a) = args.next() {
        if positionals_only || !a.starts_with('-') {
            // `status RUN_DIR`; no other forwarded command takes a positional.
            out.push(if task == "status" { abs(a) } else { a.into() });
        } else if a == "--" {
            positionals_only = true;
            out.push(a.into());
        } else if takes_path(a) || VALUE_FLAGS.contains(&a.as_str()) {
            out.push(a.into());
            if let Some(v) = args.next() {
                out.push(if takes_path(a) { abs(v) } else { v.into() });
            }
        } else if let Some((flag, p)) = a.split_once('=')
            && takes_path(flag)
        {
            out.push(joined(&format!("{flag}="), p));
        } else if let Some(p) = a.strip_prefix("-c")
            && !a.starts_with("--")
        {
            out.push(joined("-c", p));
        } else {
            out.push(a.into());
        }
    }
    out
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

/// `dflash bench ARGS` in release (`ARGS`: `rest` with its paths made absolute); with
/// `--backend cuda` and neither `--out` nor `--results-dir`, the results go to
/// `bench/results` (`dflash bench` merges an `--only` run into the GPU's file there rather
/// than replacing the full run's figures).
fn bench_command(root: &Path, rest: &[String], args: &[OsString]) -> Command {
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
    c.args(["--", "bench"]).args(args);
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
    use super::{absolutise, names_config_or_run};
    use std::ffi::OsString;
    use std::path::Path;

    /// `rest` of `dflash TASK` as xtask passes it on, invoked from `/work/configs`.
    fn passed(task: &str, rest: &[&str]) -> Vec<OsString> {
        let rest: Vec<String> = rest.iter().map(|s| s.to_string()).collect();
        absolutise(task, &rest, Path::new("/work/configs"))
    }

    fn os(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    #[test]
    fn user_paths_are_made_absolute_against_the_invocation_directory() {
        let cases: &[(&str, &[&str], &[&str])] = &[
            (
                "train",
                &["--config", "my.toml"],
                &["--config", "/work/configs/my.toml"],
            ),
            (
                "train",
                &["--config=my.toml"],
                &["--config=/work/configs/my.toml"],
            ),
            (
                "train",
                &["-c", "my.toml"],
                &["-c", "/work/configs/my.toml"],
            ),
            ("train", &["-cmy.toml"], &["-c/work/configs/my.toml"]),
            ("train", &["-c=my.toml"], &["-c=/work/configs/my.toml"]),
            (
                "train",
                &["--resume", "../runs/a"],
                &["--resume", "/work/configs/../runs/a"],
            ),
            ("train", &["--resume=/abs/run"], &["--resume=/abs/run"]),
            (
                "eval",
                &["--drafter", "d", "--data=e.jsonl", "--backend", "wgpu"],
                &[
                    "--drafter",
                    "/work/configs/d",
                    "--data=/work/configs/e.jsonl",
                    "--backend",
                    "wgpu",
                ],
            ),
            ("status", &["runs/a"], &["/work/configs/runs/a"]),
            ("status", &["--", "-odd"], &["--", "/work/configs/-odd"]),
            (
                "bench",
                &["--backend", "cuda", "--out", "r.json", "--baselines=b.json"],
                &[
                    "--backend",
                    "cuda",
                    "--out",
                    "/work/configs/r.json",
                    "--baselines=/work/configs/b.json",
                ],
            ),
            (
                "bench",
                &["--results-dir", "res"],
                &["--results-dir", "/work/configs/res"],
            ),
        ];
        for (task, rest, want) in cases {
            assert_eq!(passed(task, rest), os(want), "{task} {rest:?}");
        }
    }

    #[test]
    fn everything_but_paths_passes_unchanged() {
        for (task, rest) in [
            ("train", &["--set", "data.train=x", "--set", "--config"][..]),
            ("train", &["--backend", "wgpu", "--attention", "wgpu-tiled"]),
            ("train", &["--configure", "--config="]),
            ("train", &["--config"]),
            ("backends", &[]),
            ("eval", &["--", "x"]),
        ] {
            assert_eq!(passed(task, rest), os(rest), "{task} {rest:?}");
        }
    }

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
