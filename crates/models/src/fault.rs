//! Fault points for the crash suite: named moments at which a test stops the process so
//! that it can be killed there with SIGKILL, deterministically.
//!
//! Inert unless `DFLASH_FAULT` is set (read once; a point costs one load then). With
//! `DFLASH_FAULT=POINT` or `DFLASH_FAULT=POINT@K`, the K-th time (default 1) this process
//! reaches `POINT` it prints `DFLASH_FAULT: at POINT@K` on stderr and blocks that thread for
//! ever, touching nothing more: whoever watches stderr then kills the process. Blocking
//! instead of exiting keeps the kill a real SIGKILL from outside, with no destructor, flush
//! or exit code in between, exactly as the machine going away would.
//!
//! Points (`crates/cli/tests/crash.rs` kills at each):
//! - `write:FILE`: an atomic write of a file named FILE (`config.json`, `model.safetensors`,
//!   `optimizer.safetensors`, `trainer_state.json`, `latest`, `metrics.jsonl`,
//!   `summary.json`, `config.toml`, ...) has its temp file complete and not yet renamed;
//! - `stream:FILE`: a streamed tensor file has its header and first tensor written, the rest
//!   not (a torn temp file);
//! - `published`: `checkpoints/latest` names the new checkpoint, the old ones still exist;
//! - `accumulated`: a micro-batch's forward and backward are done, the step's update not.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// The environment variable naming the fault point.
pub const ENV: &str = "DFLASH_FAULT";

struct Spec {
    point: String,
    nth: u64,
    hits: AtomicU64,
}

fn spec() -> Option<&'static Spec> {
    static SPEC: OnceLock<Option<Spec>> = OnceLock::new();
    SPEC.get_or_init(|| {
        let v = std::env::var(ENV).ok()?;
        let (point, nth) = match v.rsplit_once('@') {
            Some((p, k)) => (p, k.trim().parse().ok()?),
            None => (v.as_str(), 1),
        };
        Some(Spec {
            point: point.trim().to_string(),
            nth,
            hits: AtomicU64::new(0),
        })
    })
    .as_ref()
}

/// The fault point `name` (see the module docs).
pub fn point(name: &str) {
    reached(|p| p == name);
}

/// The fault point `KIND:FILE`, FILE being the last component of `path`.
pub fn file_point(kind: &str, path: &std::path::Path) {
    reached(|p| {
        let file = path.file_name().and_then(|n| n.to_str());
        p.split_once(':')
            .is_some_and(|(k, f)| k == kind && Some(f) == file)
    });
}

fn reached(is_it: impl FnOnce(&str) -> bool) {
    let Some(s) = spec() else { return };
    if !is_it(&s.point) || s.hits.fetch_add(1, Ordering::SeqCst) + 1 != s.nth {
        return;
    }
    use std::io::Write;
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "{ENV}: at {}@{}", s.point, s.nth);
    let _ = err.flush();
    drop(err);
    loop {
        std::thread::park();
    }
}
