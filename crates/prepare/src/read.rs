//! Chat dataset readers: JSON Lines (a leading UTF-8 byte order mark is ignored), a `.json`
//! file holding one array of conversations, Parquet files, and Arrow stream data (an HF
//! `save_to_disk` directory, a `.arrow` stream file, or a directory of `.parquet` files as the
//! HF hub lays them out). Column-oriented rows are turned into the JSON objects a JSONL line
//! would hold, so one parser reads every format. Only the conversation columns (`messages`,
//! `conversations`, `system`) are read.

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
    kind: Kind,
}

enum Kind {
    /// Lines of one JSONL file (the file is read whole; rows are parsed per chunk).
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
    /// stream files, or a folder of `*.parquet` files), a `.jsonl` / `.ndjson` / `.json` file,
    /// a `.parquet` file or a `.arrow` stream file.
    pub fn open(path: &Path) -> Result<Self, PrepareError> {
        let bad = |detail: &str| PrepareError::Input {
            path: path.to_path_buf(),
            detail: detail.into(),
        };
        let kind = if path.is_dir() {
            let parquet = files_with_ext(path, "parquet")?;
            if !parquet.is_empty() && !path.join("state.json").exists() {
                Kind::Parquet(parquet)
            } else {
                Kind::Arrow(dflash_data::save_to_disk_files(path)?)
            }
        } else if !path.exists() {
            return Err(bad("no such file or directory"));
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
        Ok(Input {
            path: path.to_path_buf(),
            kind,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
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
        let chunk = chunk.max(1);
        let mut next = 0u64;
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
                    let (schema, batches) = dflash_data::read_stream_file(file)?;
                    let cols = conversation_columns(file, &schema)?;
                    for batch in batches {
                        f(batch_rows(file, &batch, &cols, &mut next)?)?;
                    }
                }
            }
            Kind::Parquet(files) => {
                for file in files {
                    read_parquet(file, chunk, &mut next, f)?;
                }
            }
        }
        Ok(())
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

/// `(1-based line number, trimmed line)`, after a UTF-8 byte order mark.
fn jsonl_lines(text: &[u8]) -> impl Iterator<Item = (usize, &[u8])> {
    let body = text.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(text);
    body.split(|&b| b == b'\n')
        .enumerate()
        .map(|(k, l)| (k + 1, l.trim_ascii()))
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
