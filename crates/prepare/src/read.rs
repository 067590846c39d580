//! Chat dataset readers: JSON Lines (a leading UTF-8 byte order mark is ignored), a `.json`
//! file holding one array of conversations, Parquet files, and Arrow stream data (an HF
//! `save_to_disk` directory, a `.arrow` stream file, or a directory of `.parquet` files as the
//! HF hub lays them out). Column-oriented rows are turned into the JSON objects a JSONL line
//! would hold, so one parser reads every format. Only the conversation columns (`messages`,
//! `conversations`, `system`) are read.
//!
//! A hub folder keeps every split side by side (`train_sft-00000-of-00003.parquet`,
//! `test_sft-00000-of-00001.parquet`, ...), so a folder whose Parquet files belong to more
//! than one split is refused rather than read as one dataset; a file-name pattern such as
//! `data/train_sft-*.parquet` (`*` and `?` in the last component) picks one split's files.

use std::fs::File;
use std::path::{Path, PathBuf};

use arrow_array::{Array, RecordBatch};
use arrow_schema::{DataType, Schema};
use serde_json::Value;

use crate::arrow_json::cell;
use crate::error::PrepareError;

/// The columns a conversation is read from.
pub const COLUMNS: [&str; 3] = ["messages", "conversations", "system"];

/// One opened input, read in chunks of rows.
pub struct Input {
    path: PathBuf,
    files: Vec<PathBuf>,
    kind: Kind,
}

enum Kind {
    /// Lines of one JSONL file (the file is read whole and every line checked when it is
    /// opened; rows are parsed per chunk).
    Jsonl(Vec<u8>),
    /// A `.json` file holding one array of objects (ShareGPT exports).
    JsonArray(Vec<Value>),
    Parquet(Vec<PathBuf>),
    Arrow(Vec<PathBuf>),
}

/// A row: its global index and the JSON object it holds.
pub type Row = (u64, Value);

