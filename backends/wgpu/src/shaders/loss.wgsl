// loss.wgsl: the per-row pieces of the fused linear cross-entropy, over one (rows, vc) chunk
// of logits (vocabulary ids [v0, v0 + vc)); the GEMMs around them are gemm.wgsl's.
//
// Running state per row, 8 words: [0] max of the non-NaN logits so far, [1] sum of
// exp(z - max), [2] best value, [3] best id (u32 bits), [4] the label's logit, [5] NaN seen
// (1.0), [6..8) unused. Argmax: the lowest id among the largest non-NaN values (NaNs never
// win; all NaN gives id 0), as the reference does. The row reductions are reduce.wgsl's (or
// reduce_subgroups.wgsl's) wg_argmax, wg_sum and wg_max_u32.

struct CeParams { n: u32, vc: u32, v0: u32, first: u32, grad_scale: f32 }
@group(0) @binding(0) var<uniform> p: CeParams;

const NEG_INF_BITS: u32 = 0xff800000u;

// The larger of (va, ia) and (vb, ib); ties to the lower id; -inf loses to nothing.
fn better(va: f32, ia: u32, vb: f32, ib: u32) -> bool {
    return vb > va || (vb == va && ib < ia);
}

// ---- ce_stats: fold one chunk into the running state ----------------------------------------

@group(0) @binding(1) var<storage, read> s_logits: array<f32>;
@group(0) @binding(2) var<storage, read> s_labels: array<u32>;
@group(0) @binding(3) var<storage, read_write> s_state: array<f32>;

@compute @workgroup_size(256)
fn ce_stats(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32 /*rd-args*/) {
    /*rd-init*/
    let row = wg_linear(wid, nwg);
    if (row >= p.n) {
        return;
    }
    let base = row * p.vc;
    // Pass 1: this thread's largest non-NaN value (lowest id on ties) and whether it saw NaN.
    var bv = bitcast<f32>(NEG_INF_BITS);
    var bi = 0xffffffffu;
    var nan = 0u;
    for (var j = lid; j < p.vc; j = j + 256u) {
        let z = s_logits[base + j];
        if (is_nan_f32(z)) {
            nan = 1u;
        } else if (bi == 0xffffffffu || z > bv) {
            bv = z;
            bi = j;
        }
    }
    let best = wg_argmax(bv, bi, lid);
    let cmax = bitcast<f32>(best.x); // -inf when the chunk is all NaN (or all -inf)
    let cbest = best.y;              // 0xffffffff when the chunk is all NaN
    // Pass 2: sum of exp(z - cmax) over the non-NaN values, and the NaN flag.
    var acc = 0.0;
    if (cmax != bitcast<f32>(NEG_INF_BITS)) {
        for (var j = lid; j < p.vc; j = j + 256u) {
            let z = s_logits[base + j];
            if (!is_nan_f32(z)) {
                acc = acc + exp(z - cmax);
            }
        }
    }
    let csum = wg_sum(acc, lid);
    let any_nan = wg_max_u32(nan, lid);
    if (lid != 0u) {
        return;
    }
    let at = row * 8u;
    if (p.first != 0u) {
        s_state[at] = bitcast<f32>(NEG_INF_BITS);
        s_state[at + 1u] = 0.0;
        s_state[at + 2u] = bitcast<f32>(NEG_INF_BITS);
        s_state[at + 3u] = bitcast<f32>(0u);
        s_state[at + 4u] = 0.0;
        s_state[at + 5u] = 0.0;
    }
    // Online merge of (max, sum); a -inf side contributes nothing (exp(-inf - -inf) is NaN).
    let m = s_state[at];
    let nm = select(m, cmax, cmax > m);
    var total = 0.0;
    if (m != bitcast<f32>(NEG_INF_BITS)) {
        total = s_state[at + 1u] * exp(m - nm);
    }
    if (cmax != bitcast<f32>(NEG_INF_BITS)) {
        total = total + csum * exp(cmax - nm);
    }
    s_state[at] = nm;
    s_state[at + 1u] = total;
    if (cbest != 0xffffffffu && cmax > s_state[at + 2u]) {
        s_state[at + 2u] = cmax;
        s_state[at + 3u] = bitcast<f32>(p.v0 + cbest);
    }
    let label = s_labels[row];
    if (label >= p.v0 && label < p.v0 + p.vc) {
        s_state[at + 4u] = s_logits[base + label - p.v0];
    }
    if (any_nan != 0u) {
        s_state[at + 5u] = 1.0;
    }
}

// ---- ce_dlogits: logits -> grad_scale * w * (softmax - onehot), in place ----------------------

@group(0) @binding(1) var<storage, read> d_labels: array<u32>;
@group(0) @binding(2) var<storage, read> d_weights: array<f32>;
@group(0) @binding(3) var<storage, read> d_state: array<f32>;
@group(0) @binding(4) var<storage, read_write> d_logits: array<f32>;

@compute @workgroup_size(256)
fn ce_dlogits(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let i = wg_linear(wid, nwg) * 256u + lid;
    if (i >= p.n * p.vc) {
        return;
    }
    let row = i / p.vc;
    let j = i % p.vc;
    let at = row * 8u;
    var lse = s_lse(d_state[at], d_state[at + 1u]);
    if (d_state[at + 5u] != 0.0) {
        lse = nan_f32();
    }
    let prob = exp(d_logits[i] - lse);
    let onehot = select(0.0, 1.0, d_labels[row] == p.v0 + j);
    d_logits[i] = p.grad_scale * d_weights[row] * (prob - onehot);
}

fn s_lse(m: f32, s: f32) -> f32 {
    return m + log(s);
}
