//! Errors of the data layer. Every variant names the file; per-sample problems also name the
//! sample (global index and row or line inside the file), the column and the position.

use std::fmt;
use std::path::PathBuf;

/// What is wrong with one sample (the file and sample are named by the enclosing [`DataError`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SampleProblem {
    /// The list itself is null (no value for this row).
    NullList { column: &'static str },
    /// A null element inside the list.
    NullValue {
        column: &'static str,
        position: usize,
    },
    /// A negative token id (or mask value).
    Negative {
        column: &'static str,
        position: usize,
        value: i128,
    },
    /// A token id that does not fit in `u32`.
    TooLarge {
        column: &'static str,
        position: usize,
        value: i128,
    },
    /// A loss-mask value other than 0 or 1.
    BadMaskValue { position: usize, value: i128 },
    /// `input_ids` and `loss_mask` differ in length.
    LengthMismatch { ids_len: usize, mask_len: usize },
}

impl fmt::Display for SampleProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SampleProblem::NullList { column } => write!(f, "column {column:?} is null"),
            SampleProblem::NullValue { column, position } => {
                write!(f, "{column}[{position}] is null")
            }
            SampleProblem::Negative {
                column,
                position,
                value,
            } => {
                write!(f, "{column}[{position}] = {value} is negative")
            }
            SampleProblem::TooLarge {
                column,
                position,
                value,
            } => {
                write!(f, "{column}[{position}] = {value} does not fit in u32")
            }
            SampleProblem::BadMaskValue { position, value } => {
                write!(f, "loss_mask[{position}] = {value}, expected 0 or 1")
            }
            SampleProblem::LengthMismatch { ids_len, mask_len } => write!(
                f,
                "input_ids has {ids_len} tokens but loss_mask has {mask_len} (they must match)"
            ),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The file is not a readable Arrow IPC stream: truncated, corrupt, or another format.
    #[error("{}: corrupt or truncated Arrow IPC stream: {detail}", path.display())]
    CorruptArrow { path: PathBuf, detail: String },

    #[error("{}: missing column {column:?} (columns present: [{}])", path.display(), present.join(", "))]
    MissingColumn {
        path: PathBuf,
        column: &'static str,
        present: Vec<String>,
    },

    #[error(
        "{}: column {column:?} has type {found}, expected a List or LargeList of integers \
         (int8..int64, uint8..uint64{})",
        path.display(),
        if *column == "loss_mask" { ", or bool" } else { "" }
    )]
    ColumnType {
        path: PathBuf,
        column: &'static str,
        found: String,
    },

    /// One sample of an Arrow file is unusable. `index` is the global sample index in the
    /// dataset, `row` the row inside this file.
    #[error("{}: sample {index} (row {row} of this file): {problem}", path.display())]
    BadSample {
        path: PathBuf,
        index: u64,
        row: usize,
        problem: SampleProblem,
    },

    /// One line of a JSONL file is unusable (`line` is 1-based).
    #[error("{}:{line}: {detail}", path.display())]
    BadLine {
        path: PathBuf,
        line: usize,
        detail: String,
    },

    /// Directory layout / `state.json` problems.
    #[error("{}: {detail}", path.display())]
    Layout { path: PathBuf, detail: String },

    #[error("{name}: sample index {index} out of range (dataset has {len} samples)")]
    IndexOutOfRange {
        name: String,
        index: usize,
        len: usize,
    },
}

impl DataError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        DataError::Io {
            path: path.into(),
            source,
        }
    }
    pub(crate) fn layout(path: impl Into<PathBuf>, detail: impl Into<String>) -> Self {
        DataError::Layout {
            path: path.into(),
            detail: detail.into(),
        }
    }
}
