// embedding.wgsl: row gather, out[t, :] = table[ids[t] - v0, :] for the ids inside this
// dispatch's table chunk [v0, v1) (ids were checked on the host). Also gathers rows of any
// matrix by an index list (the loss's active rows). One thread per output element.

struct GatherParams { tokens: u32, hidden: u32, v0: u32, v1: u32, ts: u32, os: u32, is: u32 }
@group(0) @binding(0) var<uniform> p: GatherParams;
@group(0) @binding(1) var<storage, read> table: array<f32>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(256)
fn gather(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let i = wg_linear(wid, nwg) * 256u + lid;
    if (i >= p.tokens * p.hidden) {
        return;
    }
    let t = i / p.hidden;
    let id = ids[p.is + t];
    if (id >= p.v0 && id < p.v1) {
        out[p.os + i] = table[p.ts + (id - p.v0) * p.hidden + i % p.hidden];
    }
}

// The inverse: out[ids[t], :] = src[t, :] (the loss's dx rows back into place).
@group(0) @binding(1) var<storage, read> s_src: array<f32>;
@group(0) @binding(2) var<storage, read> s_ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> s_out: array<f32>;

@compute @workgroup_size(256)
fn scatter(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let i = wg_linear(wid, nwg) * 256u + lid;
    if (i >= p.tokens * p.hidden) {
        return;
    }
    let t = i / p.hidden;
    let row = s_ids[p.is + t];
    if (row >= p.v0 && row < p.v1) {
        s_out[p.os + (row - p.v0) * p.hidden + i % p.hidden] = s_src[p.ts + i];
    }
}
