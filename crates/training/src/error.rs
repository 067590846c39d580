#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Model(#[from] dflash_models::ModelError),
    #[error(transparent)]
    Backend(#[from] dflash_core::Error),
    #[error("all-reduce across drafter replicas failed: {0}")]
    Collective(String),
    #[error("{path}: {detail}")]
    State {
        path: std::path::PathBuf,
        detail: String,
    },
    #[error(
        "{count} consecutive steps had a non-finite loss or gradient (limit {limit}); last at step {step}"
    )]
    NonFinite { count: u64, limit: u64, step: u64 },
}

pub type Result<T, E = TrainError> = std::result::Result<T, E>;
