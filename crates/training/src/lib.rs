//! Training the drafter: one data-parallel replica's step ([`replica`]), the optimizer and
//! its schedule, resumable state, and the acceptance-length evaluation of docs/design.md §2.5.

pub mod error;
pub mod eval;
pub mod optimizer;
pub mod prepare;
pub mod replica;
pub mod schedule;
pub mod state;

pub use error::{NonFiniteSource, Result, TrainError};
pub use eval::{TauReport, evaluate_tau};
pub use optimizer::AdamW;
pub use prepare::{BlockSpec, PreparedBatch, PreparedSeq};
pub use replica::{DrafterReplica, StepSummary, StepTimes};
pub use schedule::LrSchedule;
