//! The output: JSONL, one finished conversation per line, each line written whole and
//! flushed, so a restart finds every finished sample (a torn last line is cut off). Beside
//! it, `OUT.meta.json` records what produced it; a restart with other settings is refused,
//! so one file never mixes, say, greedy and sampled answers. An output that holds no
//! complete line yet (a run that failed before its first answer) binds nothing: a restart
//! takes it over with its own settings.
//!
//! `OUT.skipped.jsonl` records the samples dropped (`{"index": i, "reason": "..."}` a line,
//! written as the output is): a restart counts them as handled instead of generating them
//! again, only to drop them again. Its records hold under the settings of `OUT.meta.json`
//! alone, so a takeover with other settings empties it. `prepare` never reads it as data: it
//! reads a JSONL file only where `--data` names that file (a directory or a pattern yields
//! Parquet and Arrow files alone).

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use dflash_models::safetensors_io::write_atomic;
use serde_json::{Value, json};

use crate::error::{RegenerateError, io_err};

/// Reasons of earlier runs' drops kept for an error that lists them.
const FIRST_REASONS: usize = 10;

/// `out` with `suffix` appended to its file name.
fn beside(out: &Path, suffix: &str) -> PathBuf {
    let mut name = out.file_name().unwrap_or_default().to_os_string();
    name.push(suffix);
    out.with_file_name(name)
}

/// Settings that outputs of earlier versions do not record: such an output is continued
/// (what it was written with is unknown, not different), one that records them must match.
const LATER_SETTINGS: [&str; 1] = ["backend"];

/// The settings file of `out`.
pub fn meta_path(out: &Path) -> PathBuf {
    beside(out, ".meta.json")
}

/// The record of the samples dropped from `out`.
pub fn skipped_path(out: &Path) -> PathBuf {
    beside(out, ".skipped.jsonl")
}

/// A file written at its end, which can be cut back to a length.
trait Tail: Write {
    fn len(&self) -> io::Result<u64>;
    fn cut(&mut self, len: u64) -> io::Result<()>;
}

impl Tail for File {
    fn len(&self) -> io::Result<u64> {
        Ok(self.metadata()?.len())
    }
    fn cut(&mut self, len: u64) -> io::Result<()> {
        self.set_len(len)
    }
}

/// A JSONL file appended to a whole line at a time.
struct Lines<F: Tail = File> {
    path: PathBuf,
    file: F,
    /// A failed write that could not be cut back: a line appended after it would leave the
    /// torn one mid-file, where a restart cannot cut it off.
    torn: bool,
}

impl Lines {
    fn open(path: &Path) -> Result<Lines, RegenerateError> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(io_err(path))?;
        Ok(Lines {
            path: path.to_path_buf(),
            file,
            torn: false,
        })
    }
}

impl<F: Tail> Lines<F> {
    /// Appends `line` and flushes it: a kill leaves at most this line torn, and a failed
    /// write is cut back off (or, where that fails too, ends the writing to this file).
    fn append(&mut self, line: &Value) -> Result<(), RegenerateError> {
        if self.torn {
            return Err(RegenerateError::Input(format!(
                "{}: not written to after a failed write left a torn line at its end (a \
                 restart cuts it off)",
                self.path.display()
            )));
        }
        let mut text = serde_json::to_string(line).expect("a JSON value serialises");
        text.push('\n');
        let before = self.file.len().map_err(io_err(&self.path))?;
        let written = self
            .file
            .write_all(text.as_bytes())
            .and_then(|()| self.file.flush());
        if let Err(e) = written {
            if self.file.cut(before).is_err() {
                self.torn = true;
            }
            return Err(io_err(&self.path)(e));
        }
        Ok(())
    }
}

pub struct Output {
    lines: Lines,
    skips: Lines,
    /// Sample indices already in the output.
    done: HashSet<u64>,
    /// Sample indices already dropped (in the record of drops).
    skipped: HashSet<u64>,
    /// The first drops an earlier run recorded, `(index, reason)`.
    skipped_first: Vec<(u64, String)>,
}

