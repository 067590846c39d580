// common.wgsl: the prelude compiled in front of every family's file.
//
// Conventions: @group(0) @binding(0) is the kernel's uniform block; then its read-only
// storage buffers; then its read-write ones. Grids past 65535 workgroups are 2-D: the linear
// workgroup index is wg_linear(), and kernels skip indices past their count.
// NaN and infinity are tested on the bits: WGSL lets implementations assume finite floats
// in comparisons, bits are never optimised away.

fn wg_linear(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wid.x + wid.y * nwg.x;
}

fn is_finite_f32(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7f800000u) != 0x7f800000u;
}

fn is_nan_f32(x: f32) -> bool {
    let b = bitcast<u32>(x);
    return (b & 0x7f800000u) == 0x7f800000u && (b & 0x007fffffu) != 0u;
}

fn nan_f32() -> f32 {
    return bitcast<f32>(0x7fc00000u);
}

fn neg_inf_f32() -> f32 {
    return bitcast<f32>(0xff800000u);
}
