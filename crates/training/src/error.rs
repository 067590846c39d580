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
        "{count} consecutive steps had a non-finite loss or gradient (limit {limit}); last at step {step}: {origin}"
    )]
    NonFinite {
        count: u64,
        limit: u64,
        step: u64,
        origin: NonFiniteSource,
    },
    /// Evaluation had no sequence it could measure (each needs a completion of two or more
    /// tokens): a tau over nothing is not a number to report.
    #[error(
        "evaluation: none of the {given} sequences has a completion of two or more tokens to draft, so tau is undefined"
    )]
    NoEvalSequence { given: usize },
    /// The drafter's output for an evaluation sequence was NaN or infinite: its greedy tokens
    /// (and so its tau) would be numbers standing for nothing.
    #[error(
        "evaluation: sample {sample_id}: the drafter's predictions are non-finite (NaN or infinite), so its tau is undefined: {origin}"
    )]
    NonFiniteEval {
        sample_id: u64,
        origin: NonFiniteSource,
    },
}

/// Where a non-finite step loss (or evaluation output) came from, as far as can be told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NonFiniteSource {
    /// The target's features of the micro-batch were already NaN/Inf: the target (its
    /// weights or activations) produced it, not the drafter.
    TargetFeatures,
    /// The features were finite: the drafter's forward produced it.
    Drafter,
    /// The loss was finite but the gradient norm was not.
    Gradient,
}

impl std::fmt::Display for NonFiniteSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NonFiniteSource::TargetFeatures => {
                "the target's features were already non-finite (the target or its weights), not the drafter"
            }
            NonFiniteSource::Drafter => {
                "the target's features were finite, so the drafter's forward produced it"
            }
            NonFiniteSource::Gradient => "the loss was finite, the drafter's gradients were not",
        })
    }
}

pub type Result<T, E = TrainError> = std::result::Result<T, E>;