impl Output {
    /// Opens `path` (and its record of drops) for appending. A new file, or one without a
    /// complete line, gets `meta` written beside it; one with lines must have been written
    /// with the same `meta`, and its finished and dropped samples are read. A record of
    /// drops beside an output without lines is kept where its `meta` is this one.
    pub fn open(path: &Path, meta: &Value) -> Result<Output, RegenerateError> {
        let meta_file = meta_path(path);
        let skip_file = skipped_path(path);
        let bytes = read_if_exists(path)?;
        let skip_bytes = read_if_exists(&skip_file)?;
        // A file without a line is ours to take only where it was ours: our meta beside
        // it, or nothing in it at all.
        let foreign =
            |b: &Option<Vec<u8>>| b.as_ref().is_some_and(|b| !b.is_empty()) && !meta_file.exists();
        let has_line = bytes.as_ref().is_some_and(|b| b.contains(&b'\n'));
        let bound = if has_line || foreign(&bytes) || foreign(&skip_bytes) {
            check_meta(path, &meta_file, meta)?;
            true
        } else {
            // Drops recorded under these very settings still hold; under others they may not.
            skip_bytes.as_ref().is_some_and(|b| b.contains(&b'\n'))
                && check_meta(path, &meta_file, meta).is_ok()
        };
        let mut out = Output {
            lines: Lines::open(path)?,
            skips: Lines::open(&skip_file)?,
            done: HashSet::new(),
            skipped: HashSet::new(),
            skipped_first: Vec::new(),
        };
        if bound {
            out.read_done(&bytes.unwrap_or_default())?;
            out.read_skipped(&skip_bytes.unwrap_or_default())?;
        } else {
            // A torn first line of an earlier run, and drops made under other settings,
            // emptied before the new settings are written: a kill in between must not leave
            // those drops beside settings they do not hold under.
            truncate(path, 0)?;
            truncate(&skip_file, 0)?;
            let text = serde_json::to_vec_pretty(meta).expect("a JSON value serialises");
            write_atomic(&meta_file, &text)?;
        }
        Ok(out)
    }

    /// Whether sample `index` is handled already: in the output, or dropped.
    pub fn is_done(&self, index: u64) -> bool {
        self.done.contains(&index) || self.skipped.contains(&index)
    }
    /// The indices already in the output.
    pub fn done(&self) -> &HashSet<u64> {
        &self.done
    }
    /// The indices already dropped.
    pub fn skipped(&self) -> &HashSet<u64> {
        &self.skipped
    }
    /// The first drops recorded before this run, `(index, reason)`, by line.
    pub fn skipped_first(&self) -> &[(u64, String)] {
        &self.skipped_first
    }

    /// Appends one finished sample (an object with an `index`) as one line, flushed.
    pub fn write(&mut self, index: u64, line: &Value) -> Result<(), RegenerateError> {
        self.lines.append(line)?;
        self.done.insert(index);
        Ok(())
    }

    /// Records that sample `index` is dropped, and why, as one line, flushed.
    pub fn skip(&mut self, index: u64, reason: &str) -> Result<(), RegenerateError> {
        self.skips
            .append(&json!({"index": index, "reason": reason}))?;
        self.skipped.insert(index);
        Ok(())
    }

    fn read_done(&mut self, bytes: &[u8]) -> Result<(), RegenerateError> {
        let done = &mut self.done;
        read_lines(&self.lines.path, bytes, "an output line", &mut |i, _| {
            done.insert(i);
        })
    }

    fn read_skipped(&mut self, bytes: &[u8]) -> Result<(), RegenerateError> {
        let (skipped, first) = (&mut self.skipped, &mut self.skipped_first);
        read_lines(
            &self.skips.path,
            bytes,
            "a record of a drop",
            &mut |i, v| {
                if skipped.insert(i) && first.len() < FIRST_REASONS {
                    let reason = v.get("reason").and_then(Value::as_str).unwrap_or_default();
                    first.push((i, reason.to_string()));
                }
            },
        )
    }
}

