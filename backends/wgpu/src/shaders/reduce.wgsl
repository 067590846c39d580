// reduce.wgsl: workgroup reductions of 256 threads through workgroup memory, a fixed-order
// tree (the same bits on every run). Put in front of the families that reduce rows (norm,
// loss, memory) where the device has no subgroups or they are off; reduce_subgroups.wgsl is
// the same interface on subgroup operations. Every thread of the workgroup calls each
// reduction (in uniform control flow) and every thread gets the result.

var<workgroup> rd_val: array<f32, 256>;
var<workgroup> rd_idx: array<u32, 256>;

// The sum of v over the workgroup.
fn wg_sum(v: f32, lid: u32) -> f32 {
    workgroupBarrier();
    rd_val[lid] = v;
    for (var s = 128u; s > 0u; s = s / 2u) {
        workgroupBarrier();
        if (lid < s) {
            rd_val[lid] = rd_val[lid] + rd_val[lid + s];
        }
    }
    workgroupBarrier();
    return rd_val[0];
}

// The largest v over the workgroup.
fn wg_max_u32(v: u32, lid: u32) -> u32 {
    workgroupBarrier();
    rd_idx[lid] = v;
    for (var s = 128u; s > 0u; s = s / 2u) {
        workgroupBarrier();
        if (lid < s) {
            rd_idx[lid] = max(rd_idx[lid], rd_idx[lid + s]);
        }
    }
    workgroupBarrier();
    return rd_idx[0];
}

// The best (value, id) over the workgroup: the largest value, the lowest id among equal
// values; id 0xffffffff is "none" and loses to everything. Returns (value bits, id).
fn wg_argmax(v: f32, i: u32, lid: u32) -> vec2<u32> {
    workgroupBarrier();
    rd_val[lid] = v;
    rd_idx[lid] = i;
    for (var s = 128u; s > 0u; s = s / 2u) {
        workgroupBarrier();
        if (lid < s) {
            let oi = rd_idx[lid + s];
            let ov = rd_val[lid + s];
            if (oi != 0xffffffffu && (rd_idx[lid] == 0xffffffffu || ov > rd_val[lid]
                    || (ov == rd_val[lid] && oi < rd_idx[lid]))) {
                rd_val[lid] = ov;
                rd_idx[lid] = oi;
            }
        }
    }
    workgroupBarrier();
    return vec2<u32>(bitcast<u32>(rd_val[0]), rd_idx[0]);
}
