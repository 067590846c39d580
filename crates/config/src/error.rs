//! The one error type of this crate. Every variant names where the bad value came from
//! (`origin`: a file path, or a description such as "training config") and the field.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{}: cannot read: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{origin}: not valid JSON: {source}")]
    Json {
        origin: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("{origin}: missing field `{field}`")]
    MissingField { origin: String, field: String },
    #[error("{origin}: field `{field}` has the wrong type: expected {expected}, found {found}")]
    WrongType {
        origin: String,
        field: String,
        expected: &'static str,
        found: String,
    },
    #[error("{origin}: field `{field}` = {value} is not supported: {reason}")]
    Unsupported {
        origin: String,
        field: String,
        value: String,
        reason: String,
    },
    #[error("{origin}: field `{field}`: {message}")]
    Invalid {
        origin: String,
        field: String,
        message: String,
    },
    /// A drafter config that does not fit its target.
    #[error(
        "drafter/target mismatch in `{field}`: drafter has {drafter}, target has {target}: {message}"
    )]
    Mismatch {
        field: String,
        drafter: String,
        target: String,
        message: String,
    },
    /// A `[drafter]` shape key that was set, against the `drafter.init_from` drafter whose
    /// `config.json` defines the shape (the key would otherwise be ignored). Boxed: its five
    /// fields would make every `Result` of this crate (and of those wrapping it) larger.
    #[error("{0}")]
    InitFromMismatch(Box<InitFromMismatch>),
    /// The layered training config could not be extracted (bad type, unknown key, ...). The
    /// message names the key and the source (TOML file, `DFLASH_` environment variable, command-line
    /// override); figment's own error is kept as the source.
    #[error("training config: {0}")]
    Train(Box<figment::Error>),
    #[error("cannot write the training config as TOML: {0}")]
    TomlWrite(#[from] toml::ser::Error),
}

/// The details of [`ConfigError::InitFromMismatch`].
#[derive(Debug, thiserror::Error)]
#[error(
    "{origin}: field `{field}` = {set} disagrees with the drafter.init_from drafter {}, \
     which has {loaded}: its config.json defines the drafter's shape, so leave `{field}` \
     unset or set it to {loaded}",
    init_from.display()
)]
pub struct InitFromMismatch {
    /// The layer that set the key.
    pub origin: String,
    /// `drafter.<key>`.
    pub field: String,
    /// The value set.
    pub set: String,
    /// The loaded drafter's value.
    pub loaded: String,
    /// The `drafter.init_from` directory.
    pub init_from: PathBuf,
}

impl From<figment::Error> for ConfigError {
    fn from(e: figment::Error) -> Self {
        ConfigError::Train(Box::new(e))
    }
}

pub type Result<T, E = ConfigError> = std::result::Result<T, E>;
