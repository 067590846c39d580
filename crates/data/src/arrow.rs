//! HuggingFace `datasets` `save_to_disk` directories: Arrow IPC **stream** files.
//!
//! The record batches stay in memory as Arrow buffers; a sample is converted to
//! `(Vec<u32>, Vec<u8>)` only when it is asked for ([`Dataset::get`]). At open time only the
//! schema is checked and a row index (cumulative row counts per batch) is built.

use std::fs::File;
use std::io::{BufReader, Read};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use arrow_array::cast::AsArray;
use arrow_array::types::{
    Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use arrow_array::{Array, ArrayRef, RecordBatch};
use arrow_ipc::reader::StreamReader;
use arrow_schema::{DataType, Schema};

use crate::error::{DataError, SampleProblem};
use crate::{Dataset, Sample};

/// Column names read from every file.
pub const IDS_COLUMN: &str = "input_ids";
pub const MASK_COLUMN: &str = "loss_mask";

/// The 8-byte end-of-stream marker every complete IPC stream ends with (continuation marker
/// `0xFFFFFFFF` then a zero metadata length).
const EOS: [u8; 8] = [0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0];

/// A dataset of one or more Arrow IPC stream files (HF `save_to_disk` layout).
pub struct ArrowDataset {
    name: String,
    files: Vec<PathBuf>,
    batches: Vec<BatchCols>,
    /// `starts[b]` = global index of the first row of batch `b`; `starts[batches.len()] = len`.
    starts: Vec<usize>,
}

struct BatchCols {
    /// Index into `files`.
    file: usize,
    /// Row (inside its file) of this batch's first row.
    row_base: usize,
    ids: ListCol,
    mask: ListCol,
}

/// A `List` or `LargeList` column of one record batch.
struct ListCol {
    list: ArrayRef,
    large: bool,
}

impl ListCol {
    fn new(list: ArrayRef) -> Self {
        let large = matches!(list.data_type(), DataType::LargeList(_));
        ListCol { list, large }
    }

    /// `[start, end)` of row `r` in the child values array.
    fn range(&self, r: usize) -> (usize, usize) {
        if self.large {
            let o = self.list.as_list::<i64>().value_offsets();
            (o[r] as usize, o[r + 1] as usize)
        } else {
            let o = self.list.as_list::<i32>().value_offsets();
            (o[r] as usize, o[r + 1] as usize)
        }
    }

    fn values(&self) -> &ArrayRef {
        if self.large {
            self.list.as_list::<i64>().values()
        } else {
            self.list.as_list::<i32>().values()
        }
    }

    /// Calls `f(position, value)` for every element of row `r`, in order.
    fn for_each(
        &self,
        r: usize,
        column: &'static str,
        mut f: impl FnMut(usize, i128) -> Result<(), SampleProblem>,
    ) -> Result<(), SampleProblem> {
        if self.list.is_null(r) {
            return Err(SampleProblem::NullList { column });
        }
        let (start, end) = self.range(r);
        let values = self.values();
        macro_rules! prim {
            ($t:ty) => {{
                let a = values.as_primitive::<$t>();
                if a.null_count() == 0 {
                    for (p, &v) in a.values()[start..end].iter().enumerate() {
                        f(p, v as i128)?;
                    }
                } else {
                    for j in start..end {
                        if a.is_null(j) {
                            return Err(SampleProblem::NullValue {
                                column,
                                position: j - start,
                            });
                        }
                        f(j - start, a.value(j) as i128)?;
                    }
                }
            }};
        }
        match values.data_type() {
            DataType::Int8 => prim!(Int8Type),
            DataType::Int16 => prim!(Int16Type),
            DataType::Int32 => prim!(Int32Type),
            DataType::Int64 => prim!(Int64Type),
            DataType::UInt8 => prim!(UInt8Type),
            DataType::UInt16 => prim!(UInt16Type),
            DataType::UInt32 => prim!(UInt32Type),
            DataType::UInt64 => prim!(UInt64Type),
            DataType::Boolean => {
                let a = values.as_boolean();
                for j in start..end {
                    if a.is_null(j) {
                        return Err(SampleProblem::NullValue {
                            column,
                            position: j - start,
                        });
                    }
                    f(j - start, a.value(j) as i128)?;
                }
            }
            // Checked at open time.
            other => {
                unreachable!("column {column} with element type {other} passed the schema check")
            }
        }
        Ok(())
    }

    fn read_ids(&self, r: usize) -> Result<Vec<u32>, SampleProblem> {
        let (start, end) = self.range(r);
        let mut out = Vec::with_capacity(end.saturating_sub(start));
        self.for_each(r, IDS_COLUMN, |position, v| {
            if v < 0 {
                Err(SampleProblem::Negative {
                    column: IDS_COLUMN,
                    position,
                    value: v,
                })
            } else if v > u32::MAX as i128 {
                Err(SampleProblem::TooLarge {
                    column: IDS_COLUMN,
                    position,
                    value: v,
                })
            } else {
                out.push(v as u32);
                Ok(())
            }
        })?;
        Ok(out)
    }

    fn read_mask(&self, r: usize) -> Result<Vec<u8>, SampleProblem> {
        let (start, end) = self.range(r);
        let mut out = Vec::with_capacity(end.saturating_sub(start));
        self.for_each(r, MASK_COLUMN, |position, v| match v {
            0 | 1 => {
                out.push(v as u8);
                Ok(())
            }
            _ => Err(SampleProblem::BadMaskValue { position, value: v }),
        })?;
        Ok(out)
    }
}

/// Element types accepted for a column.
fn element_ok(column: &'static str, dt: &DataType) -> bool {
    dt.is_integer() || (column == MASK_COLUMN && *dt == DataType::Boolean)
}

/// Checks that `column` exists in `schema` with type List/LargeList of an accepted element type.
fn check_column(path: &Path, schema: &Schema, column: &'static str) -> Result<(), DataError> {
    let field = schema
        .field_with_name(column)
        .map_err(|_| DataError::MissingColumn {
            path: path.to_path_buf(),
            column,
            present: schema.fields().iter().map(|f| f.name().clone()).collect(),
        })?;
    let ok = match field.data_type() {
        DataType::List(item) | DataType::LargeList(item) => element_ok(column, item.data_type()),
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(DataError::ColumnType {
            path: path.to_path_buf(),
            column,
            found: field.data_type().to_string(),
        })
    }
}

/// Counts the bytes handed to the IPC reader and remembers the last 8 of them, so that after
/// the reader stops we can tell a complete stream (ends exactly with the EOS marker at the end
/// of the file) from a truncated one (the reader treats EOF at a message boundary as the end).
struct Counting<R> {
    inner: R,
    count: u64,
    tail: [u8; 8],
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count += n as u64;
        if n >= 8 {
            self.tail.copy_from_slice(&buf[n - 8..n]);
        } else if n > 0 {
            self.tail.copy_within(n.., 0);
            self.tail[8 - n..].copy_from_slice(&buf[..n]);
        }
        Ok(n)
    }
}

