// attention_fwd_coop.wgsl: the forward on cooperative matrices (tensor cores on NVIDIA through
// VK_KHR_cooperative_matrix), after attention.wgsl, in its own module (the host puts `enable
// f16; enable wgpu_cooperative_matrix;` in front). Opt-in (`WgpuOptions::attn_coop`,
// `DFLASH_WGPU_ATTN_COOP=1`), like matmul_coop: q, k, v and the probabilities are ROUNDED TO
// F16 for the two products, which accumulate in f32; the softmax statistics, lse and out are
// f32. Head dims 65..=128 (DP 128), one pass (GPUs run one), subgroups of exactly 32 lanes.
//
// One workgroup of 4 subgroups (WG = 128) per (query tile of BQ = 64 rows, head); subgroup sg
// owns rows 16 sg .. 16 sg + 15 of the tile. Its query rows are 8 A matrices (16 x 16 f16,
// dims 16 d ..) held for the whole key list, its output 8 f32 accumulators o0..o7 (dims 16 n
// ..). Per key tile of BK = 32 keys, four barriers:
// 1. K and V staged as f16 (rows of HK halves);
// 2. S = Q K^T (two 16 x 16 accumulators, 8 k-steps each) stored to the subgroup's scratch;
// 3. each row's two lanes (lane / 2: the row, lane % 2: which 16 keys) mask and scale their
//    scores, take the row's max, and write P = exp(s - m) as f16; a row whose max passed its
//    reference by more than TAU votes for a rescale;
// 4. the vote, read uniformly (a barrier); only when it is set, every accumulator goes through
//    the scratch to have its rows scaled (the slow path, 3 barriers an accumulator);
//    then O += P V (two k-steps of 16 keys into the 8 accumulators), and a barrier before
//    the next staging.
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
// kernels (`NanCase::within_tiles`). Values past f16's range (65504) become infinities: the
// opt-in's limit, as matmul_coop's.
//
// Uniformity: naga requires the cooperative operations in workgroup-uniform control flow and
// takes any function's result for non-uniform, so the entry point computes its early return
// and list bounds inline (the bounds through workgroupUniformLoad), and the rescale vote is
// read with workgroupUniformLoad too.
//
// Alignment: every cooperative load and store starts at a multiple of 16 bytes with a stride
// that is one (HK = 136 halves = 272 bytes, PS = 40 halves = 80 bytes, BK = 32 f32 = 128
// bytes), as VK_KHR_cooperative_matrix asks. The Q tile (BQ x HK halves) is staged in the
// K/V area (2 BK x HK halves: BQ = 2 BK) before the key loop.

const HK: u32 = DP + 8u;
const VOFF: u32 = BK * HK;
const SS: u32 = 16u * BK;
const PS: u32 = BK + 8u;
const TAU: f32 = 10.0;

var<workgroup> hkv: array<f16, 2u * BK * HK>;
var<workgroup> hs: array<f32, 4u * SS>;
var<workgroup> hp: array<f16, 4u * 16u * PS>;
var<workgroup> vote: atomic<u32>;
var<workgroup> vote_u: u32;
// attention.wgsl's staging helpers name `buf`; this kernel does not reach them.
var<workgroup> buf: array<vec4<f32>, 1>;

@group(0) @binding(5) var<storage, read_write> f_out: array<f32>;
@group(0) @binding(6) var<storage, read_write> f_lse: array<f32>;

alias CoopA = coop_mat16x16<f16, A>;
alias CoopB = coop_mat16x16<f16, B>;
alias CoopC = coop_mat16x16<f32, C>;

// Four halves at hkv[at ..].
fn put4_hkv(at: u32, x: vec4<f32>) {
    let h = vec4<f16>(x);
    hkv[at] = h.x;
    hkv[at + 1u] = h.y;
    hkv[at + 2u] = h.z;
    hkv[at + 3u] = h.w;
}

// Query rows [r0, r0 + BQ) of head h into hkv as f16 rows of HK halves, zero past tq.
fn stage_q_coop(r0: u32, h: u32, lid: u32) {
    for (var n = 0u; n < BQ * DP4 / WG; n = n + 1u) {
        let e = lid + n * WG;
        let i = e / DP4;
        let c4 = e % DP4;
        var x = vec4<f32>(0.0);
        if (r0 + i < p.tq) {
            x = q_row4(((r0 + i) * p.hq + h) * p.d, c4);
        }
        put4_hkv(i * HK + 4u * c4, x);
    }
}

