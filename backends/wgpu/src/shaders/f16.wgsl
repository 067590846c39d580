// f16.wgsl: the kernels that read or write f16 buffers (the compute format of read-only
// tensors): f32 <-> f16 conversion (f32 -> f16 on the bits, written as words), strided f16 copies (any element offset: 16-bit stores do
// not touch their neighbours) and the row gather from an f16 table into f32 rows. Compiled
// only on devices with SHADER_F16 (`enable f16;` is put in front by the host).

// ---- conversions: dst[dst_shift + i] = convert(src[src_shift + i]), i < n -------------------

struct ConvParams { n: u32, src_shift: u32, dst_shift: u32 }
@group(0) @binding(0) var<uniform> cv: ConvParams;
@group(0) @binding(1) var<storage, read> narrow_src: array<f32>;
@group(0) @binding(2) var<storage, read_write> narrow_dst: array<u32>;

// The f16 bits of x, rounded to nearest even, computed on the bits: WGSL leaves the
// conversion of values outside f16's range undefined, and its in-range rounding to the
// implementation. NaN stays NaN (quiet), overflow is infinity, tiny values go subnormal.
fn f16_bits(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    let sign = (b >> 16u) & 0x8000u;
    let e = (b >> 23u) & 0xffu;
    let m = b & 0x7fffffu;
    if (e == 0xffu) {
        return sign | 0x7c00u | select(0u, 0x200u, m != 0u);
    }
    let ee = i32(e) - 112; // the f16 biased exponent
    if (ee >= 31) {
        return sign | 0x7c00u;
    }
    if (ee > 0) {
        let mant = m >> 13u;
        let rem = m & 0x1fffu;
        var h = sign | (u32(ee) << 10u) | mant;
        // A carry out of the mantissa bumps the exponent (to infinity past 65504).
        if (rem > 0x1000u || (rem == 0x1000u && (mant & 1u) == 1u)) {
            h = h + 1u;
        }
        return h;
    }
    // Subnormal (or zero): the 24-bit significand shifted to units of 2^-24.
    let shift = u32(14 - ee);
    if (shift > 31u) {
        return sign;
    }
    let mm = m | 0x800000u;
    var h = mm >> shift;
    let rem = mm & ((1u << shift) - 1u);
    let half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (h & 1u) == 1u)) {
        h = h + 1u;
    }
    return sign | h;
}

// Two elements per thread into one word (dst_shift counts words: chunks start at even
// elements; a tail element's partner half is padding).
@compute @workgroup_size(256)
fn to_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let w = wg_linear(wid, nwg) * 256u + lid;
    let i = 2u * w;
    if (i < cv.n) {
        let lo = f16_bits(narrow_src[cv.src_shift + i]);
        var hi = 0u;
        if (i + 1u < cv.n) {
            hi = f16_bits(narrow_src[cv.src_shift + i + 1u]);
        }
        narrow_dst[cv.dst_shift + w] = lo | (hi << 16u);
    }
}

@group(0) @binding(1) var<storage, read> widen_src: array<f16>;
@group(0) @binding(2) var<storage, read_write> widen_dst: array<f32>;

@compute @workgroup_size(256)
fn to_f32(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let i = wg_linear(wid, nwg) * 256u + lid;
    if (i < cv.n) {
        widen_dst[cv.dst_shift + i] = f32(widen_src[cv.src_shift + i]);
    }
}

// ---- copy2d_h: dst[r * dld + doff + c] = src[r * sld + soff + c], r < rows, c < cols ------

struct Copy2dParams { rows: u32, cols: u32, sld: u32, soff: u32, dld: u32, doff: u32 }
@group(0) @binding(0) var<uniform> cp: Copy2dParams;
@group(0) @binding(1) var<storage, read> copy_src: array<f16>;
@group(0) @binding(2) var<storage, read_write> copy_dst: array<f16>;

@compute @workgroup_size(256)
fn copy2d_h(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let i = wg_linear(wid, nwg) * 256u + lid;
    if (i < cp.rows * cp.cols) {
        let r = i / cp.cols;
        let c = i % cp.cols;
        copy_dst[r * cp.dld + cp.doff + c] = copy_src[r * cp.sld + cp.soff + c];
    }
}

// ---- gather_h: out[t, :] = f32(table[ids[t] - v0, :]) for the ids inside [v0, v1) ----------
// (embedding.wgsl's gather, from an f16 table.)

struct GatherParams { tokens: u32, hidden: u32, v0: u32, v1: u32, ts: u32, os: u32, is: u32 }
@group(0) @binding(0) var<uniform> gpar: GatherParams;
@group(0) @binding(1) var<storage, read> g_table: array<f16>;
@group(0) @binding(2) var<storage, read> g_ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> g_out: array<f32>;

@compute @workgroup_size(256)
fn gather_h(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let i = wg_linear(wid, nwg) * 256u + lid;
    if (i >= gpar.tokens * gpar.hidden) {
        return;
    }
    let t = i / gpar.hidden;
    let id = g_ids[gpar.is + t];
    if (id >= gpar.v0 && id < gpar.v1) {
        g_out[gpar.os + i] = f32(g_table[gpar.ts + (id - gpar.v0) * gpar.hidden + i % gpar.hidden]);
    }
}