fn read_if_exists(path: &Path) -> Result<Option<Vec<u8>>, RegenerateError> {
    match std::fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err(path)(e)),
    }
}

fn truncate(path: &Path, len: u64) -> Result<(), RegenerateError> {
    let f = OpenOptions::new()
        .write(true)
        .open(path)
        .map_err(io_err(path))?;
    f.set_len(len).map_err(io_err(path))
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
        .filter(|(k, _)| old.contains_key(*k) || !LATER_SETTINGS.contains(&k.as_str()))
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

/// Hands each complete line of `path` (whose contents are `bytes`) with its `index` to
/// `each`, after cutting off a torn last line; `what` names a line in an error.
fn read_lines(
    path: &Path,
    bytes: &[u8],
    what: &str,
    each: &mut dyn FnMut(u64, &Value),
) -> Result<(), RegenerateError> {
    let complete = bytes.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
    for (n, line) in bytes[..complete].split(|&b| b == b'\n').enumerate() {
        if line.is_empty() {
            continue;
        }
        let v = serde_json::from_slice::<Value>(line).ok();
        let index = v.as_ref().and_then(|v| v.get("index")?.as_u64());
        let (Some(v), Some(index)) = (v.as_ref(), index) else {
            return Err(RegenerateError::Resume {
                path: path.to_path_buf(),
                detail: format!("line {} is not {what} with an \"index\"", n + 1),
            });
        };
        each(index, v);
    }
    if complete < bytes.len() {
        truncate(path, complete as u64)?;
    }
    Ok(())
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
    fn an_output_from_before_the_backend_was_recorded_is_continued() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out.jsonl");
        let old = json!({"seed": 1});
        let mut o = Output::open(&out, &old).unwrap();
        o.write(0, &json!({"index": 0})).unwrap();
        drop(o);
        let now = json!({"seed": 1, "backend": "cuda"});
        let o = Output::open(&out, &now).unwrap();
        assert!(o.is_done(0));
        drop(o);
        // Recorded, it must match; other settings never pass for being missing.
        std::fs::write(meta_path(&out), now.to_string()).unwrap();
        let e = Output::open(&out, &json!({"seed": 1, "backend": "reference"}));
        assert!(e.err().unwrap().to_string().contains("backend"));
        let e = Output::open(&out, &json!({"seed": 1, "backend": "cuda", "top_k": 5}));
        assert!(e.err().unwrap().to_string().contains("top_k"));
    }

    #[test]
    fn drops_are_recorded_and_read_back_under_the_same_settings_only() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out.jsonl");
        let (first, second) = (json!({"temperature": 0.0}), json!({"temperature": 0.7}));
        let mut o = Output::open(&out, &first).unwrap();
        o.skip(3, "cut").unwrap();
        o.skip(5, "too long").unwrap();
        drop(o);
        // A kill in the middle of a third record.
        let skips = skipped_path(&out);
        let mut text = std::fs::read_to_string(&skips).unwrap();
        let whole = text.clone();
        text.push_str(r#"{"index": 7, "rea"#);
        std::fs::write(&skips, text).unwrap();
        // No output line yet, but the same settings: the drops hold.
        let o = Output::open(&out, &first).unwrap();
        assert!(o.is_done(3) && o.is_done(5) && !o.is_done(7));
        assert_eq!(o.skipped().len(), 2);
        assert!(o.done().is_empty());
        assert_eq!(
            o.skipped_first(),
            [(3, "cut".to_string()), (5, "too long".to_string())]
        );
        drop(o);
        assert_eq!(
            std::fs::read_to_string(&skips).unwrap(),
            whole,
            "torn line cut"
        );
        // Other settings take over an output without lines: drops made then may not hold.
        let o = Output::open(&out, &second).unwrap();
        assert!(!o.is_done(3));
        drop(o);
        assert_eq!(std::fs::read(&skips).unwrap(), b"");
        // Once the output has a line, the settings bind the drops as well.
        let mut o = Output::open(&out, &second).unwrap();
        o.write(0, &json!({"index": 0})).unwrap();
        o.skip(1, "cut").unwrap();
        drop(o);
        let e = Output::open(&out, &first).err().expect("other settings");
        assert!(e.to_string().contains("other settings"), "{e}");
        let o = Output::open(&out, &second).unwrap();
        assert!(o.is_done(0) && o.is_done(1));
        // A record that is not one is an error naming the file and line.
        drop(o);
        std::fs::write(&skips, "{\"index\": 1}\nnot json\n").unwrap();
        let e = Output::open(&out, &second).err().expect("not a record");
        let msg = e.to_string();
        assert!(
            msg.contains("out.jsonl.skipped.jsonl") && msg.contains("line 2"),
            "{msg}"
        );
    }

    #[test]
    fn a_takeover_empties_the_old_drops_before_it_writes_its_settings() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out.jsonl");
        let mut o = Output::open(&out, &json!({"temperature": 0.0})).unwrap();
        o.skip(3, "cut").unwrap();
        drop(o);
        // The new settings cannot be written (a directory in their way stands for a kill
        // at that point): the drops made under the old ones must be gone already.
        std::fs::remove_file(meta_path(&out)).unwrap();
        std::fs::create_dir(meta_path(&out)).unwrap();
        std::fs::write(meta_path(&out).join("x"), b"").unwrap();
        assert!(Output::open(&out, &json!({"temperature": 0.7})).is_err());
        assert_eq!(std::fs::read(skipped_path(&out)).unwrap(), b"");
    }

    /// A file whose writes put `room` bytes at most, then fail; `cut_fails` fails its cuts.
    struct Full {
        data: Vec<u8>,
        room: usize,
        cut_fails: bool,
    }

    impl Write for Full {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if self.room == 0 {
                return Err(io::Error::new(io::ErrorKind::StorageFull, "disk full"));
            }
            let n = buf.len().min(self.room);
            self.data.extend_from_slice(&buf[..n]);
            self.room -= n;
            Ok(n)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl Tail for Full {
        fn len(&self) -> io::Result<u64> {
            Ok(self.data.len() as u64)
        }
        fn cut(&mut self, len: u64) -> io::Result<()> {
            if self.cut_fails {
                return Err(io::Error::other("cannot cut"));
            }
            self.data.truncate(len as usize);
            Ok(())
        }
    }

    fn full(room: usize, cut_fails: bool) -> Lines<Full> {
        Lines {
            path: PathBuf::from("out.jsonl.skipped.jsonl"),
            file: Full {
                data: Vec::new(),
                room,
                cut_fails,
            },
            torn: false,
        }
    }

    #[test]
    fn a_failed_write_leaves_no_torn_line_behind() {
        let first = json!({"index": 1});
        let whole = format!("{first}\n").len();
        // Room for the first line and half the second: the half is cut back off.
        let mut lines = full(whole + 5, false);
        lines.append(&first).unwrap();
        let e = lines.append(&json!({"index": 2})).unwrap_err();
        assert!(e.to_string().contains("out.jsonl.skipped.jsonl"), "{e}");
        assert_eq!(lines.file.data, format!("{first}\n").as_bytes());
        // Where the cut fails as well, nothing more is written after the torn line.
        let mut lines = full(whole + 5, true);
        lines.append(&first).unwrap();
        lines.append(&json!({"index": 2})).unwrap_err();
        lines.file.room = 1000;
        let e = lines.append(&json!({"index": 3})).unwrap_err();
        assert!(e.to_string().contains("torn line"), "{e}");
        assert_eq!(lines.file.data.len(), whole + 5);
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