// Keys [k0, k0 + BK) of kv head kh: K at hkv[0 ..], V at hkv[VOFF ..], zero past tk.
fn stage_kv_coop(k0: u32, kh: u32, lid: u32) {
    for (var n = 0u; n < BK * DP4 / WG; n = n + 1u) {
        let e = lid + n * WG;
        let j = e / DP4;
        let c4 = e % DP4;
        var xk = vec4<f32>(0.0);
        var xv = vec4<f32>(0.0);
        if (k0 + j < p.tk) {
            let at = ((k0 + j) * p.hkv + kh) * p.d;
            xk = k_row4(at, c4);
            xv = v_row4(at, c4);
        }
        put4_hkv(j * HK + 4u * c4, xk);
        put4_hkv(VOFF + j * HK + 4u * c4, xv);
    }
}

// The subgroup's query rows at dims 16 d .. 16 d + 15 (the staged Q tile).
fn q_frag(sg: u32, d: u32) -> CoopA {
    return coopLoadT<CoopA>(&hkv[16u * sg * HK + 16u * d], HK);
}

// acc + Q (dims 16 d ..) times K^T for keys 16 b .. 16 b + 15 of the staged tile.
fn qk_step(q: CoopA, d: u32, b: u32, acc: CoopC) -> CoopC {
    return coopMultiplyAdd(q, coopLoad<CoopB>(&hkv[16u * b * HK + 16u * d], HK), acc);
}

// The subgroup's scores against keys 16 b .. 16 b + 15.
fn scores16(q0: CoopA, q1: CoopA, q2: CoopA, q3: CoopA, q4: CoopA, q5: CoopA, q6: CoopA,
            q7: CoopA, b: u32) -> CoopC {
    var s = CoopC();
    s = qk_step(q0, 0u, b, s);
    s = qk_step(q1, 1u, b, s);
    s = qk_step(q2, 2u, b, s);
    s = qk_step(q3, 3u, b, s);
    s = qk_step(q4, 4u, b, s);
    s = qk_step(q5, 5u, b, s);
    s = qk_step(q6, 6u, b, s);
    s = qk_step(q7, 7u, b, s);
    return s;
}

// acc + P (keys 16 kk ..) times V's dims 16 n .. 16 n + 15.
fn pv_step(pk: CoopA, kk: u32, n: u32, acc: CoopC) -> CoopC {
    return coopMultiplyAdd(pk, coopLoadT<CoopB>(&hkv[VOFF + 16u * kk * HK + 16u * n], HK), acc);
}

// Accumulator o's rows (the subgroup's 16) scaled by their lane pairs' `alpha`, through the
// subgroup's scratch: lane i2 = lane / 2 scales row i2, columns 8 (lane % 2) .. + 8.
fn rescaled(o: CoopC, sgb: u32, lane: u32, alpha: f32) -> CoopC {
    coopStoreT(o, &hs[sgb], BK);
    workgroupBarrier();
    let at = sgb + (lane / 2u) * BK + 8u * (lane % 2u);
    for (var c = 0u; c < 8u; c = c + 1u) {
        hs[at + c] = hs[at + c] * alpha;
    }
    workgroupBarrier();
    let r = coopLoadT<CoopC>(&hs[sgb], BK);
    workgroupBarrier();
    return r;
}

