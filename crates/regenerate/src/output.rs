//! The output: JSONL, one finished conversation per line, each line written whole and
//! flushed, so a restart finds every finished sample (a torn last line is cut off). Beside
//! it, `OUT.meta.json` records what produced it; a restart with other settings is refused,
//! so one file never mixes, say, greedy and sampled answers.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{RegenerateError, io_err};

/// The settings file of `out`.
pub fn meta_path(out: &Path) -> PathBuf {
    let mut name = out.file_name().unwrap_or_default().to_os_string();
    name.push(".meta.json");
    out.with_file_name(name)
}

pub struct Output {
    path: PathBuf,
    file: File,
    /// Sample indices already in the file.
    done: HashSet<u64>,
}

impl Output {
    /// Opens `path` for appending. A new file gets `meta` written beside it; an existing
    /// one must have been written with the same `meta`, and its finished samples are read.
    pub fn open(path: &Path, meta: &Value) -> Result<Output, RegenerateError> {
        let meta_file = meta_path(path);
        let done = if path.exists() {
            check_meta(path, &meta_file, meta)?;
            read_done(path)?
        } else {
            write_atomically(&meta_file, &serde_json::to_vec_pretty(meta).expect("json"))?;
            HashSet::new()
        };
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(io_err(path))?;
        Ok(Output {
            path: path.to_path_buf(),
            file,
            done,
        })
    }

    /// Whether sample `index` is in the file already.
    pub fn is_done(&self, index: u64) -> bool {
        self.done.contains(&index)
    }
    /// The indices already in the file.
    pub fn done(&self) -> &HashSet<u64> {
        &self.done
    }

    /// Appends one finished sample (an object with an `index`) as one line, flushed.
    pub fn write(&mut self, index: u64, line: &Value) -> Result<(), RegenerateError> {
        let mut text = serde_json::to_string(line).expect("a JSON value serialises");
        text.push('\n');
        self.file
            .write_all(text.as_bytes())
            .and_then(|()| self.file.flush())
            .map_err(io_err(&self.path))?;
        self.done.insert(index);
        Ok(())
    }
}

fn write_atomically(path: &Path, bytes: &[u8]) -> Result<(), RegenerateError> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).map_err(io_err(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io_err(path))
}

fn check_meta(out: &Path, meta_file: &Path, meta: &Value) -> Result<(), RegenerateError> {
    let resume = |detail: String| RegenerateError::Resume {
        path: out.to_path_buf(),
        detail,
    };
    let text = std::fs::read_to_string(meta_file).map_err(|e| {
        resume(format!(
            "it exists, but {} cannot be read ({e}): not an output of dflash regenerate? \
             Choose another --out",
            meta_file.display()
        ))
    })?;
    let old: Value = serde_json::from_str(&text)
        .map_err(|e| resume(format!("{} is not JSON: {e}", meta_file.display())))?;
    let (Some(old), Some(new)) = (old.as_object(), meta.as_object()) else {
        return Err(resume(format!("{} is not an object", meta_file.display())));
    };
    let differ: Vec<String> = new
        .iter()
        .filter(|(k, v)| old.get(*k) != Some(*v))
        .map(|(k, v)| format!("{k}: {} then, {v} now", old.get(k).unwrap_or(&Value::Null)))
        .collect();
    if !differ.is_empty() {
        return Err(resume(format!(
            "it was written with other settings ({}); use the same settings or another --out",
            differ.join("; ")
        )));
    }
    Ok(())
}

/// The indices of the complete lines of `path`, after cutting off a torn last line.
fn read_done(path: &Path) -> Result<HashSet<u64>, RegenerateError> {
    let bytes = std::fs::read(path).map_err(io_err(path))?;
    let complete = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    if complete < bytes.len() {
        let f = OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(io_err(path))?;
        f.set_len(complete as u64).map_err(io_err(path))?;
    }
    let mut done = HashSet::new();
    for (n, line) in bytes[..complete].split(|&b| b == b'\n').enumerate() {
        if line.is_empty() {
            continue;
        }
        let index = serde_json::from_slice::<Value>(line)
            .ok()
            .and_then(|v| v.get("index")?.as_u64())
            .ok_or_else(|| RegenerateError::Resume {
                path: path.to_path_buf(),
                detail: format!("line {} is not an output line with an \"index\"", n + 1),
            })?;
        done.insert(index);
    }
    Ok(done)
}