/// Reads every record batch of one IPC stream file. Never panics on bad input: arrow errors
/// and (defensively) arrow panics become [`DataError::CorruptArrow`] naming the file.
pub fn read_stream_file(path: &Path) -> Result<(Schema, Vec<RecordBatch>), DataError> {
    let file = File::open(path).map_err(|e| DataError::io(path, e))?;
    let file_len = file.metadata().map_err(|e| DataError::io(path, e))?.len();
    let corrupt = |detail: String| DataError::CorruptArrow {
        path: path.to_path_buf(),
        detail,
    };
    if file_len == 0 {
        return Err(corrupt("file is empty".into()));
    }
    let mut magic = [0u8; 6];
    if (&file).read_exact(&mut magic).is_ok() && &magic == b"ARROW1" {
        return Err(corrupt(
            "this is an Arrow IPC *file* (random-access format, starts with ARROW1); \
             expected an IPC *stream* as HF datasets save_to_disk writes"
                .into(),
        ));
    }
    let mut file = file;
    std::io::Seek::rewind(&mut file).map_err(|e| DataError::io(path, e))?;
    let counting = Counting {
        inner: BufReader::new(file),
        count: 0,
        tail: [0; 8],
    };

    let result = catch_unwind(AssertUnwindSafe(move || {
        let mut reader = StreamReader::try_new(counting, None)?;
        let mut batches = Vec::new();
        for batch in &mut reader {
            batches.push(batch?);
        }
        let schema = reader.schema().as_ref().clone();
        let c = reader.get_ref();
        Ok::<_, arrow_schema::ArrowError>((schema, batches, c.count, c.tail))
    }));
    let (schema, batches, consumed, tail) = match result {
        Ok(Ok(x)) => x,
        Ok(Err(e)) => {
            return Err(corrupt(e.to_string()));
        }
        Err(panic) => {
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into());
            return Err(corrupt(format!("arrow reader panicked: {msg}")));
        }
    };
    if consumed < file_len {
        return Err(corrupt(format!(
            "{} bytes after the end-of-stream marker (stream ends at byte {consumed} of {file_len})",
            file_len - consumed
        )));
    }
    if tail != EOS {
        return Err(corrupt(format!(
            "file ends without the end-of-stream marker after {} complete record batches: \
             the file is truncated",
            batches.len()
        )));
    }
    Ok((schema, batches))
}