// Accumulator o (dims 16 n ..) of the subgroup's rows into out, divided by the row's sum
// (`inv`: 1 / l, or NaN for a NaN row, 0 for a row that saw no key); row `row` of the
// tensor, written where < tq and inside D.
fn drain_out(o: CoopC, n: u32, sgb: u32, lane: u32, row: u32, h: u32, inv: f32) {
    coopStoreT(o, &hs[sgb], BK);
    workgroupBarrier();
    let at = sgb + (lane / 2u) * BK + 8u * (lane % 2u);
    if (row < p.tq) {
        let base = (row * p.hq + h) * p.d;
        for (var c = 0u; c < 8u; c = c + 1u) {
            let dim = 16u * n + 8u * (lane % 2u) + c;
            if (dim < p.d) {
                // A row that saw no key is exactly 0 even where a non-finite value of a
                // tile it shares reached its accumulator (0 x NaN).
                var x = hs[at + c] * inv;
                if (is_nan_f32(inv) || inv == 0.0) {
                    x = inv;
                }
                f_out[base + dim] = x;
            }
        }
    }
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
    let sg = min(sg_in, 3u);
    let lane = lane_in & 31u;
    let tile = begin_q_tile(g, lid);
    let qt = tile.x;
    let h = tile.y;
    let kh = h / p.group;
    let r0 = qt * BQ;
    stage_q_coop(r0, h, lid);
    if (lid == 0u) {
        bounds[0] = tiles[qt];
        bounds[1] = tiles[qt + 1u];
    }
    let lo = workgroupUniformLoad(&bounds[0]);
    let hi = workgroupUniformLoad(&bounds[1]);
    let q0 = q_frag(sg, 0u);
    let q1 = q_frag(sg, 1u);
    let q2 = q_frag(sg, 2u);
    let q3 = q_frag(sg, 3u);
    let q4 = q_frag(sg, 4u);
    let q5 = q_frag(sg, 5u);
    let q6 = q_frag(sg, 6u);
    let q7 = q_frag(sg, 7u);
    workgroupBarrier(); // Q is read: K and V take its place
    var o0 = CoopC(); var o1 = CoopC(); var o2 = CoopC(); var o3 = CoopC();
    var o4 = CoopC(); var o5 = CoopC(); var o6 = CoopC(); var o7 = CoopC();
    // The lane's row of the tile (both lanes of a pair hold the same statistics).
    let li = 16u * sg + lane / 2u;
    let c0 = 16u * (lane % 2u);
    let sgb = sg * SS;
    let sgp = sg * 16u * PS;
    let ninf = neg_inf_f32();
    var m = ninf;
    var l = 0.0;
    var bad_row = false;
    for (var it = lo; it < hi; it = it + 1u) {
        let w = tiles[p.qlist_at + it];
        tile_full = (w & FULL) != 0u;
        let k0 = (w & ~FULL) * BK;
        if (lid == 0u) {
            atomicStore(&vote, 0u);
        }
        stage_kv_coop(k0, kh, lid);
        workgroupBarrier(); // K, V staged (and, the first time, row_iv loaded)
        coopStoreT(scores16(q0, q1, q2, q3, q4, q5, q6, q7, 0u), &hs[sgb], BK);
        coopStoreT(scores16(q0, q1, q2, q3, q4, q5, q6, q7, 1u), &hs[sgb + 16u], BK);
        workgroupBarrier(); // S in the scratch
        // The lane's 16 scores: scaled where visible, -inf elsewhere; NaN and +inf flag the
        // row and count as -inf here.
        let at = sgb + (lane / 2u) * BK + c0;
        var mx = ninf;
        for (var j = 0u; j < 16u; j = j + 1u) {
            var s = ninf;
            if (visible(li, k0 + c0 + j)) {
                s = p.scale * hs[at + j];
            }
            if (poisons(s)) {
                bad_row = true;
                s = ninf;
            }
            hs[at + j] = s;
            mx = max(mx, s);
        }
        mx = max(mx, subgroupShuffleXor(mx, 1u));
        bad_row = bad_row || (subgroupShuffleXor(select(0u, 1u, bad_row), 1u) != 0u);
        // The row's reference max and the factor its O and l take (1: no rescale).
        var alpha = 1.0;
        if (m == ninf) {
            m = mx;
        } else if (mx > m + TAU) {
            alpha = exp(m - mx);
            m = mx;
            atomicOr(&vote, 1u);
        }
        var sum = 0.0;
        let pat = sgp + (lane / 2u) * PS + c0;
        for (var j = 0u; j < 16u; j = j + 1u) {
            let s = hs[at + j];
            var e = 0.0;
            if (s != ninf) {
                e = exp(s - m);
            }
            let e16 = f16(e);
            hp[pat + j] = e16;
            sum = sum + f32(e16);
        }
        sum = sum + subgroupShuffleXor(sum, 1u);
        l = l * alpha + sum;
        workgroupBarrier(); // every vote cast, P written
        if (lid == 0u) {
            vote_u = atomicLoad(&vote);
        }
        if (workgroupUniformLoad(&vote_u) != 0u) {
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
            let pk = coopLoadT<CoopA>(&hp[sgp + 16u * kk], PS);
            o0 = pv_step(pk, kk, 0u, o0);
            o1 = pv_step(pk, kk, 1u, o1);
            o2 = pv_step(pk, kk, 2u, o2);
            o3 = pv_step(pk, kk, 3u, o3);
            o4 = pv_step(pk, kk, 4u, o4);
            o5 = pv_step(pk, kk, 5u, o5);
            o6 = pv_step(pk, kk, 6u, o6);
            o7 = pv_step(pk, kk, 7u, o7);
        }
        workgroupBarrier(); // V and P read: the next tile may stage
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
    if (row < p.tq && lane % 2u == 0u) {
        f_lse[row * p.hq + h] = lse;
    }
    drain_out(o0, 0u, sgb, lane, row, h, inv);
    drain_out(o1, 1u, sgb, lane, row, h, inv);
    drain_out(o2, 2u, sgb, lane, row, h, inv);
    drain_out(o3, 3u, sgb, lane, row, h, inv);
    drain_out(o4, 4u, sgb, lane, row, h, inv);
    drain_out(o5, 5u, sgb, lane, row, h, inv);
    drain_out(o6, 6u, sgb, lane, row, h, inv);
    drain_out(o7, 7u, sgb, lane, row, h, inv);
}
