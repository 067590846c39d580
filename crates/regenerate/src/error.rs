//! Errors of `dflash regenerate`, naming the file and, where there is one, the sample.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum RegenerateError {
    #[error(transparent)]
    Prepare(#[from] dflash_prepare::PrepareError),
    #[error(transparent)]
    Model(#[from] dflash_models::ModelError),
    #[error(transparent)]
    Config(#[from] dflash_config::ConfigError),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The output file exists but is not what this run would continue.
    #[error("{}: cannot resume: {detail}", path.display())]
    Resume { path: PathBuf, detail: String },
    /// A knob out of range, or a target that cannot generate.
    #[error("{0}")]
    Input(String),
    /// No id ends a sequence: every answer would run to `max_new_tokens`.
    #[error(
        "no end-of-sequence token: none of {} names one (eos_token_id, or \
         tokenizer_config.json's eos_token)",
        consulted.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
    )]
    NoEos { consulted: Vec<PathBuf> },
    /// The KV cache does not fit the memory the backend allocates from.
    #[error(
        "the KV cache of --batch {batch} x --capacity {capacity} tokens needs {need} bytes \
         ({:.1} GiB), but {device} has {free} bytes ({:.1} GiB) free{when}: lower --batch or \
         --capacity",
        *need as f64 / GIB,
        *free as f64 / GIB
    )]
    Memory {
        batch: usize,
        capacity: usize,
        need: u64,
        free: u64,
        device: String,
        /// When it was measured (before or after the weights loaded).
        when: String,
    },
    /// The thread reading the dataset panicked: the output holds only what was written.
    #[error(
        "{}: reading the dataset failed ({message}); the output holds only the samples written \
         before it",
        path.display()
    )]
    ReaderPanicked { path: PathBuf, message: String },
    /// Every sample was skipped: nothing to generate.
    #[error(
        "{}: all {total} samples were skipped, nothing generated; first reasons: {}",
        path.display(),
        first.iter().map(|(i, r)| format!("sample {i}: {r}")).collect::<Vec<_>>().join("; ")
    )]
    AllSkipped {
        path: PathBuf,
        total: usize,
        first: Vec<(u64, String)>,
    },
}

const GIB: f64 = (1u64 << 30) as f64;

pub(crate) fn io_err(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> RegenerateError {
    let path = path.into();
    move |source| RegenerateError::Io { path, source }
}
