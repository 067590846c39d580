use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error(transparent)]
    Config(#[from] dflash_config::ConfigError),
    #[error(transparent)]
    Data(#[from] dflash_data::DataError),
    #[error(transparent)]
    Model(#[from] dflash_models::ModelError),
    #[error(transparent)]
    Train(#[from] dflash_training::TrainError),
    #[error(transparent)]
    Backend(#[from] dflash_core::Error),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{worker} failed: {source}")]
    Worker {
        worker: String,
        source: Box<PipelineError>,
    },
    #[error("{0}")]
    Job(String),
}

impl PipelineError {
    pub fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> PipelineError {
        let path = path.into();
        move |source| PipelineError::Io { path, source }
    }
}

pub type Result<T, E = PipelineError> = std::result::Result<T, E>;

/// `error: a\n  caused by: b\n  caused by: c` — what binaries print and `error.txt` holds.
pub fn cause_chain(e: &dyn std::error::Error) -> String {
    let mut s = format!("error: {e}");
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(&format!("\n  caused by: {c}"));
        cur = c.source();
    }
    s
}