impl Input {
    /// Chooses the reader by path: a directory (HF `save_to_disk`, a folder of `*.arrow`
    /// stream files, or a folder of `*.parquet` files of one split), a `.jsonl` / `.ndjson` /
    /// `.json` file, a `.parquet` file, a `.arrow` stream file, or a pattern over the file
    /// names of one folder (`*` and `?` in the last component) that matches `.parquet` or
    /// `.arrow` files.
    pub fn open(path: &Path) -> Result<Self, PrepareError> {
        let bad = |detail: &str| PrepareError::Input {
            path: path.to_path_buf(),
            detail: detail.into(),
        };
        let kind = if path.is_dir() {
            let parquet = files_with_ext(path, "parquet")?;
            if !parquet.is_empty() && !path.join("state.json").exists() {
                one_split(path, &parquet)?;
                Kind::Parquet(parquet)
            } else {
                Kind::Arrow(dflash_data::save_to_disk_files(path)?)
            }
        } else if !path.exists() {
            match path.file_name().and_then(|n| n.to_str()) {
                Some(name) if name.contains(['*', '?']) => matching_files(path, name)?,
                _ => return Err(bad("no such file or directory")),
            }
        } else {
            let ext = path
                .extension()
                .and_then(|e| e.to_str())
                .unwrap_or("")
                .to_ascii_lowercase();
            match ext.as_str() {
                "jsonl" | "ndjson" | "json" => {
                    let text = std::fs::read(path).map_err(|e| PrepareError::io(path, e))?;
                    let body = text.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(&text);
                    if ext == "json" && body.trim_ascii_start().starts_with(b"[") {
                        json_array(path, body)?
                    } else {
                        check_jsonl(path, &text)?;
                        Kind::Jsonl(text)
                    }
                }
                "parquet" => Kind::Parquet(vec![path.to_path_buf()]),
                "arrow" => Kind::Arrow(vec![path.to_path_buf()]),
                _ => {
                    return Err(bad(
                        "unrecognized chat dataset: expected a .jsonl, .parquet or .arrow file, \
                         or a datasets save_to_disk directory",
                    ));
                }
            }
        };
        let files = match &kind {
            Kind::Parquet(files) | Kind::Arrow(files) => files.clone(),
            Kind::Jsonl(_) | Kind::JsonArray(_) => vec![path.to_path_buf()],
        };
        Ok(Input {
            path: path.to_path_buf(),
            files,
            kind,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The files read, in the order they are read.
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    /// The number of rows where it is known without reading them (for the progress bar).
    pub fn rows_hint(&self) -> Option<u64> {
        match &self.kind {
            Kind::Jsonl(text) => {
                Some(jsonl_lines(text).filter(|(_, l)| !l.is_empty()).count() as u64)
            }
            Kind::JsonArray(rows) => Some(rows.len() as u64),
            Kind::Parquet(files) => {
                let mut n = 0u64;
                for f in files {
                    let file = File::open(f).ok()?;
                    let b = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(
                        file,
                    )
                    .ok()?;
                    n += b.metadata().file_metadata().num_rows() as u64;
                }
                Some(n)
            }
            Kind::Arrow(_) => None,
        }
    }

    /// Calls `f` with successive chunks of about `chunk` rows, in order.
    pub fn for_each_chunk(
        &self,
        chunk: usize,
        f: &mut dyn FnMut(Vec<Row>) -> Result<(), PrepareError>,
    ) -> Result<(), PrepareError> {
        self.for_each_chunk_by_file(chunk, f).map(|_| ())
    }

    /// [`for_each_chunk`](Self::for_each_chunk), returning the global index of each file's
    /// first row, one per file of [`files`](Self::files) (so that a row's index names its
    /// file and its row there).
    pub fn for_each_chunk_by_file(
        &self,
        chunk: usize,
        f: &mut dyn FnMut(Vec<Row>) -> Result<(), PrepareError>,
    ) -> Result<Vec<u64>, PrepareError> {
        let chunk = chunk.max(1);
        let mut next = 0u64;
        let mut starts = Vec::with_capacity(self.files.len());
        match &self.kind {
            Kind::Jsonl(text) => {
                let mut rows = Vec::with_capacity(chunk);
                for (line, raw) in jsonl_lines(text) {
                    if raw.is_empty() {
                        continue;
                    }
                    rows.push((next, parse_line(&self.path, line, raw)?));
                    next += 1;
                    if rows.len() == chunk {
                        f(std::mem::take(&mut rows))?;
                    }
                }
                if !rows.is_empty() {
                    f(rows)?;
                }
            }
            Kind::JsonArray(rows) => {
                for part in rows.chunks(chunk) {
                    let start = next;
                    next += part.len() as u64;
                    f((start..next).zip(part.iter().cloned()).collect())?;
                }
            }
            Kind::Arrow(files) => {
                for file in files {
                    starts.push(next);
                    let (schema, batches) = dflash_data::read_stream_file(file)?;
                    let cols = conversation_columns(file, &schema)?;
                    for batch in batches {
                        f(batch_rows(file, &batch, &cols, &mut next)?)?;
                    }
                }
            }
            Kind::Parquet(files) => {
                for file in files {
                    starts.push(next);
                    read_parquet(file, chunk, &mut next, f)?;
                }
            }
        }
        // A JSONL file or a JSON array is one file whose rows start at 0.
        if starts.is_empty() {
            starts.push(0);
        }
        Ok(starts)
    }
}

/// A whole-file JSON array; each element must be an object (the error names it as "line"
/// `k + 1`, its 1-based position in the array).
fn json_array(path: &Path, body: &[u8]) -> Result<Kind, PrepareError> {
    let v: Vec<Value> = serde_json::from_slice(body).map_err(|e| PrepareError::BadLine {
        path: path.to_path_buf(),
        line: e.line(),
        detail: format!("not a JSON array of objects: {e}"),
    })?;
    if let Some(k) = v.iter().position(|x| !x.is_object()) {
        return Err(PrepareError::Input {
            path: path.to_path_buf(),
            detail: format!("element {k} of the JSON array is not an object"),
        });
    }
    Ok(Kind::JsonArray(v))
}

fn files_with_ext(dir: &Path, ext: &str) -> Result<Vec<PathBuf>, PrepareError> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| PrepareError::io(dir, e))?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == ext))
        .collect();
    files.sort();
    Ok(files)
}

/// The files of `pattern`'s folder whose names match its last component `name`: all
/// `.parquet` or all `.arrow`.
fn matching_files(pattern: &Path, name: &str) -> Result<Kind, PrepareError> {
    let bad = |detail: String| PrepareError::Input {
        path: pattern.to_path_buf(),
        detail,
    };
    let dir = pattern
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    if !dir.is_dir() {
        return Err(bad(format!(
            "no such directory {} (a pattern may use * and ? in its last component only)",
            dir.display()
        )));
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| PrepareError::io(dir, e))?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.is_file()
                && p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| wildcard_match(name, n))
        })
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(bad("no file matches the pattern".into()));
    }
    let has_ext = |f: &PathBuf, ext: &str| f.extension().is_some_and(|x| x == ext);
    if files.iter().all(|f| has_ext(f, "parquet")) {
        Ok(Kind::Parquet(files))
    } else if files.iter().all(|f| has_ext(f, "arrow")) {
        Ok(Kind::Arrow(files))
    } else {
        Err(bad(format!(
            "the pattern matches {} files that are not all .parquet or all .arrow, e.g. {}",
            files.len(),
            files
                .iter()
                .find(|f| !has_ext(f, "parquet"))
                .unwrap_or(&files[0])
                .display()
        )))
    }
}

