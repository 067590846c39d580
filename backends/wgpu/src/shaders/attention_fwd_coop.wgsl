// attention_fwd_coop.wgsl: the forward on cooperative matrices (tensor cores on NVIDIA through
// VK_KHR_cooperative_matrix), after attention.wgsl, in its own module (the host puts `enable
// f16; enable wgpu_cooperative_matrix;` in front). Shipped where the adapter has it
// (`WgpuOptions::attn_coop`; `DFLASH_WGPU_ATTN_COOP=0` the f32 forward, `=1` required). As in
// matmul_coop, q, k, v and the probabilities are ROUNDED TO F16 for the two products, which
// accumulate in f32; the softmax statistics, lse and out are f32 (its CPU twin, with the same
// roundings: tests/src/f16_products.rs). Head dims 65..=128 that are a multiple of 4 (DP 128,
// read as vec4), one pass (GPUs run one), subgroups of exactly 32 lanes.
//
// One workgroup of NSG = WG / 32 subgroups per (query tile of BQ = 16 NSG rows, head);
// subgroup sg owns rows 16 sg .. 16 sg + 15 of the tile. Its query rows are 8 A matrices
// (16 x 16 f16, dims 16 d ..) held for the whole key list (staged a quarter of the head dim
// at a time, which is all the K/V area holds of BQ rows), its output 8 f32 accumulators
// o0..o7 (dims 16 n ..). Per key tile of BK = 32 keys, five barriers:
// 1. K and V stored as f16 rows of HK halves (fetched into registers during the previous
//    tile's products);
// 2. S = Q K^T (two 16 x 16 accumulators, 8 k-steps each) stored to the subgroup's scratch;
// 3. each row's two lanes (lane / 2: the row, lane % 2: which 16 keys) mask and scale their
//    scores, take the row's max, and write P = exp(s - m) as f16; a row whose max passed its
//    reference by more than TAU votes for a rescale;
// 4. the vote, read uniformly (a barrier); only when it is set, every accumulator goes through
//    the scratch to have its rows scaled (the slow path, 3 barriers an accumulator);
//    then O += P V (two k-steps of 16 keys into the 8 accumulators), and a barrier before
//    the next tile's stores.
// Accumulators go to workgroup memory as 16 x 16 blocks at stride 16 (the layout
// matmul_coop's epilogue uses): the scratch of a subgroup is two such blocks.
//
// Lazy rescaling: a row's probabilities are taken against a reference max m that moves only
// when a score passes it by more than TAU = 10, so P <= e^10 < 65504 fits f16 and rescaling O
// (which cooperative matrices cannot do per row) is rare: once per row at most where its
// scores come in a bounded range. A row's first visible score sets m without a rescale (its
// O is still zero). The sum l adds the f16-rounded probabilities, the same the product uses,
// so a row's weights sum to one.
//
// NaN policy: a visible score that is NaN or +inf makes its row's out and lse NaN, as in the
// other kernels. A non-finite value of V reaches every row of the tiles that stage it (0 x
// NaN inside the product): the tile-granularity contract of the CUDA backend's tensor-core
// kernels (`NanCase::within_tiles`); a row that sees no key is still exactly 0. Values past
// f16's range (65504) become infinities: the kernel's limit, as matmul_coop's.
//
// Uniformity: naga requires the cooperative operations in workgroup-uniform control flow and
// takes any function's result for non-uniform, so the entry point computes its early return
// and list bounds inline (the bounds through workgroupUniformLoad), and the rescale vote is
// read with workgroupUniformLoad too.
//
// Alignment: every cooperative load and store starts at a multiple of 16 bytes with a stride
// that is one (HK = 136 halves = 272 bytes, HQ = 40 halves = 80 bytes, PS = 40 halves, 16
// f32 = 64 bytes), as VK_KHR_cooperative_matrix asks.
// Bounds: every cooperative access (16 rows of 16 from its start) stays inside its array:
// the last element K's products read is 31 HK + 127 < VOFF, V's VOFF + 31 HK + 127 <
// 2 BK HK, a query quarter's (16 NSG - 1) HQ + 31 < 2 BK HK, P's (16 NSG - 1) PS + 31 <
// 16 NSG PS, and a scratch block's (NSG - 1) SS + 511 < NSG SS.

