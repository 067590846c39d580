//! Errors of `dflash prepare`. A dataset-level problem (unreadable file, missing column, bad
//! target files) is a [`PrepareError`] naming the file and, where there is one, the sample and
//! the field; a problem with one conversation is a [`SkipReason`]: the sample is skipped and
//! counted, and only a dataset where every sample is skipped is an error.

use std::fmt;
use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// The target's end-of-answer ids could not be read (a malformed config file).
    #[error(transparent)]
    Eos(#[from] dflash_models::ModelError),

    /// Reading an Arrow stream (`save_to_disk` directory or `.arrow` file) failed.
    #[error(transparent)]
    Data(#[from] dflash_data::DataError),

    #[error("{}: not a readable Parquet file: {detail}", path.display())]
    Parquet { path: PathBuf, detail: String },

    /// A JSONL line that is not a JSON object (`line` is 1-based).
    #[error("{}:{line}: {detail}", path.display())]
    BadLine {
        path: PathBuf,
        line: usize,
        detail: String,
    },

    /// A column-oriented input (Arrow, Parquet) without a conversation column.
    #[error(
        "{}: no conversation column: expected \"messages\" (OpenAI: role, content) or \
         \"conversations\" (ShareGPT: from, value); columns present: [{}]",
        path.display(),
        present.join(", ")
    )]
    NoConversationColumn { path: PathBuf, present: Vec<String> },

    /// A conversation column of a type that cannot hold messages.
    #[error("{}: column {column:?} has type {found}, expected a list of structs", path.display())]
    ColumnType {
        path: PathBuf,
        column: String,
        found: String,
    },

    /// The input path is not a dataset this crate reads.
    #[error("{}: {detail}", path.display())]
    Input { path: PathBuf, detail: String },

    /// The target directory's `tokenizer.json` / `tokenizer_config.json` is missing or unusable.
    #[error("{}: {detail}", path.display())]
    Target { path: PathBuf, detail: String },

    /// The chat template does not compile.
    #[error("{}: chat_template does not compile: {detail}", path.display())]
    Template { path: PathBuf, detail: String },

    /// The input holds no sample at all.
    #[error("{}: the dataset has no samples", path.display())]
    Empty { path: PathBuf },

    /// Every sample was skipped; `first` lists up to ten `(index, reason)`.
    #[error(
        "{}: all {total} samples were skipped; first: {}",
        path.display(),
        first.iter().map(|(i, r)| format!("sample {i}: {r}")).collect::<Vec<_>>().join("; ")
    )]
    AllSkipped {
        path: PathBuf,
        total: usize,
        first: Vec<(u64, SkipReason)>,
    },

    /// A token id past `i32::MAX` (the output column is int32).
    #[error("sample {index}: token id {id} does not fit the int32 input_ids column")]
    TokenRange { index: u64, id: u32 },

    /// Writing the output failed.
    #[error("{}: {detail}", path.display())]
    Output { path: PathBuf, detail: String },
}

impl PrepareError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        PrepareError::Io {
            path: path.into(),
            source,
        }
    }
    pub(crate) fn target(path: impl Into<PathBuf>, detail: impl Into<String>) -> Self {
        PrepareError::Target {
            path: path.into(),
            detail: detail.into(),
        }
    }
    pub(crate) fn output(path: impl Into<PathBuf>, detail: impl fmt::Display) -> Self {
        PrepareError::Output {
            path: path.into(),
            detail: detail.to_string(),
        }
    }
}

/// Why one sample was left out of the output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SkipReason {
    /// Neither `messages` nor `conversations`, or an empty list.
    NoConversation,
    /// A message that is not an object, an unknown role, a non-text content, a system
    /// message after the first.
    Malformed { message: usize, detail: String },
    /// No assistant message: nothing to supervise.
    NoAssistant,
    /// The chat template raised or failed.
    Render { detail: String },
    /// Content holds one of the private markers that record generation spans.
    MarkerInContent { message: usize },
    /// An assistant message's content does not occur in the rendered conversation.
    ContentNotFound { message: usize },
    /// The supervised text of an assistant turn is not what the template renders for that
    /// turn alone (rendering up to the turn with and without it).
    CrossCheck { message: usize, detail: String },
    /// Every token would be supervised (the mask cannot tell prompt from response).
    AllSupervised,
    /// No token is supervised.
    NothingSupervised,
    /// The tokenizer failed on the rendered text.
    Tokenize { detail: String },
}

impl SkipReason {
    /// A short stable name, for counting skips by kind.
    pub fn kind(&self) -> &'static str {
        match self {
            SkipReason::NoConversation => "no conversation",
            SkipReason::Malformed { .. } => "malformed roles or content",
            SkipReason::NoAssistant => "no assistant turn",
            SkipReason::Render { .. } => "template render failed",
            SkipReason::MarkerInContent { .. } => "content holds a private marker",
            SkipReason::ContentNotFound { .. } => "assistant content not rendered",
            SkipReason::CrossCheck { .. } => "mask cross-check failed",
            SkipReason::AllSupervised => "mask all ones",
            SkipReason::NothingSupervised => "mask all zeros",
            SkipReason::Tokenize { .. } => "tokenizer failed",
        }
    }
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SkipReason::NoConversation => {
                write!(f, "no \"messages\" or \"conversations\" (or an empty one)")
            }
            SkipReason::Malformed { message, detail } => write!(f, "message {message}: {detail}"),
            SkipReason::NoAssistant => write!(f, "no assistant message, nothing to supervise"),
            SkipReason::Render { detail } => write!(f, "chat template failed: {detail}"),
            SkipReason::MarkerInContent { message } => write!(
                f,
                "message {message}: content holds U+FDD0 or U+FDD1 (reserved for generation spans)"
            ),
            SkipReason::ContentNotFound { message } => write!(
                f,
                "message {message}: the assistant content does not occur in the rendered \
                 conversation (the template drops or rewrites it)"
            ),
            SkipReason::CrossCheck { message, detail } => {
                write!(f, "message {message}: mask cross-check failed: {detail}")
            }
            SkipReason::AllSupervised => write!(
                f,
                "loss mask is all ones (the template renders nothing but assistant content)"
            ),
            SkipReason::NothingSupervised => write!(
                f,
                "loss mask is all zeros (the assistant content is empty or covers no token)"
            ),
            SkipReason::Tokenize { detail } => write!(f, "tokenizer failed: {detail}"),
        }
    }
}
