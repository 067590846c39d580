//! The results file: its name (a slug of the backend and device), atomic writes, and the
//! merge of a partial run into an earlier one.

use std::path::Path;

use crate::{BenchError, BenchResult, Result};

/// A file-name slug of the accelerator in a `BackendInfo::device()` string: the text inside
/// the first parentheses up to its first comma when there is one (`"cuda:0 (NVIDIA H200,
/// sm_90)"` -> `nvidia-h200`), else the whole string; lower-case ASCII alphanumerics joined
/// by single dashes.
pub fn device_slug(device: &str) -> String {
    let inner = match (device.find('('), device.rfind(')')) {
        (Some(a), Some(b)) if b > a + 1 => device[a + 1..b].split(',').next().unwrap_or(""),
        _ => device,
    };
    let src = if inner.trim().is_empty() {
        device
    } else {
        inner
    };
    let mut out = String::new();
    for c in src.chars() {
        if c.is_ascii_alphanumeric() {
            out.push(c.to_ascii_lowercase());
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    while out.ends_with('-') {
        out.pop();
    }
    if out.is_empty() { "device".into() } else { out }
}

/// The file-name slug of a results file: [`device_slug`] of `device` for the CUDA backend (the
/// names of the files already in `bench/results`), prefixed by the backend's name for any
/// other, so that two backends on one machine (wgpu and CUDA on an H200) keep files apart.
pub fn results_slug(backend: &str, device: &str) -> String {
    let device = device_slug(device);
    match backend {
        "cuda" => device,
        other => format!("{}-{device}", device_slug(other)),
    }
}

/// Writes `results` as a pretty JSON list to `path`, creating parent directories. The list
/// goes to a temporary file beside `path` first, renamed over it once whole, so a crash or a
/// full disk mid-write leaves the earlier file rather than a truncated one.
pub fn write_json(path: &Path, results: &[BenchResult]) -> Result<()> {
    let io = |source| BenchError::Io {
        path: path.display().to_string(),
        source,
    };
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    if let Some(dir) = dir {
        std::fs::create_dir_all(dir).map_err(io)?;
    }
    let mut text = serde_json::to_string_pretty(results)?;
    text.push('\n');
    let mut tmp = tempfile::Builder::new()
        .prefix(".bench-")
        .suffix(".json.tmp")
        .tempfile_in(dir.unwrap_or(Path::new(".")))
        .map_err(io)?;
    std::io::Write::write_all(&mut tmp, text.as_bytes()).map_err(io)?;
    tmp.persist(path).map_err(|e| io(e.error))?;
    Ok(())
}

/// The results file `existing` with `new` merged in: a figure of the same name is replaced
/// where it stood, the others kept, figures new to the file appended.
pub fn merge_results(existing: Vec<BenchResult>, new: &[BenchResult]) -> Vec<BenchResult> {
    let mut out = existing;
    for r in new {
        match out.iter_mut().find(|o| o.name == r.name) {
            Some(o) => *o = r.clone(),
            None => out.push(r.clone()),
        }
    }
    out
}

/// Reads a JSON list written by [`write_json`].
pub fn read_json(path: &Path) -> Result<Vec<BenchResult>> {
    let text = std::fs::read_to_string(path).map_err(|source| BenchError::Io {
        path: path.display().to_string(),
        source,
    })?;
    Ok(serde_json::from_str(&text)?)
}