const NSG: u32 = WG / 32u;
const HK: u32 = DP + 8u;
const VOFF: u32 = BK * HK;
// A quarter of the head dim of BQ query rows: rows of HQ halves, in the K/V area.
const HQ: u32 = DP / 4u + 8u;
const SS: u32 = 2u * 256u;
const PS: u32 = BK + 8u;
const TAU: f32 = 10.0;
// K and V shares a thread fetches per tile (vec4 each).
const NF: u32 = BK * DP4 / WG;

var<workgroup> hkv: array<f16, 2u * BK * HK>;
var<workgroup> hs: array<f32, NSG * SS>;
var<workgroup> hp: array<f16, NSG * 16u * PS>;
// 16 bytes each (one element used), as every workgroup variable here: see attention.wgsl.
var<workgroup> vote: array<atomic<u32>, 4>;
var<workgroup> vote_u: array<u32, 4>;
// attention.wgsl's staging helpers name `buf`; this kernel does not reach them.
var<workgroup> buf: array<vec4<f32>, 1>;

@group(0) @binding(5) var<storage, read_write> f_out: array<f32>;
@group(0) @binding(6) var<storage, read_write> f_lse: array<f32>;

alias CoopA = coop_mat16x16<f16, A>;
alias CoopB = coop_mat16x16<f16, B>;
alias CoopC = coop_mat16x16<f32, C>;

// The barrier after a cooperative store, which makes the stored block the lanes' to read.
fn publish() {
    workgroupBarrier();
}

// Four halves at hkv[at ..].
fn put4_hkv(at: u32, x: vec4<f32>) {
    let h = vec4<f16>(x);
    hkv[at] = h.x;
    hkv[at + 1u] = h.y;
    hkv[at + 2u] = h.z;
    hkv[at + 3u] = h.w;
}

// Dims 32 r .. 32 r + 31 of query rows [r0, r0 + BQ) of head h into hkv (rows of HQ halves),
// zero past tq.
fn stage_q_quarter(r0: u32, h: u32, r: u32, lid: u32) {
    for (var n = 0u; n < BQ * 8u / WG; n = n + 1u) {
        let e = lid + n * WG;
        let i = e / 8u;
        let c4 = 8u * r + e % 8u;
        var x = vec4<f32>(0.0);
        if (r0 + i < p.tq) {
            x = q_row4(((r0 + i) * p.hq + h) * p.d, c4);
        }
        put4_hkv(i * HQ + 4u * (e % 8u), x);
    }
}

// The subgroup's query rows at dims 16 (2 r + t) .. + 15 from the staged quarter r.
fn q_frag(sg: u32, t: u32) -> CoopA {
    return coopLoadT<CoopA>(&hkv[16u * sg * HQ + 16u * t], HQ);
}

// This thread's shares of keys [k0, k0 + BK) of kv head kh: K (x) and V (y) vec4, zero past
// tk (and none where `live` is false: past the list).
struct KvShare {
    k: array<vec4<f32>, NF>,
    v: array<vec4<f32>, NF>,
}

fn fetch_kv_coop(k0: u32, kh: u32, lid: u32, live: bool) -> KvShare {
    var x: KvShare;
    for (var n = 0u; n < NF; n = n + 1u) {
        let e = lid + n * WG;
        let j = e / DP4;
        var xk = vec4<f32>(0.0);
        var xv = vec4<f32>(0.0);
        if (live && k0 + j < p.tk) {
            let at = ((k0 + j) * p.hkv + kh) * p.d;
            xk = k_row4(at, e % DP4);
            xv = v_row4(at, e % DP4);
        }
        x.k[n] = xk;
        x.v[n] = xv;
    }
    return x;
}

// A fetched share as f16: K at hkv[0 ..], V at hkv[VOFF ..].
fn put_kv_coop(x: KvShare, lid: u32) {
    for (var n = 0u; n < NF; n = n + 1u) {
        let e = lid + n * WG;
        let at = (e / DP4) * HK + 4u * (e % DP4);
        put4_hkv(at, x.k[n]);
        put4_hkv(VOFF + at, x.v[n]);
    }
}

