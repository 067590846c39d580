//! Models written once over `&dyn Backend`: the frozen Qwen3 target (forward only, stopping
//! after the deepest needed layer) and the DFlash drafter (forward and explicit backward,
//! llm.c style). No autograd: every backward is written out next to its forward.

pub mod checkpoint;
pub mod drafter;
pub mod eos;
pub mod error;
pub mod fault;
pub mod finite;
pub mod generate;
pub mod layer;
pub mod safetensors_io;
pub mod target;

pub use drafter::{DraftInput, Drafter, DrafterGrads, DrafterParams, StepOutput};
pub use error::{ModelError, Result};
pub use target::Qwen3Target;
