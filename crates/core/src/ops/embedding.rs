use crate::{Error, Result, Tensor};

/// Row gather from a frozen table (the target's embedding; no backward needed).
pub trait EmbeddingOps {
    /// `table (V, H)`, `ids (T)` -> `(T, H)`. An id `>= V` is an error naming it.
    fn embedding(&self, table: &Tensor, ids: &[u32]) -> Result<Tensor>;
}

/// The checked `(V, H)` of [`EmbeddingOps::embedding`]: `table` is `(V, H)`, every id is
/// below `V`, and the `(T, H)` result has a representable element count. Errors name `op`
/// and `device`; a backend calls this before it allocates the result.
///
/// The ids are checked before the size: a `(0, H)` table has no valid id at all, whatever
/// `H` is. The size check still matters for a nonempty table, whose `V * H` elements bound
/// `H` but not `T * H`.
pub fn embedding_dims(
    op: &'static str,
    device: &str,
    table: &Tensor,
    ids: &[u32],
) -> Result<(usize, usize)> {
    let &[v, h] = table.dims() else {
        return Err(Error::shape(
            op,
            device,
            format!("table {:?} must be (V, H)", table.shape()),
        ));
    };
    if let Some((t, &id)) = ids.iter().enumerate().find(|(_, id)| **id as usize >= v) {
        return Err(Error::op(
            op,
            device,
            format!("token id {id} at position {t} is out of range for vocab size V = {v}"),
        ));
    }
    crate::tensor::numel_or_overflow(&[ids.len(), h]).map_err(|e| {
        Error::shape(
            op,
            device,
            format!("{} ids into table {:?}: {e}", ids.len(), table.shape()),
        )
    })?;
    Ok((v, h))
}
