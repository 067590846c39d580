use std::path::PathBuf;

/// Errors of model construction, checkpoints and steps. Backend errors keep their op,
/// shapes and device; file errors name the file and tensor.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Backend(#[from] dflash_core::Error),
    #[error(transparent)]
    Config(#[from] dflash_config::ConfigError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: tensor {name:?}: {detail}")]
    Tensor {
        path: PathBuf,
        name: String,
        detail: String,
    },
    /// A NaN or infinite value in a loaded tensor (the NaN policy: weights are checked when
    /// read, so a poisoned checkpoint cannot train on or be saved again).
    #[error(
        "{path}: tensor {name:?}: non-finite value {value} at index {index:?} (the first; \
         weights must be finite)"
    )]
    NonFinite {
        path: PathBuf,
        name: String,
        index: Vec<usize>,
        value: f32,
    },
    #[error("{path}: {detail}")]
    Checkpoint { path: PathBuf, detail: String },
    /// A forward's output is NaN or infinite: its greedy tokens would be some valid ids (the
    /// argmax of a NaN row is one) standing for nothing.
    #[error(
        "{op}: the drafter's output is non-finite (NaN or infinite), so its predictions are undefined"
    )]
    NonFiniteOutput { op: &'static str },
    #[error("{0}")]
    Input(String),
    /// One generated sequence (by the id its caller gave its prompt) cannot go on: a caller
    /// that packs ids names the sequence its own way.
    #[error("sequence {id}: {detail}")]
    Sequence { id: u64, detail: String },
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;

pub(crate) fn io_err(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> ModelError {
    let path = path.into();
    move |source| ModelError::Io { path, source }
}
