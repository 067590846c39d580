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
    #[error(
        "the job does not fit in the memory of {device}: set train.recompute = true (recompute \
         each drafter layer in the backward), or lower data.token_budget, data.num_anchors or \
         drafter.num_layers, or give the drafter a larger GPU"
    )]
    DoesNotFit {
        device: String,
        source: Box<PipelineError>,
    },
    /// Refused before anything was allocated: the memory plan's peak exceeds what is free.
    #[error(
        "the job does not fit in the memory of {device}: its memory plan peaks at {}, {} are \
         free ({} total); it shrinks with {advice} (every term: memory_plan.json in the run \
         directory)",
        crate::job::memory::human(*peak),
        crate::job::memory::human(*free),
        crate::job::memory::human(*total)
    )]
    PlanDoesNotFit {
        device: String,
        peak: u64,
        free: u64,
        total: u64,
        advice: String,
    },
}

impl PipelineError {
    pub fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> PipelineError {
        let path = path.into();
        move |source| PipelineError::Io { path, source }
    }
}

pub type Result<T, E = PipelineError> = std::result::Result<T, E>;

impl PipelineError {
    /// The device whose memory ran out, when this error (through any wrapper) is an
    /// out-of-memory failure of a backend op.
    pub fn out_of_memory_device(&self) -> Option<&str> {
        use dflash_core::Error as CoreError;
        use dflash_models::ModelError;
        use dflash_training::TrainError;
        let core = match self {
            PipelineError::Backend(e)
            | PipelineError::Model(ModelError::Backend(e))
            | PipelineError::Train(TrainError::Backend(e))
            | PipelineError::Train(TrainError::Model(ModelError::Backend(e))) => e,
            PipelineError::Worker { source, .. } | PipelineError::DoesNotFit { source, .. } => {
                return source.out_of_memory_device();
            }
            _ => return None,
        };
        match core {
            CoreError::OutOfMemory { device, .. } => Some(device),
            _ => None,
        }
    }

    /// An out-of-memory failure becomes [`PipelineError::DoesNotFit`], which names the knobs
    /// that shrink the job (the original error stays its cause); anything else is unchanged.
    pub fn with_fit_advice(self) -> PipelineError {
        if matches!(self, PipelineError::DoesNotFit { .. }) {
            return self;
        }
        match self.out_of_memory_device().map(str::to_string) {
            Some(device) => PipelineError::DoesNotFit {
                device,
                source: Box::new(self),
            },
            None => self,
        }
    }
}

/// `error: a\n  caused by: b\n  caused by: c` — what binaries print and `error.txt` holds.
/// A cause that the line before already ends with after a `": "` (an error that writes its
/// source into its own message, `"{path}: {source}"`) is not repeated; one that merely ends
/// the same way ("reading shard 10" caused by "0") keeps its line.
pub fn cause_chain(e: &dyn std::error::Error) -> String {
    let mut s = format!("error: {e}");
    let mut cur = e.source();
    while let Some(c) = cur {
        let text = c.to_string();
        let spelled_out = s
            .strip_suffix(text.as_str())
            .is_some_and(|head| head.ends_with(": "));
        if !spelled_out {
            s.push_str(&format!("\n  caused by: {text}"));
        }
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn oom() -> dflash_core::Error {
        dflash_core::Error::OutOfMemory {
            op: "linear",
            device: "cuda:1".into(),
            requested: 3 << 30,
            free: Some(1 << 30),
            total: Some(80 << 30),
        }
    }

    #[test]
    fn out_of_memory_anywhere_in_a_worker_names_the_knobs_and_keeps_the_cause() {
        let nested = PipelineError::Worker {
            worker: "drafter replica 1".into(),
            source: Box::new(PipelineError::Train(dflash_training::TrainError::Model(
                dflash_models::ModelError::Backend(oom()),
            ))),
        };
        let e = nested.with_fit_advice();
        let chain = cause_chain(&e);
        assert!(matches!(&e, PipelineError::DoesNotFit { device, .. } if device == "cuda:1"));
        for needle in [
            "does not fit in the memory of cuda:1",
            "train.recompute",
            "data.token_budget",
            "drafter replica 1 failed",
            "linear on cuda:1: out of device memory: 3221225472 bytes requested (1.00 GiB of 80.00 GiB free)",
        ] {
            assert!(chain.contains(needle), "{needle:?} missing from:\n{chain}");
        }
        // Applying it twice does not stack the advice.
        assert!(matches!(
            e.with_fit_advice(),
            PipelineError::DoesNotFit { source, .. } if !matches!(*source, PipelineError::DoesNotFit { .. })
        ));
    }

    #[test]
    fn a_cause_already_in_the_message_is_not_repeated() {
        let inline = PipelineError::Io {
            path: "runs/x/config.toml".into(),
            source: std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
        };
        assert_eq!(
            cause_chain(&inline),
            "error: runs/x/config.toml: no such file"
        );
        // Nested, each message ending with its cause's: one line.
        let worker = PipelineError::Worker {
            worker: "target worker 0".into(),
            source: Box::new(inline),
        };
        assert_eq!(
            cause_chain(&worker),
            "error: target worker 0 failed: runs/x/config.toml: no such file"
        );
        // Spelled out after ": ", however short.
        let short = PipelineError::Worker {
            worker: "reading shard 1".into(),
            source: Box::new(PipelineError::Job("0".into())),
        };
        assert_eq!(cause_chain(&short), "error: reading shard 1 failed: 0");
        // A cause that only shares the message's last characters keeps its line.
        let tail = PipelineError::DoesNotFit {
            device: "cuda:0".into(),
            source: Box::new(PipelineError::Job("GPU".into())),
        };
        assert!(cause_chain(&tail).ends_with("larger GPU\n  caused by: GPU"));
        // A cause the message does not spell out keeps its line.
        let advice = PipelineError::DoesNotFit {
            device: "cuda:0".into(),
            source: Box::new(worker),
        };
        let chain = cause_chain(&advice);
        assert!(chain.starts_with("error: the job does not fit"), "{chain}");
        assert!(
            chain.ends_with(
                "\n  caused by: target worker 0 failed: runs/x/config.toml: no such file"
            ),
            "{chain}"
        );
    }

    #[test]
    fn other_errors_are_left_alone() {
        let e = PipelineError::Backend(dflash_core::Error::op("linear", "cuda:0", "boom"))
            .with_fit_advice();
        assert!(matches!(e, PipelineError::Backend(_)));
        assert!(
            PipelineError::Job("x".into())
                .with_fit_advice()
                .out_of_memory_device()
                .is_none()
        );
    }
}
