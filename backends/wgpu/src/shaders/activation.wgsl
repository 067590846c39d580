// activation.wgsl: SwiGLU, h = silu(g) * u with silu(g) = g * sigmoid(g); backward
// d_up = dh * silu(g), d_gate = dh * u * s * (1 + g * (1 - s)), s = sigmoid(g). f32 math.

struct NParams { n: u32 }
@group(0) @binding(0) var<uniform> p: NParams;

fn sigmoid(g: f32) -> f32 {
    return 1.0 / (1.0 + exp(-g));
}

@group(0) @binding(1) var<storage, read> f_gate: array<f32>;
@group(0) @binding(2) var<storage, read> f_up: array<f32>;
@group(0) @binding(3) var<storage, read_write> f_h: array<f32>;

@compute @workgroup_size(256)
fn swiglu(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let i = wg_linear(wid, nwg) * 256u + lid;
    if (i < p.n) {
        let g = f_gate[i];
        f_h[i] = g * sigmoid(g) * f_up[i];
    }
}

@group(0) @binding(1) var<storage, read> b_dh: array<f32>;
@group(0) @binding(2) var<storage, read> b_gate: array<f32>;
@group(0) @binding(3) var<storage, read> b_up: array<f32>;
@group(0) @binding(4) var<storage, read_write> b_dgate: array<f32>;
@group(0) @binding(5) var<storage, read_write> b_dup: array<f32>;

@compute @workgroup_size(256)
fn swiglu_backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32) {
    let i = wg_linear(wid, nwg) * 256u + lid;
    if (i < p.n) {
        let d = b_dh[i];
        let g = b_gate[i];
        let s = sigmoid(g);
        b_dup[i] = d * g * s;
        b_dgate[i] = d * b_up[i] * s * (1.0 + g * (1.0 - s));
    }
}
