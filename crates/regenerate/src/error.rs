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

pub(crate) fn io_err(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> RegenerateError {
    let path = path.into();
    move |source| RegenerateError::Io { path, source }
}
