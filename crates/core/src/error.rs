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
