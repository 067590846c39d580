//! Training data for dflash-rs: dataset readers (HF `save_to_disk` Arrow streams, JSONL),
//! validation against the target vocabulary and length limits, length-bucketed token-budget
//! batch plans, anchor sampling and the DFlash per-slot labels and loss weights (docs/design.md §2.3).
//!
//! Everything random is a pure function of `(seed, epoch, sample id)`, so a resumed run, or
//! the same sample handled by another worker, sees exactly the same plan and anchors.

mod anchors;
mod arrow;
mod bucket;
mod error;
mod jsonl;
pub mod rng;
mod targets;
mod validate;

use std::path::Path;

pub use anchors::{anchor_seed, sample_anchors};
pub use arrow::{
    ArrowDataset, IDS_COLUMN, MASK_COLUMN, data_files as save_to_disk_files, read_stream_file,
};
pub use bucket::{BatchPlan, BucketStats, BucketSummary};
pub use error::{DataError, SampleProblem};
pub use jsonl::JsonlDataset;
pub use targets::{BlockTargets, block_targets, decay};
pub use validate::{
    MaskTokenInData, OutOfVocab, SkipCounts, SkipReason, TooLongPolicy, Verdict, anchor_candidates,
    validate,
};

/// One training sequence.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Sample {
    /// Index of the sample in its dataset (stable: anchor sampling is seeded by it).
    pub id: u64,
    /// `(S)` token ids.
    pub ids: Vec<u32>,
    /// `(S)` 1 on supervised (assistant) tokens, else 0.
    pub loss_mask: Vec<u8>,
}

/// A random-access dataset of samples.
pub trait Dataset: Send + Sync {
    fn len(&self) -> usize;

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sample `i` (`id == i`). Errors name the file, the sample and the column.
    fn get(&self, i: usize) -> Result<Sample, DataError>;

    /// A display name (the path it was opened from).
    fn name(&self) -> &str;

    /// Length of sample `i` without converting it (cheap; 0 if `i` is out of range).
    fn seq_len(&self, i: usize) -> usize;

    /// All lengths, for [`BatchPlan::new`].
    fn lengths(&self) -> Vec<usize> {
        (0..self.len()).map(|i| self.seq_len(i)).collect()
    }
}

/// Opens a dataset, choosing the reader by path: a directory (HF `save_to_disk`, or a folder
/// of `*.arrow` stream files) or a `.arrow` file -> [`ArrowDataset`]; a `.jsonl` / `.ndjson`
/// file -> [`JsonlDataset`].
pub fn open_dataset(path: impl AsRef<Path>) -> Result<Box<dyn Dataset>, DataError> {
    let path = path.as_ref();
    if path.is_dir() {
        return Ok(Box::new(ArrowDataset::open(path)?));
    }
    if !path.exists() {
        return Err(DataError::Layout {
            path: path.to_path_buf(),
            detail: "no such file or directory".into(),
        });
    }
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    match ext.as_str() {
        "arrow" => Ok(Box::new(ArrowDataset::open(path)?)),
        "jsonl" | "ndjson" => Ok(Box::new(JsonlDataset::open(path)?)),
        _ => Err(DataError::Layout {
            path: path.to_path_buf(),
            detail: "unrecognized dataset: expected a datasets save_to_disk directory, a .arrow \
                     stream file or a .jsonl file"
                .into(),
        }),
    }
}
