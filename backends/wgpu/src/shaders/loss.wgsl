// loss.wgsl: fused linear cross-entropy (not yet written).
