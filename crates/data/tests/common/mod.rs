//! Test fixtures: real Arrow IPC stream files written at runtime with arrow-ipc's
//! `StreamWriter`, laid out like HF `datasets` `save_to_disk` output.
#![allow(dead_code)]

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::builder::{BooleanBuilder, LargeListBuilder, ListBuilder};
use arrow_array::types::*;
use arrow_array::{Array, ArrayRef, Int32Array, LargeListArray, ListArray, RecordBatch};
use arrow_ipc::writer::StreamWriter;
use arrow_schema::{Field, Schema};

/// Element type of a list column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elem {
    I8,
    I16,
    I32,
    I64,
    U8,
    U16,
    U32,
    U64,
    Bool,
    F32,
}

pub const ALL_INTS: [Elem; 8] = [
    Elem::I8,
    Elem::I16,
    Elem::I32,
    Elem::I64,
    Elem::U8,
    Elem::U16,
    Elem::U32,
    Elem::U64,
];

/// A List (or LargeList) column from rows (`None` = null list); values cast with `as`.
pub fn list_col(rows: &[Option<Vec<i64>>], elem: Elem, large: bool) -> ArrayRef {
    macro_rules! mk {
        ($t:ty, $n:ty) => {{
            let it = rows.iter().map(|r| {
                r.as_ref()
                    .map(|v| v.iter().map(|&x| Some(x as $n)).collect::<Vec<_>>())
            });
            if large {
                Arc::new(LargeListArray::from_iter_primitive::<$t, _, _>(it)) as ArrayRef
            } else {
                Arc::new(ListArray::from_iter_primitive::<$t, _, _>(it)) as ArrayRef
            }
        }};
    }
    match elem {
        Elem::I8 => mk!(Int8Type, i8),
        Elem::I16 => mk!(Int16Type, i16),
        Elem::I32 => mk!(Int32Type, i32),
        Elem::I64 => mk!(Int64Type, i64),
        Elem::U8 => mk!(UInt8Type, u8),
        Elem::U16 => mk!(UInt16Type, u16),
        Elem::U32 => mk!(UInt32Type, u32),
        Elem::U64 => mk!(UInt64Type, u64),
        Elem::F32 => mk!(Float32Type, f32),
        Elem::Bool => {
            if large {
                let mut b = LargeListBuilder::new(BooleanBuilder::new());
                for r in rows {
                    match r {
                        Some(v) => {
                            for &x in v {
                                b.values().append_value(x != 0);
                            }
                            b.append(true);
                        }
                        None => b.append(false),
                    }
                }
                Arc::new(b.finish())
            } else {
                let mut b = ListBuilder::new(BooleanBuilder::new());
                for r in rows {
                    match r {
                        Some(v) => {
                            for &x in v {
                                b.values().append_value(x != 0);
                            }
                            b.append(true);
                        }
                        None => b.append(false),
                    }
                }
                Arc::new(b.finish())
            }
        }
    }
}

/// A plain (non-list) int32 column, for wrong-type tests.
pub fn flat_i32(n: usize) -> ArrayRef {
    Arc::new(Int32Array::from((0..n as i32).collect::<Vec<_>>()))
}

pub fn some(rows: &[Vec<i64>]) -> Vec<Option<Vec<i64>>> {
    rows.iter().cloned().map(Some).collect()
}

/// Writes one IPC stream file with the given columns, `rows_per_batch` rows per batch.
pub fn write_stream(path: &Path, columns: &[(&str, ArrayRef)], rows_per_batch: usize) {
    let fields: Vec<Field> = columns
        .iter()
        .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
        .collect();
    let schema = Arc::new(Schema::new(fields));
    let n = columns.first().map_or(0, |c| c.1.len());
    let mut w = StreamWriter::try_new(File::create(path).unwrap(), &schema).unwrap();
    let mut off = 0;
    while off < n {
        let len = rows_per_batch.min(n - off);
        let cols: Vec<ArrayRef> = columns.iter().map(|(_, a)| a.slice(off, len)).collect();
        w.write(&RecordBatch::try_new(schema.clone(), cols).unwrap())
            .unwrap();
        off += len;
    }
    w.finish().unwrap();
}

/// Writes `state.json` (+ a `dataset_info.json`) listing `files` as `_data_files`, the way
/// `Dataset.save_to_disk` does.
pub fn write_state(dir: &Path, files: &[&str]) {
    let data_files: Vec<_> = files
        .iter()
        .map(|f| serde_json::json!({ "filename": f }))
        .collect();
    let state = serde_json::json!({
        "_data_files": data_files,
        "_fingerprint": "0123456789abcdef",
        "_format_columns": null,
        "_format_kwargs": {},
        "_format_type": null,
        "_output_all_columns": false,
        "_split": null
    });
    std::fs::write(
        dir.join("state.json"),
        serde_json::to_string_pretty(&state).unwrap(),
    )
    .unwrap();
    std::fs::write(
        dir.join("dataset_info.json"),
        "{\"citation\": \"\", \"features\": {}}",
    )
    .unwrap();
}

/// Deterministic rows: row r has 1 + (7r mod 13) tokens, ids in [0, 100) (fit every integer
/// type), loss_mask 0 on the first third, 1 after.
pub fn rows(n: usize, first: usize) -> (Vec<Vec<i64>>, Vec<Vec<i64>>) {
    let mut ids = Vec::new();
    let mut mask = Vec::new();
    for r in first..first + n {
        let len = 1 + (7 * r) % 13;
        ids.push((0..len).map(|j| ((r * 31 + j * 17) % 100) as i64).collect());
        mask.push((0..len).map(|j| (j >= len / 3) as i64).collect());
    }
    (ids, mask)
}

/// A save_to_disk directory with one file `data-00000-of-00001.arrow` of `n` rows.
pub fn hf_dir(
    dir: &Path,
    n: usize,
    ids_elem: Elem,
    mask_elem: Elem,
    large: bool,
    rows_per_batch: usize,
) -> PathBuf {
    let (ids, mask) = rows(n, 0);
    let name = "data-00000-of-00001.arrow";
    write_stream(
        &dir.join(name),
        &[
            ("input_ids", list_col(&some(&ids), ids_elem, large)),
            ("loss_mask", list_col(&some(&mask), mask_elem, large)),
        ],
        rows_per_batch,
    );
    write_state(dir, &[name]);
    dir.join(name)
}
