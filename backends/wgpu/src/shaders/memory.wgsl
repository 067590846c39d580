// memory.wgsl: fills, elementwise glue, strided 2-D copies and the partial sums of the
// reductions (sum of squares, non-finite count); the host adds the partials in f64.

// ---- fill: o[first .. first + count) = value ------------------------------------------

struct FillParams { first: u32, count: u32, value: u32 }
@group(0) @binding(0) var<uniform> fp: FillParams;
@group(0) @binding(1) var<storage, read_write> fill_out: array<f32>;

@compute @workgroup_size(256)
fn fill(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = wg_linear(wid, nwg) * 256u + lid;
    if (i < fp.count) {
        fill_out[fp.first + i] = bitcast<f32>(fp.value);
    }
}

// ---- add: o = a + b ---------------------------------------------------------------------

struct NParams { n: u32, scale: f32, shift: u32 }
@group(0) @binding(0) var<uniform> np: NParams;
@group(0) @binding(1) var<storage, read> add_a: array<f32>;
@group(0) @binding(2) var<storage, read> add_b: array<f32>;
@group(0) @binding(3) var<storage, read_write> add_out: array<f32>;

@compute @workgroup_size(256)
fn add(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(local_invocation_index) lid: u32) {
    let i = wg_linear(wid, nwg) * 256u + lid;
    if (i < np.n) {
        add_out[i] = add_a[i] + add_b[i];
    }
}

// ---- add_assign: acc += x -----------------------------------------------------------------

@group(0) @binding(1) var<storage, read> acc_x: array<f32>;
@group(0) @binding(2) var<storage, read_write> acc_acc: array<f32>;

@compute @workgroup_size(256)
fn add_assign(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32) {
    let i = wg_linear(wid, nwg) * 256u + lid;
    if (i < np.n) {
        acc_acc[i] = acc_acc[i] + acc_x[i];
    }
}

// ---- scale: t[shift + i] *= s ------------------------------------------------------------------------

@group(0) @binding(1) var<storage, read_write> scale_t: array<f32>;

@compute @workgroup_size(256)
fn scale(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    let i = wg_linear(wid, nwg) * 256u + lid;
    if (i < np.n) {
        scale_t[np.shift + i] = scale_t[np.shift + i] * np.scale;
    }
}

// ---- copy2d: dst[r * dld + doff + c] = src[r * sld + soff + c], r < rows, c < cols -------

struct Copy2dParams { rows: u32, cols: u32, sld: u32, soff: u32, dld: u32, doff: u32 }
@group(0) @binding(0) var<uniform> cp: Copy2dParams;
@group(0) @binding(1) var<storage, read> copy_src: array<f32>;
@group(0) @binding(2) var<storage, read_write> copy_dst: array<f32>;

@compute @workgroup_size(256)
fn copy2d(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let i = wg_linear(wid, nwg) * 256u + lid;
    if (i < cp.rows * cp.cols) {
        let r = i / cp.cols;
        let c = i % cp.cols;
        copy_dst[r * cp.dld + cp.doff + c] = copy_src[r * cp.sld + cp.soff + c];
    }
}

// ---- partial reductions: one value per workgroup of REDUCE_PER_WG elements ---------------
// Each thread sums 16 strided elements, then wg_sum over the workgroup (reduce.wgsl or
// reduce_subgroups.wgsl: a fixed order, the same bits on every run).

const REDUCE_THREADS: u32 = 256u;
const REDUCE_PER_THREAD: u32 = 16u;

struct ReduceParams { n: u32, out_first: u32 }
@group(0) @binding(0) var<uniform> rp: ReduceParams;
@group(0) @binding(1) var<storage, read> red_x: array<f32>;
@group(0) @binding(2) var<storage, read_write> red_out: array<f32>;

@compute @workgroup_size(256)
fn sum_squares_partial(@builtin(workgroup_id) wid: vec3<u32>,
                       @builtin(num_workgroups) nwg: vec3<u32>,
                       @builtin(local_invocation_index) lid: u32 /*rd-args*/) {
    /*rd-init*/
    let g = wg_linear(wid, nwg);
    let base = g * REDUCE_THREADS * REDUCE_PER_THREAD;
    if (base >= rp.n) {
        return; // past the last partial (the tail of a 2-D grid)
    }
    var acc = 0.0;
    for (var k = 0u; k < REDUCE_PER_THREAD; k = k + 1u) {
        let i = base + k * REDUCE_THREADS + lid;
        if (i < rp.n) {
            let v = red_x[i];
            acc = acc + v * v;
        }
    }
    let total = wg_sum(acc, lid);
    if (lid == 0u) {
        red_out[rp.out_first + g] = total;
    }
}

@compute @workgroup_size(256)
fn nonfinite_partial(@builtin(workgroup_id) wid: vec3<u32>,
                     @builtin(num_workgroups) nwg: vec3<u32>,
                     @builtin(local_invocation_index) lid: u32 /*rd-args*/) {
    /*rd-init*/
    let g = wg_linear(wid, nwg);
    let base = g * REDUCE_THREADS * REDUCE_PER_THREAD;
    if (base >= rp.n) {
        return; // past the last partial (the tail of a 2-D grid)
    }
    var bad = 0.0;
    for (var k = 0u; k < REDUCE_PER_THREAD; k = k + 1u) {
        let i = base + k * REDUCE_THREADS + lid;
        if (i < rp.n && !is_finite_f32(red_x[i])) {
            bad = bad + 1.0;
        }
    }
    let total = wg_sum(bad, lid);
    if (lid == 0u) {
        red_out[rp.out_first + g] = total;
    }
}