// Four of the lane's scores (keys key0 .. key0 + 3 of its row `li`, `iv` the row's two key
// intervals): scaled where visible, -inf elsewhere.
fn mask4(x: vec4<f32>, key0: u32, li: u32, iv: vec4<i32>) -> vec4<f32> {
    var y = vec4<f32>(neg_inf_f32());
    for (var e = 0u; e < 4u; e = e + 1u) {
        let key = key0 + e;
        var seen = false;
        if (tile_full) {
            seen = tile_r0 + li < p.tq && key < p.tk;
        } else {
            let kk = i32(key);
            seen = (kk >= iv.x && kk < iv.y) || (kk >= iv.z && kk < iv.w);
        }
        if (seen) {
            y[e] = p.scale * x[e];
        }
    }
    return y;
}

// Whether a score makes its row NaN (NaN or +inf), per component.
fn poisons4(x: vec4<f32>) -> vec4<bool> {
    let b = bitcast<vec4<u32>>(x);
    let special = (b & vec4<u32>(0x7fffffffu)) >= vec4<u32>(0x7f800000u);
    return special & (b != vec4<u32>(0xff800000u));
}

fn max4(x: vec4<f32>) -> f32 {
    return max(max(x.x, x.y), max(x.z, x.w));
}

// exp(x - m) rounded to f16 (0 where x is -inf), as f32.
fn probs4(x: vec4<f32>, m: f32) -> vec4<f32> {
    let e = vec4<f16>(exp(x - vec4<f32>(m)));
    return select(vec4<f32>(e), vec4<f32>(0.0), x == vec4<f32>(neg_inf_f32()));
}

fn put4_hp(at: u32, x: vec4<f32>) {
    let h = vec4<f16>(x);
    hp[at] = h.x;
    hp[at + 1u] = h.y;
    hp[at + 2u] = h.z;
    hp[at + 3u] = h.w;
}

fn hs4(at: u32) -> vec4<f32> {
    return vec4<f32>(hs[at], hs[at + 1u], hs[at + 2u], hs[at + 3u]);
}

// The lane's 8 elements of a 16 x 16 block stored at hs[sgb ..] (row lane / 2, columns
// 8 (lane % 2) ..) scaled by `alpha` (the rescale of an accumulator's rows).
fn scale_block(sgb: u32, lane: u32, alpha: f32) {
    let at = sgb + (lane / 2u) * 16u + 8u * (lane % 2u);
    for (var c = 0u; c < 8u; c = c + 1u) {
        hs[at + c] = hs[at + c] * alpha;
    }
}

// The lane's 8 elements of the 16 x 16 block of accumulator n stored at hs[sgb ..] into out:
// times `inv` (1 / l; NaN for a NaN row; 0 for a row that saw no key, written exactly 0),
// row `row` of the tensor, where < tq and inside D.
fn write_block(n: u32, sgb: u32, lane: u32, row: u32, h: u32, inv: f32) {
    let at = sgb + (lane / 2u) * 16u + 8u * (lane % 2u);
    if (row < p.tq) {
        let base = (row * p.hq + h) * p.d;
        for (var c = 0u; c < 8u; c = c + 1u) {
            let dim = 16u * n + 8u * (lane % 2u) + c;
            if (dim < p.d) {
                var x = hs[at + c] * inv;
                if (is_nan_f32(inv) || inv == 0.0) {
                    x = inv;
                }
                f_out[base + dim] = x;
            }
        }
    }
}

// Accumulator `o` with each of its rows scaled by that row's `alpha`, through the
// subgroup's scratch at hs[sgb ..] (cooperative matrices have no per-row scaling). The load
// goes to a `var`: naga writes a `let` of a cooperative load at its first use, which would
// come after the barrier that frees the scratch. Workgroup-uniform control flow only.
fn rescaled(o: CoopC, sgb: u32, lane: u32, alpha: f32) -> CoopC {
    coopStoreT(o, &hs[sgb], 16u);
    publish();
    scale_block(sgb, lane, alpha);
    workgroupBarrier();
    var r = coopLoadT<CoopC>(&hs[sgb], 16u);
    workgroupBarrier();
    return r;
}

