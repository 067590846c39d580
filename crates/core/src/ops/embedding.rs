use crate::{Result, Tensor};

/// Row gather from a frozen table (the target's embedding; no backward needed).
pub trait EmbeddingOps {
    /// `table (V, H)`, `ids (T)` -> `(T, H)`. An id `>= V` is an error naming it.
    fn embedding(&self, table: &Tensor, ids: &[u32]) -> Result<Tensor>;
}
