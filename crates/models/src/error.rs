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
    #[error("{path}: {detail}")]
    Checkpoint { path: PathBuf, detail: String },
    #[error("{0}")]
    Input(String),
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;

pub(crate) fn io_err(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> ModelError {
    let path = path.into();
    move |source| ModelError::Io { path, source }
}
