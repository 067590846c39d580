// attention.wgsl: block-sparse attention (not yet written).