/// Whether `name` matches `pattern`, where `*` stands for any run of characters and `?` for
/// one.
fn wildcard_match(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    let (mut i, mut j) = (0, 0);
    // The last `*` seen and the name position it was tried at, to backtrack to.
    let mut star: Option<(usize, usize)> = None;
    while j < n.len() {
        if i < p.len() && (p[i] == '?' || p[i] == n[j]) {
            i += 1;
            j += 1;
        } else if i < p.len() && p[i] == '*' {
            star = Some((i, j));
            i += 1;
        } else if let Some((si, sj)) = star {
            star = Some((si, sj + 1));
            i = si + 1;
            j = sj + 1;
        } else {
            return false;
        }
    }
    p[i..].iter().all(|&c| c == '*')
}

/// `datasets`' split keywords: a file whose name starts with one, followed by a non-word
/// character, a digit or nothing, belongs to that split (`train_0.parquet`, `valid.parquet`).
const SPLIT_KEYWORDS: [(&str, &str); 10] = [
    ("train", "train"),
    ("training", "train"),
    ("validation", "validation"),
    ("valid", "validation"),
    ("dev", "validation"),
    ("val", "validation"),
    ("test", "test"),
    ("testing", "test"),
    ("eval", "test"),
    ("evaluation", "test"),
];

/// The split a Parquet file belongs to by its name, as the hub and `datasets` name them, and a
/// pattern that picks that split's files: the hub's `<split>-NNNNN-of-NNNNN[...].parquet`
/// names any split (`train_sft`; a name starting with a letter); otherwise a name starting with a split keyword
/// ([`SPLIT_KEYWORDS`]) gives that standard split, whatever follows (`train_0`, `train.1`,
/// `train_part2` are all `train`). Any other name (`part-0`, `2024-01-01`) tells no split.
fn hf_split(file: &Path) -> Option<(String, String)> {
    let stem = file.file_stem()?.to_str()?;
    let word = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if let Some((split, rest)) = stem.split_once('-') {
        let mut shard = rest.splitn(4, '-');
        if word(split)
            && split.starts_with(|c: char| c.is_ascii_alphabetic())
            && shard.next().is_some_and(digits)
            && shard.next() == Some("of")
            && shard.next().is_some_and(digits)
        {
            return Some((split.to_string(), format!("{split}-*.parquet")));
        }
    }
    let lower = stem.to_ascii_lowercase();
    SPLIT_KEYWORDS.iter().find_map(|&(keyword, split)| {
        let next = lower.strip_prefix(keyword)?.chars().next();
        let glob = match next {
            None => return Some((split.to_string(), format!("{stem}.parquet"))),
            Some(c) if c.is_ascii_digit() => format!("{}*.parquet", &stem[..keyword.len()]),
            Some(c @ ('-' | '.' | '_' | ' ')) => {
                format!("{}{c}*.parquet", &stem[..keyword.len()])
            }
            Some(_) => return None,
        };
        Some((split.to_string(), glob))
    })
}

/// An error when the Parquet `files` of folder `dir` belong to more than one split.
fn one_split(dir: &Path, files: &[PathBuf]) -> Result<(), PrepareError> {
    // (split, files, a pattern for them)
    let mut splits: Vec<(String, usize, String)> = Vec::new();
    for (split, glob) in files.iter().filter_map(|f| hf_split(f)) {
        match splits.iter_mut().find(|(s, _, _)| *s == split) {
            Some(c) => c.1 += 1,
            None => splits.push((split, 1, glob)),
        }
    }
    if splits.len() < 2 {
        return Ok(());
    }
    splits.sort();
    let example = &splits
        .iter()
        .find(|(s, _, _)| s.starts_with("train"))
        .unwrap_or(&splits[0])
        .2;
    let listed: Vec<String> = splits
        .iter()
        .map(|(s, n, _)| format!("{s} ({n} file{})", if *n == 1 { "" } else { "s" }))
        .collect();
    Err(PrepareError::Input {
        path: dir.to_path_buf(),
        detail: format!(
            "the Parquet files belong to {} splits: {}; reading them together would mix them \
             (test data into training). Pass one split's files: a quoted pattern such as '{}', \
             one .parquet file, or a folder holding only that split's files",
            splits.len(),
            listed.join(", "),
            dir.join(example).display()
        ),
    })
}

