//! The backend op families, one small trait per file (burn-style). Shapes are written
//! `(rows, cols)` for matrices; `T` tokens, `H` hidden, `Hq`/`Hkv` heads, `D` head dim, `V` vocab.
//! Every op validates shapes and returns a typed error naming op, shapes and device.

pub mod activation;
pub mod attention;
pub mod collective;
pub mod embedding;
pub mod gemm;
pub mod loss;
pub mod memory;
pub mod norm;
pub mod optimizer;
pub mod rope;

pub use activation::ActivationOps;
pub use attention::AttentionOps;
pub use collective::{CollectiveOps, Communicator};
pub use embedding::EmbeddingOps;
pub use gemm::{GemmOps, Transpose};
pub use loss::{LossOps, LossStats};
pub use memory::MemoryOps;
pub use norm::NormOps;
pub use optimizer::{AdamWParams, OptimizerOps};
pub use rope::RopeOps;

/// Identity of a backend instance.
pub trait BackendInfo: Send + Sync {
    /// Registered name, e.g. `"reference"`.
    fn name(&self) -> &'static str;
    /// Human-readable device, e.g. `"cpu (2 threads)"` or `"cuda:0 (NVIDIA H200)"`.
    fn device(&self) -> String;
    /// Name of the attention kernel this instance dispatches to.
    fn attention_kernel(&self) -> &str;
}