impl ArrowDataset {
    /// Opens a HF `save_to_disk` directory (files listed by `state.json`, or every `*.arrow`
    /// sorted by name when there is no `state.json`), or a single `.arrow` stream file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, DataError> {
        let path = path.as_ref();
        let files = if path.is_dir() {
            data_files(path)?
        } else {
            vec![path.to_path_buf()]
        };
        Self::open_files(path.display().to_string(), files)
    }

    /// Opens an explicit list of stream files, concatenated in order.
    pub fn open_files(name: String, files: Vec<PathBuf>) -> Result<Self, DataError> {
        let mut batches = Vec::new();
        let mut starts = vec![0usize];
        for (fi, file) in files.iter().enumerate() {
            let (schema, file_batches) = read_stream_file(file)?;
            check_column(file, &schema, IDS_COLUMN)?;
            check_column(file, &schema, MASK_COLUMN)?;
            let mut row_base = 0usize;
            for batch in file_batches {
                let n = batch.num_rows();
                if n == 0 {
                    continue;
                }
                let col = |c: &'static str| {
                    batch
                        .column_by_name(c)
                        .cloned()
                        .ok_or_else(|| DataError::MissingColumn {
                            path: file.clone(),
                            column: c,
                            present: batch
                                .schema()
                                .fields()
                                .iter()
                                .map(|f| f.name().clone())
                                .collect(),
                        })
                };
                batches.push(BatchCols {
                    file: fi,
                    row_base,
                    ids: ListCol::new(col(IDS_COLUMN)?),
                    mask: ListCol::new(col(MASK_COLUMN)?),
                });
                row_base += n;
                starts.push(starts.last().unwrap() + n);
            }
        }
        Ok(ArrowDataset {
            name,
            files,
            batches,
            starts,
        })
    }

    /// The stream files, in order.
    pub fn files(&self) -> &[PathBuf] {
        &self.files
    }

    fn locate(&self, i: usize) -> Option<(usize, usize)> {
        if i >= self.len() {
            return None;
        }
        let b = self.starts.partition_point(|&s| s <= i) - 1;
        Some((b, i - self.starts[b]))
    }
}

/// The data files of a `save_to_disk` directory: those `state.json` lists, else every
/// `*.arrow` sorted by name.
pub fn data_files(dir: &Path) -> Result<Vec<PathBuf>, DataError> {
    if dir.join("dataset_dict.json").exists() {
        let mut splits: Vec<String> = std::fs::read_dir(dir)
            .map_err(|e| DataError::io(dir, e))?
            .filter_map(|e| e.ok())
            .filter(|e| e.path().is_dir())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        splits.sort();
        return Err(DataError::layout(
            dir,
            format!(
                "this is a DatasetDict (dataset_dict.json); point at one of its splits: [{}]",
                splits.join(", ")
            ),
        ));
    }
    let state = dir.join("state.json");
    if state.exists() {
        let text = std::fs::read_to_string(&state).map_err(|e| DataError::io(&state, e))?;
        let v: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| DataError::layout(&state, format!("invalid JSON: {e}")))?;
        let list = v
            .get("_data_files")
            .and_then(|d| d.as_array())
            .ok_or_else(|| {
                DataError::layout(
                    &state,
                    "no \"_data_files\" list (not a datasets save_to_disk state?)",
                )
            })?;
        let mut files = Vec::with_capacity(list.len());
        for (k, entry) in list.iter().enumerate() {
            let name = entry
                .get("filename")
                .and_then(|f| f.as_str())
                .ok_or_else(|| {
                    DataError::layout(
                        &state,
                        format!("_data_files[{k}] has no string \"filename\""),
                    )
                })?;
            let f = dir.join(name);
            if !f.is_file() {
                return Err(DataError::layout(
                    &state,
                    format!(
                        "_data_files[{k}] = {name:?}, but {} does not exist",
                        f.display()
                    ),
                ));
            }
            files.push(f);
        }
        if files.is_empty() {
            return Err(DataError::layout(&state, "\"_data_files\" is empty"));
        }
        Ok(files)
    } else {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| DataError::io(dir, e))?
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "arrow"))
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(DataError::layout(
                dir,
                "no state.json and no *.arrow files: not a datasets save_to_disk directory",
            ));
        }
        Ok(files)
    }
}

impl Dataset for ArrowDataset {
    fn len(&self) -> usize {
        *self.starts.last().unwrap()
    }

    fn name(&self) -> &str {
        &self.name
    }

    fn seq_len(&self, i: usize) -> usize {
        match self.locate(i) {
            Some((b, r)) => {
                let (s, e) = self.batches[b].ids.range(r);
                e - s
            }
            None => 0,
        }
    }

    fn get(&self, i: usize) -> Result<Sample, DataError> {
        let (b, r) = self.locate(i).ok_or_else(|| DataError::IndexOutOfRange {
            name: self.name.clone(),
            index: i,
            len: self.len(),
        })?;
        let bc = &self.batches[b];
        let bad = |problem| DataError::BadSample {
            path: self.files[bc.file].clone(),
            index: i as u64,
            row: bc.row_base + r,
            problem,
        };
        let ids = bc.ids.read_ids(r).map_err(bad)?;
        let loss_mask = bc.mask.read_mask(r).map_err(bad)?;
        if ids.len() != loss_mask.len() {
            return Err(bad(SampleProblem::LengthMismatch {
                ids_len: ids.len(),
                mask_len: loss_mask.len(),
            }));
        }
        Ok(Sample {
            id: i as u64,
            ids,
            loss_mask,
        })
    }
}
