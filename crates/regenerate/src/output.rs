//! The output: JSONL, one finished conversation per line, each line written whole and
//! flushed, so a restart finds every finished sample (a torn last line is cut off). Beside
//! it, `OUT.meta.json` records what produced it; a restart with other settings is refused,
//! so one file never mixes, say, greedy and sampled answers. An output that holds no
//! complete line yet (a run that failed before its first answer) binds nothing: a restart
//! takes it over with its own settings.

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};

use dflash_models::safetensors_io::write_atomic;
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
    /// Opens `path` for appending. A new file, or one without a complete line, gets `meta`
    /// written beside it; one with lines must have been written with the same `meta`, and
    /// its finished samples are read.
    pub fn open(path: &Path, meta: &Value) -> Result<Output, RegenerateError> {
        let meta_file = meta_path(path);
        let bytes = match std::fs::read(path) {
            Ok(bytes) => Some(bytes),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(io_err(path)(e)),
        };
        let done = match bytes {
            // A file without a line is ours to take only where it was ours: our meta beside
            // it, or nothing in it at all.
            Some(b) if b.contains(&b'\n') || (!b.is_empty() && !meta_file.exists()) => {
                check_meta(path, &meta_file, meta)?;
                read_done(path, &b)?
            }
            _ => {
                let text = serde_json::to_vec_pretty(meta).expect("a JSON value serialises");
                write_atomic(&meta_file, &text)?;
                // A torn first line of an earlier run.
                File::create(path).map_err(io_err(path))?;
                HashSet::new()
            }
        };
        let file = OpenOptions::new()
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

/// The indices of the complete lines of `path` (whose contents are `bytes`), after cutting
/// off a torn last line.
fn read_done(path: &Path, bytes: &[u8]) -> Result<HashSet<u64>, RegenerateError> {
    let complete = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
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
    if complete < bytes.len() {
        let f = OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(io_err(path))?;
        f.set_len(complete as u64).map_err(io_err(path))?;
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    use serde_json::json;

    #[test]
    fn an_output_without_a_complete_line_takes_the_new_settings() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out.jsonl");
        let (first, second) = (json!({"temperature": 0.0}), json!({"temperature": 0.7}));
        drop(Output::open(&out, &first).unwrap());
        // The first run failed before its first answer: the second may use other settings.
        drop(Output::open(&out, &second).unwrap());
        let meta: Value =
            serde_json::from_str(&std::fs::read_to_string(meta_path(&out)).unwrap()).unwrap();
        assert_eq!(meta, second);
        // Also over a torn first line (a kill in the middle of the first write).
        std::fs::write(&out, br#"{"index": 0, "mess"#).unwrap();
        drop(Output::open(&out, &first).unwrap());
        assert_eq!(std::fs::read(&out).unwrap(), b"", "the torn line is cut");
        // Once a line is written, the settings are bound.
        let mut o = Output::open(&out, &first).unwrap();
        o.write(0, &json!({"index": 0})).unwrap();
        drop(o);
        let e = Output::open(&out, &second).err().expect("other settings");
        assert!(e.to_string().contains("other settings"), "{e}");
        assert!(Output::open(&out, &first).unwrap().is_done(0));
    }

    #[test]
    fn a_file_that_is_not_an_output_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("notes.jsonl");
        std::fs::write(&out, b"some text without a newline").unwrap();
        let e = Output::open(&out, &json!({})).err().expect("not ours");
        assert!(
            e.to_string().contains("not an output of dflash regenerate"),
            "{e}"
        );
        assert_eq!(std::fs::read(&out).unwrap(), b"some text without a newline");
        assert!(!meta_path(&out).exists());
    }
}
