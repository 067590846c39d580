// reduce_subgroups.wgsl: reduce.wgsl's interface on subgroup operations (the device's
// SUBGROUP feature, which is what naga asks of them): each subgroup reduces its lanes, its
// first lane writes the result to workgroup memory at the subgroup's index, and every thread
// adds the subgroups' results in index order. The order inside subgroupAdd is the driver's,
// so sums may differ from reduce.wgsl's in the last bits (maxima and argmax do not).
// Entry points pass their subgroup builtins to rd_init first.

var<workgroup> rd_val: array<f32, 256>;
var<workgroup> rd_idx: array<u32, 256>;
var<private> rd_lane: u32;
var<private> rd_sg: u32;
var<private> rd_sgs: u32;

fn rd_init(lane: u32, sg: u32, sgs: u32) {
    rd_lane = lane;
    rd_sg = sg;
    rd_sgs = sgs;
}

fn wg_sum(v: f32, lid: u32) -> f32 {
    let s = subgroupAdd(v);
    workgroupBarrier();
    if (rd_lane == 0u) {
        rd_val[rd_sg] = s;
    }
    workgroupBarrier();
    var t = 0.0;
    for (var i = 0u; i < rd_sgs; i = i + 1u) {
        t = t + rd_val[i];
    }
    return t;
}

fn wg_max_u32(v: u32, lid: u32) -> u32 {
    let s = subgroupMax(v);
    workgroupBarrier();
    if (rd_lane == 0u) {
        rd_idx[rd_sg] = s;
    }
    workgroupBarrier();
    var t = 0u;
    for (var i = 0u; i < rd_sgs; i = i + 1u) {
        t = max(t, rd_idx[i]);
    }
    return t;
}

fn wg_argmax(v: f32, i: u32, lid: u32) -> vec2<u32> {
    // Within the subgroup: the largest value held with an id (-inf when none), then the
    // lowest id holding it.
    let m = subgroupMax(select(v, bitcast<f32>(0xff800000u), i == 0xffffffffu));
    let id = subgroupMin(select(0xffffffffu, i, i != 0xffffffffu && v == m));
    workgroupBarrier();
    if (rd_lane == 0u) {
        rd_val[rd_sg] = m;
        rd_idx[rd_sg] = id;
    }
    workgroupBarrier();
    var bv = bitcast<f32>(0xff800000u);
    var bi = 0xffffffffu;
    for (var k = 0u; k < rd_sgs; k = k + 1u) {
        let oi = rd_idx[k];
        let ov = rd_val[k];
        if (oi != 0xffffffffu && (bi == 0xffffffffu || ov > bv || (ov == bv && oi < bi))) {
            bv = ov;
            bi = oi;
        }
    }
    return vec2<u32>(bitcast<u32>(bv), bi);
}
