//! The checks every Qwen3-style decoder layer config shares, target and drafter alike.

/// The fields that must be at least 1, then grouped-query attention (`heads` a multiple of
/// `kv_heads`), RoPE's even `head_dim` and a positive `rms_norm_eps`. Returns the failing
/// field and its message. `gqa_field` is the field blamed when the heads do not group (each
/// config reports it under its own name).
pub(crate) fn check_layer_shape(
    positive: &[(&'static str, usize)],
    (heads, kv_heads, gqa_field): (usize, usize, &'static str),
    head_dim: usize,
    rms_norm_eps: f64,
) -> Result<(), (&'static str, String)> {
    if let Some((field, _)) = positive.iter().find(|(_, v)| *v == 0) {
        return Err((field, "must be at least 1".into()));
    }
    if heads % kv_heads != 0 {
        return Err((
            gqa_field,
            format!(
                "num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}"
            ),
        ));
    }
    if head_dim % 2 != 0 {
        return Err((
            "head_dim",
            format!("RoPE needs an even head_dim, got {head_dim}"),
        ));
    }
    if !(rms_norm_eps.is_finite() && rms_norm_eps > 0.0) {
        return Err((
            "rms_norm_eps",
            format!("must be a positive number, got {rms_norm_eps}"),
        ));
    }
    Ok(())
}
