// rope.wgsl: rotary embedding, HF "rotate half" layout. For i < D/2, with the host's f64
// tables cos/sin (T, D/2) of angle p * theta^(-2i/D) rounded to f32:
//   y_i = x_i cos - x_{i+D/2} s,  y_{i+D/2} = x_{i+D/2} cos + x_i s,  s = sign * sin
// (sign -1: the backward, a rotation by -angle). One thread per (token, head, i).

struct RopeParams { tokens: u32, heads: u32, half: u32, sign: f32, xs: u32, ys: u32, ts: u32 }
@group(0) @binding(0) var<uniform> p: RopeParams;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> cos_t: array<f32>;
@group(0) @binding(3) var<storage, read> sin_t: array<f32>;
@group(0) @binding(4) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(256)
fn rope(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let idx = wg_linear(wid, nwg) * 256u + lid;
    if (idx >= p.tokens * p.heads * p.half) {
        return;
    }
    let i = idx % p.half;
    let th = idx / p.half;           // token * heads + head
    let tok = th / p.heads;
    let c = cos_t[p.ts + tok * p.half + i];
    let s = p.sign * sin_t[p.ts + tok * p.half + i];
    let base = th * 2u * p.half + i;
    let x1 = x[p.xs + base];
    let x2 = x[p.xs + base + p.half];
    y[p.ys + base] = x1 * c - x2 * s;
    y[p.ys + base + p.half] = x2 * c + x1 * s;
}
