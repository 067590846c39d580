//! The online training job as threads in one process:
//!
//! ```text
//! loader --work queue--> target workers (1..T) --features queues (one per replica)--> drafter replicas (1..D)
//!                                                                                     all-reduce between replicas
//! ```
//! Micro-batch `m` of a step goes to replica `m % D`, which processes its share in micro-batch
//! order: the result depends on the data, seed and replica count only, never on thread timing,
//! so a run resumes bit-for-bit and 2+2 workers match 1+1 within float tolerance.
//! Any worker's error aborts the others cleanly, is written to `RUN_DIR/error.txt` with its
//! cause chain, and leaves the last good checkpoint in place. Several such processes (one
//! replica each, started by a launcher) train as one job: [`distributed`].

pub mod comm;
pub mod distributed;
pub mod error;
mod fingerprint;
pub mod job;
pub mod phases;
pub mod placement;
pub mod report;
pub mod schedule;
pub mod workers;

pub use comm::HostComm;
pub use distributed::Processes;
pub use error::PipelineError;
pub use job::{EvalOutcome, TrainOutcome, evaluate, train, train_in};