// Accumulator `o` (dims 16 n ..) written to out through the subgroup's scratch
// (`write_block`). Workgroup-uniform control flow only.
fn drain(o: CoopC, n: u32, sgb: u32, lane: u32, row: u32, h: u32, inv: f32) {
    coopStoreT(o, &hs[sgb], 16u);
    publish();
    write_block(n, sgb, lane, row, h, inv);
    workgroupBarrier();
}

@compute @workgroup_size(WG)
fn attn_fwd_coop(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                 @builtin(local_invocation_index) lid: u32,
                 @builtin(subgroup_id) sg_in: u32,
                 @builtin(subgroup_invocation_id) lane_in: u32) {
    // q_tile_groups() and wg_linear written out (uniform in naga's analysis).
    let g = wid.x + wid.y * nwg.x;
    if (g >= (p.tq + BQ - 1u) / BQ * p.hq) {
        return;
    }
    let sg = min(sg_in, NSG - 1u);
    let lane = lane_in & 31u;
    let tile = begin_q_tile(g, lid);
    let qt = tile.x;
    let h = tile.y;
    let kh = h / p.group;
    let r0 = qt * BQ;
    if (lid == 0u) {
        bounds[0] = tiles[qt];
        bounds[1] = tiles[qt + 1u];
    }
    let lo = workgroupUniformLoad(&bounds[0]);
    let hi = workgroupUniformLoad(&bounds[1]);
    // The query fragments, a quarter of the head dim at a time. Each is stored to a `var`
    // where it is loaded: naga writes a `let` of a cooperative load at its first use, which
    // here would come after K and V overwrite the staged quarter.
    stage_q_quarter(r0, h, 0u, lid);
    workgroupBarrier();
    var q0 = q_frag(sg, 0u);
    var q1 = q_frag(sg, 1u);
    workgroupBarrier();
    stage_q_quarter(r0, h, 1u, lid);
    workgroupBarrier();
    var q2 = q_frag(sg, 0u);
    var q3 = q_frag(sg, 1u);
    workgroupBarrier();
    stage_q_quarter(r0, h, 2u, lid);
    workgroupBarrier();
    var q4 = q_frag(sg, 0u);
    var q5 = q_frag(sg, 1u);
    workgroupBarrier();
    stage_q_quarter(r0, h, 3u, lid);
    workgroupBarrier();
    var q6 = q_frag(sg, 0u);
    var q7 = q_frag(sg, 1u);
    workgroupBarrier(); // Q is read: K and V take its place
    var o0 = CoopC(); var o1 = CoopC(); var o2 = CoopC(); var o3 = CoopC();
    var o4 = CoopC(); var o5 = CoopC(); var o6 = CoopC(); var o7 = CoopC();
    // A zero accumulator made once, outside the key loop, for the scores to start from.
    var zc = CoopC();
    // The lane's row of the tile (both lanes of a pair hold the same statistics) and its 16
    // keys of each tile: c0 .. c0 + 15, which are one 16 x 16 block of the scratch.
    let li = 16u * sg + lane / 2u;
    let half = lane % 2u;
    let c0 = 16u * half;
    let sgb = sg * SS;
    let at = sgb + 256u * half + 16u * (lane / 2u);
    let pat = sg * 16u * PS + (lane / 2u) * PS + c0;
    let iv = vec4<i32>(row_iv[4u * li], row_iv[4u * li + 1u], row_iv[4u * li + 2u],
                       row_iv[4u * li + 3u]);
    let ninf = neg_inf_f32();
    var m = ninf;
    var l = 0.0;
    var bad_row = false;
    var kv = fetch_kv_coop((tiles[p.qlist_at + lo] & ~FULL) * BK, kh, lid, lo < hi);
    for (var it = lo; it < hi; it = it + 1u) {
        let w = tiles[p.qlist_at + it];
        tile_full = (w & FULL) != 0u;
        let k0 = (w & ~FULL) * BK;
        if (lid == 0u) {
            atomicStore(&vote[0], 0u);
        }
        put_kv_coop(kv, lid);
        workgroupBarrier(); // K, V staged
        // The next tile's K and V are in flight during this one's work.
        let nw = tiles[p.qlist_at + min(it + 1u, hi - 1u)];
        kv = fetch_kv_coop((nw & ~FULL) * BK, kh, lid, it + 1u < hi);
        // S = Q K^T: keys 0..15 (s0) and 16..31 (s1), one product per named fragment
        // (WGSL has no arrays of cooperative matrices).
        var s0 = coopMultiplyAdd(q0, coopLoad<CoopB>(&hkv[0u * HK + 0u], HK), zc);
        s0 = coopMultiplyAdd(q1, coopLoad<CoopB>(&hkv[0u * HK + 16u], HK), s0);
        s0 = coopMultiplyAdd(q2, coopLoad<CoopB>(&hkv[0u * HK + 32u], HK), s0);
        s0 = coopMultiplyAdd(q3, coopLoad<CoopB>(&hkv[0u * HK + 48u], HK), s0);
        s0 = coopMultiplyAdd(q4, coopLoad<CoopB>(&hkv[0u * HK + 64u], HK), s0);
        s0 = coopMultiplyAdd(q5, coopLoad<CoopB>(&hkv[0u * HK + 80u], HK), s0);
        s0 = coopMultiplyAdd(q6, coopLoad<CoopB>(&hkv[0u * HK + 96u], HK), s0);
        s0 = coopMultiplyAdd(q7, coopLoad<CoopB>(&hkv[0u * HK + 112u], HK), s0);
        var s1 = coopMultiplyAdd(q0, coopLoad<CoopB>(&hkv[16u * HK + 0u], HK), zc);
        s1 = coopMultiplyAdd(q1, coopLoad<CoopB>(&hkv[16u * HK + 16u], HK), s1);
        s1 = coopMultiplyAdd(q2, coopLoad<CoopB>(&hkv[16u * HK + 32u], HK), s1);
        s1 = coopMultiplyAdd(q3, coopLoad<CoopB>(&hkv[16u * HK + 48u], HK), s1);
        s1 = coopMultiplyAdd(q4, coopLoad<CoopB>(&hkv[16u * HK + 64u], HK), s1);
        s1 = coopMultiplyAdd(q5, coopLoad<CoopB>(&hkv[16u * HK + 80u], HK), s1);
        s1 = coopMultiplyAdd(q6, coopLoad<CoopB>(&hkv[16u * HK + 96u], HK), s1);
        s1 = coopMultiplyAdd(q7, coopLoad<CoopB>(&hkv[16u * HK + 112u], HK), s1);
        coopStoreT(s0, &hs[sgb], 16u);
        coopStoreT(s1, &hs[sgb + 256u], 16u);
        publish(); // S in the scratch
        // The lane's 16 scores: scaled where visible, -inf elsewhere; NaN and +inf flag the
        // row and count as -inf here.
        let key0 = k0 + c0;
        var x0 = mask4(hs4(at), key0, li, iv);
        var x1 = mask4(hs4(at + 4u), key0 + 4u, li, iv);
        var x2 = mask4(hs4(at + 8u), key0 + 8u, li, iv);
        var x3 = mask4(hs4(at + 12u), key0 + 12u, li, iv);
        let pz0 = poisons4(x0);
        let pz1 = poisons4(x1);
        let pz2 = poisons4(x2);
        let pz3 = poisons4(x3);
        bad_row = bad_row || any(pz0) || any(pz1) || any(pz2) || any(pz3);
        let nv = vec4<f32>(ninf);
        x0 = select(x0, nv, pz0);
        x1 = select(x1, nv, pz1);
        x2 = select(x2, nv, pz2);
        x3 = select(x3, nv, pz3);
        var mx = max(max(max4(x0), max4(x1)), max(max4(x2), max4(x3)));
        mx = max(mx, subgroupShuffleXor(mx, 1u));
        // The shuffle outside `||`: short-circuited, a lane already flagged would skip it and
        // leave its partner reading an inactive lane (the row's other half never flagged).
        let partner_bad = subgroupShuffleXor(select(0u, 1u, bad_row), 1u) != 0u;
        bad_row = bad_row || partner_bad;
        // The row's reference max and the factor its O and l take (1: no rescale).
        var alpha = 1.0;
        if (m == ninf) {
            m = mx;
        } else if (mx > m + TAU) {
            alpha = exp(m - mx);
            m = mx;
            atomicOr(&vote[0], 1u);
        }
        let e0 = probs4(x0, m);
        let e1 = probs4(x1, m);
        let e2 = probs4(x2, m);
        let e3 = probs4(x3, m);
        put4_hp(pat, e0);
        put4_hp(pat + 4u, e1);
        put4_hp(pat + 8u, e2);
        put4_hp(pat + 12u, e3);
        let e = (e0 + e1) + (e2 + e3);
        var sum = (e.x + e.y) + (e.z + e.w);
        sum = sum + subgroupShuffleXor(sum, 1u);
        l = l * alpha + sum;
        workgroupBarrier(); // every vote cast, P written
        if (lid == 0u) {
            vote_u[0] = atomicLoad(&vote[0]);
        }
        if (workgroupUniformLoad(&vote_u[0]) != 0u) {
            o0 = rescaled(o0, sgb, lane, alpha);
            o1 = rescaled(o1, sgb, lane, alpha);
            o2 = rescaled(o2, sgb, lane, alpha);
            o3 = rescaled(o3, sgb, lane, alpha);
            o4 = rescaled(o4, sgb, lane, alpha);
            o5 = rescaled(o5, sgb, lane, alpha);
            o6 = rescaled(o6, sgb, lane, alpha);
            o7 = rescaled(o7, sgb, lane, alpha);
        }
        for (var kk = 0u; kk < BK / 16u; kk = kk + 1u) {
            let pk = coopLoadT<CoopA>(&hp[sg * 16u * PS + 16u * kk], PS);
            o0 = coopMultiplyAdd(pk, coopLoadT<CoopB>(&hkv[VOFF + 16u * kk * HK + 0u], HK), o0);
            o1 = coopMultiplyAdd(pk, coopLoadT<CoopB>(&hkv[VOFF + 16u * kk * HK + 16u], HK), o1);
            o2 = coopMultiplyAdd(pk, coopLoadT<CoopB>(&hkv[VOFF + 16u * kk * HK + 32u], HK), o2);
            o3 = coopMultiplyAdd(pk, coopLoadT<CoopB>(&hkv[VOFF + 16u * kk * HK + 48u], HK), o3);
            o4 = coopMultiplyAdd(pk, coopLoadT<CoopB>(&hkv[VOFF + 16u * kk * HK + 64u], HK), o4);
            o5 = coopMultiplyAdd(pk, coopLoadT<CoopB>(&hkv[VOFF + 16u * kk * HK + 80u], HK), o5);
            o6 = coopMultiplyAdd(pk, coopLoadT<CoopB>(&hkv[VOFF + 16u * kk * HK + 96u], HK), o6);
            o7 = coopMultiplyAdd(pk, coopLoadT<CoopB>(&hkv[VOFF + 16u * kk * HK + 112u], HK), o7);
        }
        workgroupBarrier(); // V and P read: the next tile may be stored
    }
    let row = r0 + li;
    var inv = 0.0;
    var lse = ninf;
    if (bad_row) {
        inv = nan_f32();
        lse = nan_f32();
    } else if (l > 0.0) {
        inv = 1.0 / l;
        lse = m + log(l);
    }
    if (row < p.tq && half == 0u) {
        f_lse[row * p.hq + h] = lse;
    }
    drain(o0, 0u, sgb, lane, row, h, inv);
    drain(o1, 1u, sgb, lane, row, h, inv);
    drain(o2, 2u, sgb, lane, row, h, inv);
    drain(o3, 3u, sgb, lane, row, h, inv);
    drain(o4, 4u, sgb, lane, row, h, inv);
    drain(o5, 5u, sgb, lane, row, h, inv);
    drain(o6, 6u, sgb, lane, row, h, inv);
    drain(o7, 7u, sgb, lane, row, h, inv);
}