/// `(1-based line number, trimmed line)`, after a UTF-8 byte order mark.
fn jsonl_lines(text: &[u8]) -> impl Iterator<Item = (usize, &[u8])> {
    let body = text.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(text);
    body.split(|&b| b == b'\n')
        .enumerate()
        .map(|(k, l)| (k + 1, l.trim_ascii()))
}

/// The first line (by number) that is not a JSON object, as [`parse_line`] reports it. Run
/// when the input is opened: a torn last line would otherwise fail the run after every line
/// before it was prepared, and discard that work with the unfinished output.
fn check_jsonl(path: &Path, text: &[u8]) -> Result<(), PrepareError> {
    use rayon::prelude::*;
    let lines: Vec<(usize, &[u8])> = jsonl_lines(text).filter(|(_, l)| !l.is_empty()).collect();
    lines
        .par_iter()
        .find_map_first(|&(line, raw)| {
            // Syntax only, without building the values: they are parsed again per chunk.
            let syntax = serde_json::from_slice::<serde::de::IgnoredAny>(raw);
            (syntax.is_err() || !raw.starts_with(b"{"))
                .then(|| parse_line(path, line, raw).err())
                .flatten()
        })
        .map_or(Ok(()), Err)
}

fn parse_line(path: &Path, line: usize, raw: &[u8]) -> Result<Value, PrepareError> {
    let bad = |detail: String| PrepareError::BadLine {
        path: path.to_path_buf(),
        line,
        detail,
    };
    let v: Value = serde_json::from_slice(raw).map_err(|e| {
        let msg = e.to_string();
        let msg = msg
            .rsplit_once(" at line ")
            .map_or(msg.as_str(), |(m, _)| m);
        bad(format!("{msg} (column {})", e.column()))
    })?;
    if !v.is_object() {
        return Err(bad("expected a JSON object per line".into()));
    }
    Ok(v)
}

/// The conversation columns present; an error when neither `messages` nor `conversations`
/// is, or when one is not a list.
fn conversation_columns(path: &Path, schema: &Schema) -> Result<Vec<usize>, PrepareError> {
    let cols: Vec<usize> = COLUMNS
        .iter()
        .filter_map(|c| schema.index_of(c).ok())
        .collect();
    let has_conversation = cols.iter().any(|&i| schema.field(i).name() != "system");
    if !has_conversation {
        return Err(PrepareError::NoConversationColumn {
            path: path.to_path_buf(),
            present: schema.fields().iter().map(|f| f.name().clone()).collect(),
        });
    }
    for &i in &cols {
        let field = schema.field(i);
        let ok = match field.name().as_str() {
            "system" => true,
            _ => matches!(
                field.data_type(),
                DataType::List(_)
                    | DataType::LargeList(_)
                    | DataType::ListView(_)
                    | DataType::LargeListView(_)
            ),
        };
        if !ok {
            return Err(PrepareError::ColumnType {
                path: path.to_path_buf(),
                column: field.name().clone(),
                found: field.data_type().to_string(),
            });
        }
    }
    Ok(cols)
}

fn batch_rows(
    path: &Path,
    batch: &RecordBatch,
    cols: &[usize],
    next: &mut u64,
) -> Result<Vec<Row>, PrepareError> {
    let schema = batch.schema();
    // Batches of one file share its schema; look the columns up by name in case they do not.
    let arrays: Vec<(&str, &dyn Array)> = cols
        .iter()
        .filter_map(|&i| {
            let name = schema.fields().get(i)?.name().as_str();
            let col = batch.column_by_name(name)?;
            Some((COLUMNS.iter().find(|c| **c == name).copied()?, col.as_ref()))
        })
        .collect();
    if arrays.is_empty() {
        return Err(PrepareError::NoConversationColumn {
            path: path.to_path_buf(),
            present: schema.fields().iter().map(|f| f.name().clone()).collect(),
        });
    }
    let mut rows = Vec::with_capacity(batch.num_rows());
    for r in 0..batch.num_rows() {
        let mut obj = serde_json::Map::new();
        for (name, a) in &arrays {
            obj.insert((*name).to_string(), cell(*a, r));
        }
        rows.push((*next, Value::Object(obj)));
        *next += 1;
    }
    Ok(rows)
}

