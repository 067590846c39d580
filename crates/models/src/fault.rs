//! Fault points for the crash and fault suites: named moments at which a test stops the
//! process (to kill it there with SIGKILL) or makes a worker fail, deterministically.
//!
//! Inert unless `DFLASH_FAULT` is set (read once; a point costs one load then). Three modes:
//!
//! - `DFLASH_FAULT=POINT` or `DFLASH_FAULT=POINT@K`: the K-th time (default 1) this process
//!   reaches `POINT` it prints `DFLASH_FAULT: at POINT@K` on stderr and blocks that thread for
//!   ever, touching nothing more: whoever watches stderr then kills the process. Blocking
//!   instead of exiting keeps the kill a real SIGKILL from outside, with no destructor, flush
//!   or exit code in between, exactly as the machine going away would.
//! - `DFLASH_FAULT=fail:POINT[@K]`: the K-th time a worker reaches `POINT` (a point that can
//!   fail, see [`fail_point`]) it returns an error instead, as a device fault would: the run
//!   must stop every worker, keep its last checkpoint and resume from it.
//! - `DFLASH_FAULT=panic:POINT[@K]`: at the same points, the worker panics instead, as a bug
//!   would: the run must stop every worker all the same (none left waiting for the panicked
//!   one), naming it.
//!
//! Points that block (`crates/cli/tests/crash.rs` kills at each):
//! - `write:FILE`: an atomic write of a file named FILE (`config.json`, `model.safetensors`,
//!   `optimizer.st`, `trainer_state.json`, `latest`, `metrics.jsonl`,
//!   `summary.json`, `config.toml`, ...) has its temp file complete and not yet renamed;
//! - `stream:FILE`: a streamed tensor file has its header and first tensor written, the rest
//!   not (a torn temp file);
//! - `published`: `checkpoints/latest` names the new checkpoint, the old ones still exist;
//! - `accumulated`: a micro-batch's forward and backward are done, the step's update not.
//!
//! Points that fail (`crates/cli/tests/faults.rs`):
//! - `drafter-step:R`: drafter replica R starts a step (K counts this invocation's steps);
//! - `target-batch:I`: target worker I starts a micro-batch.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// The environment variable naming the fault point.
pub const ENV: &str = "DFLASH_FAULT";

/// What a fault does at its point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Block,
    Fail,
    Panic,
}

struct Spec {
    mode: Mode,
    point: String,
    nth: u64,
    hits: AtomicU64,
}

fn spec() -> Option<&'static Spec> {
    static SPEC: OnceLock<Option<Spec>> = OnceLock::new();
    SPEC.get_or_init(|| {
        let v = std::env::var(ENV).ok()?;
        let (mode, v) = if let Some(rest) = v.strip_prefix("fail:") {
            (Mode::Fail, rest)
        } else if let Some(rest) = v.strip_prefix("panic:") {
            (Mode::Panic, rest)
        } else {
            (Mode::Block, v.as_str())
        };
        let (point, nth) = match v.rsplit_once('@') {
            Some((p, k)) => (p, k.trim().parse().ok()?),
            None => (v, 1),
        };
        Some(Spec {
            mode,
            point: point.trim().to_string(),
            nth,
            hits: AtomicU64::new(0),
        })
    })
    .as_ref()
}

/// The fault point `name` (see the module docs).
pub fn point(name: &str) {
    if hit(|m| m == Mode::Block, |p| p == name).is_some() {
        block_here();
    }
}

/// The fault point `KIND:FILE`, FILE being the last component of `path`.
pub fn file_point(kind: &str, path: &std::path::Path) {
    let is_it = |p: &str| {
        let file = path.file_name().and_then(|n| n.to_str());
        p.split_once(':')
            .is_some_and(|(k, f)| k == kind && Some(f) == file)
    };
    if hit(|m| m == Mode::Block, is_it).is_some() {
        block_here();
    }
}

/// A point where a worker can be made to fail: `Err` with a message naming the fault when
/// `DFLASH_FAULT=fail:NAME@K` and this is the K-th time, `Ok` otherwise; a panic naming the
/// fault with `DFLASH_FAULT=panic:NAME@K`.
pub fn fail_point(name: &str) -> Result<(), String> {
    match hit(|m| m != Mode::Block, |p| p == name) {
        Some((Mode::Panic, nth)) => panic!("fault injected by {ENV}=panic:{name}@{nth}"),
        Some((_, nth)) => Err(format!("fault injected by {ENV}=fail:{name}@{nth}")),
        None => Ok(()),
    }
}

/// `Some((mode, K))` when this reach of a point of a mode `mode_ok` accepts is the configured
/// K-th.
fn hit(
    mode_ok: impl FnOnce(Mode) -> bool,
    is_it: impl FnOnce(&str) -> bool,
) -> Option<(Mode, u64)> {
    let s = spec()?;
    if !mode_ok(s.mode) || !is_it(&s.point) || s.hits.fetch_add(1, Ordering::SeqCst) + 1 != s.nth {
        return None;
    }
    Some((s.mode, s.nth))
}

fn block_here() -> ! {
    let s = spec().expect("a blocking fault is configured");
    use std::io::Write;
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{ENV}: at {}@{}", s.point, s.nth);
    let _ = err.flush();
    drop(err);
    loop {
        std::thread::park();
    }
}
