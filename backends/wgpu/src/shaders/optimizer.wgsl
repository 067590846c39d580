// optimizer.wgsl: AdamW with decoupled weight decay, as torch.optim.AdamW, on g * grad_scale:
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p = p * decay - lr * (m / bc1) / (sqrt(v / bc2) + eps)
// f32 math (the host derives the scalars in f64 once per step).

struct AdamParams {
    n: u32, lr: f32, b1: f32, b2: f32, eps: f32, decay: f32, bc1: f32, bc2: f32,
    grad_scale: f32,
}
@group(0) @binding(0) var<uniform> hp: AdamParams;
@group(0) @binding(1) var<storage, read> grad: array<f32>;
@group(0) @binding(2) var<storage, read_write> param: array<f32>;
@group(0) @binding(3) var<storage, read_write> m1: array<f32>;
@group(0) @binding(4) var<storage, read_write> m2: array<f32>;

@compute @workgroup_size(256)
fn adamw(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    let i = wg_linear(wid, nwg) * 256u + lid;
    if (i >= hp.n) {
        return;
    }
    let g = grad[i] * hp.grad_scale;
    let m = hp.b1 * m1[i] + (1.0 - hp.b1) * g;
    let v = hp.b2 * m2[i] + (1.0 - hp.b2) * g * g;
    m1[i] = m;
    m2[i] = v;
    param[i] = param[i] * hp.decay - hp.lr * (m / hp.bc1) / (sqrt(v / hp.bc2) + hp.eps);
}