fn read_parquet(
    path: &Path,
    chunk: usize,
    next: &mut u64,
    f: &mut dyn FnMut(Vec<Row>) -> Result<(), PrepareError>,
) -> Result<(), PrepareError> {
    use parquet::arrow::ProjectionMask;
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

    let bad = |e: &dyn std::fmt::Display| PrepareError::Parquet {
        path: path.to_path_buf(),
        detail: e.to_string(),
    };
    let file = File::open(path).map_err(|e| PrepareError::io(path, e))?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(|e| bad(&e))?;
    let schema = builder.schema().clone();
    let cols = conversation_columns(path, &schema)?;
    let mask = ProjectionMask::roots(builder.parquet_schema(), cols.iter().copied());
    let reader = builder
        .with_projection(mask)
        .with_batch_size(chunk)
        .build()
        .map_err(|e| bad(&e))?;
    for batch in reader {
        let batch = batch.map_err(|e| bad(&e))?;
        // The projected batch holds only the conversation columns, in file order.
        let proj: Vec<usize> = (0..batch.num_columns()).collect();
        f(batch_rows(path, &batch, &proj, next)?)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_jsonl_line_fails_the_open_naming_it() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("chat.jsonl");
        let good = r#"{"messages": [{"role": "user", "content": "q"}]}"#;
        for (last, needle) in [(r#"{"messages": [{"role": "us"#, "EOF"), ("[1]", "object")] {
            let mut text = format!("{good}\n").repeat(1000);
            text.push_str(&format!("\n{last}\n"));
            std::fs::write(&path, text).unwrap();
            match Input::open(&path) {
                Err(PrepareError::BadLine { line, detail, .. }) => {
                    assert_eq!(line, 1002, "{detail}");
                    assert!(detail.contains(needle), "{detail}");
                }
                Err(e) => panic!("{e}"),
                Ok(_) => panic!("opened a file with a bad line"),
            }
        }
        // Blank lines are not rows, and a good file opens.
        std::fs::write(&path, format!("{good}\n\n  \n{good}\n")).unwrap();
        assert_eq!(Input::open(&path).unwrap().rows_hint(), Some(2));
    }

    #[test]
    fn wildcards_match_like_a_shell() {
        assert!(wildcard_match(
            "train_sft-*.parquet",
            "train_sft-00000-of-00003.parquet"
        ));
        assert!(!wildcard_match(
            "train_sft-*.parquet",
            "test_sft-00000-of-00001.parquet"
        ));
        assert!(!wildcard_match(
            "train-*.parquet",
            "train_sft-00000-of-00001.parquet"
        ));
        assert!(wildcard_match("*", ""));
        assert!(wildcard_match("a?c*", "abc"));
        assert!(!wildcard_match("a?c", "ac"));
        assert!(wildcard_match("*b*b", "abbab"));
        assert!(!wildcard_match("*.parquet", "x.parquet.tmp"));
        assert!(wildcard_match("日*?", "日本語"));
    }

    #[test]
    fn hub_file_names_give_their_split() {
        let split = |n: &str| hf_split(Path::new(n)).map(|(s, _)| s);
        let glob = |n: &str| hf_split(Path::new(n)).map(|(_, g)| g);
        assert_eq!(
            split("train_sft-00000-of-00003-a09b74b3ef9c3b56.parquet").as_deref(),
            Some("train_sft")
        );
        assert_eq!(
            glob("train_sft-00000-of-00003.parquet").as_deref(),
            Some("train_sft-*.parquet")
        );
        assert_eq!(
            split("test-00000-of-00001.parquet").as_deref(),
            Some("test")
        );
        for (name, want, pattern) in [
            ("train-0.parquet", "train", "train-*.parquet"),
            ("train_0.parquet", "train", "train_*.parquet"),
            ("train.1.parquet", "train", "train.*.parquet"),
            ("Train_part2.parquet", "train", "Train_*.parquet"),
            ("training1.parquet", "train", "training*.parquet"),
            ("validation.parquet", "validation", "validation.parquet"),
            ("dev-a.parquet", "validation", "dev-*.parquet"),
            ("test_gen.parquet", "test", "test_*.parquet"),
        ] {
            assert_eq!(split(name).as_deref(), Some(want), "{name}");
            assert_eq!(glob(name).as_deref(), Some(pattern), "{name}");
            assert!(wildcard_match(pattern, name), "{name}");
        }
        for name in [
            "part-a.parquet",
            "data.parquet",
            "contest.parquet",
            "trainer.parquet",
            "2023-12-31.parquet",
            "2023-12-of-31.parquet",
        ] {
            assert_eq!(split(name), None, "{name}");
        }
    }
}
