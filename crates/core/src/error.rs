//! The error type of backend ops and registries: every message names the op, the shapes and
//! the device, so a failure deep inside a training step is diagnosable from the log alone.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{op} on {device}: shape mismatch: {detail}")]
    Shape {
        op: &'static str,
        device: String,
        detail: String,
    },

    #[error("{op} on {device}: {detail}")]
    Op {
        op: &'static str,
        device: String,
        detail: String,
    },

    #[error("{op} on {device}: tensor belongs to another backend ({detail})")]
    ForeignTensor {
        op: &'static str,
        device: String,
        detail: String,
    },

    /// The device had no room for an allocation. Kept apart from [`Error::Op`] so a job can
    /// tell the user which of its knobs shrink what it needs.
    #[error("{op} on {device}: out of device memory: {requested} bytes requested{}", free_note(*.free, *.total))]
    OutOfMemory {
        op: &'static str,
        device: String,
        requested: u64,
        /// Free and total device bytes right after the failure, where the backend can tell.
        free: Option<u64>,
        total: Option<u64>,
    },

    #[error("unknown {kind} {name:?}; registered: {}", available.join(", "))]
    UnknownName {
        kind: &'static str,
        name: String,
        available: Vec<String>,
    },

    #[error("backend {name:?} is not available on this machine: {reason}")]
    Unavailable { name: String, reason: String },

    #[error(transparent)]
    Mask(#[from] dflash_mask::MaskError),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

fn free_note(free: Option<u64>, total: Option<u64>) -> String {
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    match (free, total) {
        (Some(f), Some(t)) => format!(" ({:.2} GiB of {:.2} GiB free)", gib(f), gib(t)),
        _ => String::new(),
    }
}

impl Error {
    pub fn shape(op: &'static str, device: impl Into<String>, detail: impl Into<String>) -> Self {
        Error::Shape {
            op,
            device: device.into(),
            detail: detail.into(),
        }
    }
    pub fn op(op: &'static str, device: impl Into<String>, detail: impl Into<String>) -> Self {
        Error::Op {
            op,
            device: device.into(),
            detail: detail.into(),
        }
    }
}
