// attention_fwd.wgsl: the forward (after attention.wgsl), one workgroup of WG threads per
// (query tile of BQ rows, head), built as two GEMMs per key tile with the structure of
// gemm.wgsl's matmul128 (which reaches 22-29 TFLOP/s on the H200 through Vulkan):
//
// - Scores S = Q K^T of the BQ x BK tile (BK = DP / 2) in DP / DC steps of DC dims; each step
//   stages Q^T and K^T dim-major ([dim][row], vec4 of 4 rows / keys), so a thread's 8 rows x
//   4 keys take 3 vec4 workgroup loads per 32 FMAs (the 4 x 2 dot-product block before: 6
//   per 32). Q is restaged each key tile (L1 / L2 hits) so the 48 KiB hold 64 x 64 tiles.
// - O += P V in BK / KC steps of KC keys; a thread owns 8 rows x 8 dims (16 vec4): 4 vec4
//   loads per 64 FMAs (3 per 32 before).
// - Every step is double-buffered: the next step's global loads (the next key tile's first
//   Q / K chunk after the last V step) go into registers before this step's FMAs and into
//   the other buffer after them, one barrier per step; the online softmax between the two
//   GEMMs takes three more.
//
// Thread lid: kx = lid % KX (keys 4 kx .. 4 kx + 3 of the scores, dims 4 kx .. and DP / 2 +
// 4 kx .. of the output), ry = lid / KX (rows 8 ry .. 8 ry + 7 of both); WG = (BQ / 8) KX.
// The row statistics (m, l, NaN seen) live in workgroup memory, each row updated by one
// thread (rows lid, lid + WG, ...) in a fixed order: deterministic, no float atomics.

const KX: u32 = BK / 4u;
const QV: u32 = BQ / 4u;
// P is key-major, BK rows of PS vec4 (4 query rows' weights each); PS odd.
const PS: u32 = QV + 1u;
const NSC: u32 = DP / DC;
const NPV: u32 = BK / KC;
const NST: u32 = NSC + NPV;
// Staged vec4 per step: Q^T + K^T chunk (score step) or KC rows of V (accumulation step).
const USC: u32 = DC * (BQ + BK) / 4u;
const UPV: u32 = KC * DP4;
// SLOT = max(USC, UPV) and NU = ceil(SLOT / WG) <= 4 (the prefetch registers f0 .. f3)
// come from the host with DC and KC.
const KT: u32 = DC * QV; // K^T after Q^T in a score slot

var<workgroup> buf: array<vec4<f32>, BK * PS>; // P (attention.wgsl's helpers name it buf)
var<workgroup> stg: array<vec4<f32>, 2u * SLOT>;
// Per-thread partial row maxima, then sums: [kx][row], vec4 of 4 rows.
var<workgroup> stat: array<vec4<f32>, KX * QV>;
// Per row: running max, this tile's alpha (at the end: the sum, NaN for a NaN row), sum,
// NaN seen (0 / 1).
var<workgroup> row_m: array<vec4<f32>, QV>;
var<workgroup> row_a: array<vec4<f32>, QV>;
var<workgroup> row_l: array<vec4<f32>, QV>;
var<workgroup> row_n: array<vec4<f32>, QV>;
// Non-finite flags of staged V chunks, in rotation: the chunk stored in a step, the one read
// in it, and the one reset in it are three different slots.
var<workgroup> vbad: array<atomic<u32>, 3>;

@group(0) @binding(5) var<storage, read_write> f_out: array<f32>;
@group(0) @binding(6) var<storage, read_write> f_lse: array<f32>;
@group(0) @binding(7) var<storage, read_write> f_state: array<f32>; // (m, l, nan) per row

// The tile a workgroup works on, and the V chunks stored / read so far (the flag rotation).
var<private> w_r0: u32;
var<private> w_h: u32;
var<private> w_kh: u32;
var<private> v_put: u32;
var<private> v_get: u32;

struct Pre {
    f0: vec4<f32>, f1: vec4<f32>, f2: vec4<f32>, f3: vec4<f32>,
}

// Staged unit u (one vec4) of step s of the key tile at k0, from global memory.
fn unit_get(s: u32, u: u32, k0: u32) -> vec4<f32> {
    let z = vec4<f32>(0.0);
    if (s < NSC) {
        // Q rows fastest: a warp's transposed stores hit 32 banks.
        if (u < BQ * DC / 4u) {
            let row = u % BQ;
            if (w_r0 + row >= p.tq) {
                return z;
            }
            return row4(0u, ((w_r0 + row) * p.hq + w_h) * p.d, s * (DC / 4u) + u / BQ);
        }
        let x = u - BQ * DC / 4u;
        let key = x % BK;
        if (x >= BK * DC / 4u || k0 + key >= p.tk) {
            return z;
        }
        return row4(1u, ((k0 + key) * p.hkv + w_kh) * p.d, s * (DC / 4u) + x / BK);
    }
    let j = (s - NSC) * KC + u / DP4;
    if (u >= UPV || k0 + j >= p.tk) {
        return z;
    }
    return row4(2u, ((k0 + j) * p.hkv + w_kh) * p.d, u % DP4);
}

// Scalar x into row `row`, component `e` of a dim-major tile at `at` (vec4 rows of `n`).
fn put_t(at: u32, n: u32, c: u32, row: u32, x: f32) {
    stg[at + c * n + row / 4u][row % 4u] = x;
}

fn unit_put(slot: u32, s: u32, u: u32, x: vec4<f32>) {
    let base = slot * SLOT;
    if (s < NSC) {
        if (u < BQ * DC / 4u) {
            let c = 4u * (u / BQ);
            let row = u % BQ;
            put_t(base, QV, c, row, x.x);
            put_t(base, QV, c + 1u, row, x.y);
            put_t(base, QV, c + 2u, row, x.z);
            put_t(base, QV, c + 3u, row, x.w);
        } else if (u < USC) {
            let y = u - BQ * DC / 4u;
            let c = 4u * (y / BK);
            let key = y % BK;
            put_t(base + KT, KX, c, key, x.x);
            put_t(base + KT, KX, c + 1u, key, x.y);
            put_t(base + KT, KX, c + 2u, key, x.z);
            put_t(base + KT, KX, c + 3u, key, x.w);
        }
    } else if (u < UPV) {
        stg[base + u] = x; // [key][DP4], the row layout of V
    }
}

// The loads of step s (unrolled into named registers: no private arrays).
fn fetch(s: u32, k0: u32, lid: u32) -> Pre {
    let z = vec4<f32>(0.0);
    var f = Pre(z, z, z, z);
    f.f0 = unit_get(s, lid, k0);
    if (NU > 1u) { f.f1 = unit_get(s, lid + WG, k0); }
    if (NU > 2u) { f.f2 = unit_get(s, lid + 2u * WG, k0); }
    if (NU > 3u) { f.f3 = unit_get(s, lid + 3u * WG, k0); }
    return f;
}

// Stores step s's loads into `slot`; a V chunk holding a non-finite value is flagged.
fn store(slot: u32, s: u32, f: Pre, lid: u32) {
    unit_put(slot, s, lid, f.f0);
    if (NU > 1u) { unit_put(slot, s, lid + WG, f.f1); }
    if (NU > 2u) { unit_put(slot, s, lid + 2u * WG, f.f2); }
    if (NU > 3u) { unit_put(slot, s, lid + 3u * WG, f.f3); }
    if (s >= NSC) {
        if (lid == 0u) {
            atomicStore(&vbad[(v_put + 1u) % 3u], 0u);
        }
        let seen = nonfinite4(f.f0) || nonfinite4(f.f1) || nonfinite4(f.f2)
            || nonfinite4(f.f3);
        if (seen) {
            atomicOr(&vbad[v_put % 3u], 1u);
        }
        v_put = v_put + 1u;
    }
}

// Scores, rows 8 ry + i (field i) x keys 4 kx .. 4 kx + 3.
struct SC8 {
    s0: vec4<f32>, s1: vec4<f32>, s2: vec4<f32>, s3: vec4<f32>,
    s4: vec4<f32>, s5: vec4<f32>, s6: vec4<f32>, s7: vec4<f32>,
}

fn score_step(t: SC8, slot: u32, ry: u32, kx: u32) -> SC8 {
    var r = t;
    let base = slot * SLOT;
    for (var c = 0u; c < DC; c = c + 1u) {
        let a0 = stg[base + c * QV + 2u * ry];
        let a1 = stg[base + c * QV + 2u * ry + 1u];
        let b = stg[base + KT + c * KX + kx];
        r.s0 = fma(vec4<f32>(a0.x), b, r.s0); r.s1 = fma(vec4<f32>(a0.y), b, r.s1);
        r.s2 = fma(vec4<f32>(a0.z), b, r.s2); r.s3 = fma(vec4<f32>(a0.w), b, r.s3);
        r.s4 = fma(vec4<f32>(a1.x), b, r.s4); r.s5 = fma(vec4<f32>(a1.y), b, r.s5);
        r.s6 = fma(vec4<f32>(a1.z), b, r.s6); r.s7 = fma(vec4<f32>(a1.w), b, r.s7);
    }
    return r;
}

// Output rows 8 ry + i: dims 4 kx .. (a_i) and DP / 2 + 4 kx .. (b_i).
struct O16 {
    a0: vec4<f32>, a1: vec4<f32>, a2: vec4<f32>, a3: vec4<f32>,
    a4: vec4<f32>, a5: vec4<f32>, a6: vec4<f32>, a7: vec4<f32>,
    b0: vec4<f32>, b1: vec4<f32>, b2: vec4<f32>, b3: vec4<f32>,
    b4: vec4<f32>, b5: vec4<f32>, b6: vec4<f32>, b7: vec4<f32>,
}

fn o_scale(o: O16, x: vec4<f32>, y: vec4<f32>) -> O16 {
    return O16(o.a0 * x.x, o.a1 * x.y, o.a2 * x.z, o.a3 * x.w,
               o.a4 * y.x, o.a5 * y.y, o.a6 * y.z, o.a7 * y.w,
               o.b0 * x.x, o.b1 * x.y, o.b2 * x.z, o.b3 * x.w,
               o.b4 * y.x, o.b5 * y.y, o.b6 * y.z, o.b7 * y.w);
}

// w * t, except 0 where the weight is +-0 (careful path: t may be non-finite).
fn wt(w: f32, t: vec4<f32>) -> vec4<f32> {
    return select(vec4<f32>(0.0), w * t, nonzero(w));
}

// O += P V over the KC keys of V chunk v (staged in `slot`); the careful loop (the chunk
// holds a non-finite value) is a separate loop so that the fast one has no branch.
fn pv_step(o: O16, slot: u32, v: u32, ry: u32, kx: u32, careful: bool) -> O16 {
    var r = o;
    let base = slot * SLOT;
    if (!careful) {
        for (var jj = 0u; jj < KC; jj = jj + 1u) {
            let j = v * KC + jj;
            let x = buf[j * PS + 2u * ry];
            let y = buf[j * PS + 2u * ry + 1u];
            let u = stg[base + jj * DP4 + kx];
            let z = stg[base + jj * DP4 + DP8 + kx];
            r.a0 = fma(vec4<f32>(x.x), u, r.a0); r.b0 = fma(vec4<f32>(x.x), z, r.b0);
            r.a1 = fma(vec4<f32>(x.y), u, r.a1); r.b1 = fma(vec4<f32>(x.y), z, r.b1);
            r.a2 = fma(vec4<f32>(x.z), u, r.a2); r.b2 = fma(vec4<f32>(x.z), z, r.b2);
            r.a3 = fma(vec4<f32>(x.w), u, r.a3); r.b3 = fma(vec4<f32>(x.w), z, r.b3);
            r.a4 = fma(vec4<f32>(y.x), u, r.a4); r.b4 = fma(vec4<f32>(y.x), z, r.b4);
            r.a5 = fma(vec4<f32>(y.y), u, r.a5); r.b5 = fma(vec4<f32>(y.y), z, r.b5);
            r.a6 = fma(vec4<f32>(y.z), u, r.a6); r.b6 = fma(vec4<f32>(y.z), z, r.b6);
            r.a7 = fma(vec4<f32>(y.w), u, r.a7); r.b7 = fma(vec4<f32>(y.w), z, r.b7);
        }
        return r;
    }
    for (var jj = 0u; jj < KC; jj = jj + 1u) {
        let j = v * KC + jj;
        let x = buf[j * PS + 2u * ry];
        let y = buf[j * PS + 2u * ry + 1u];
        let u = stg[base + jj * DP4 + kx];
        let z = stg[base + jj * DP4 + DP8 + kx];
        r.a0 = r.a0 + wt(x.x, u); r.b0 = r.b0 + wt(x.x, z);
        r.a1 = r.a1 + wt(x.y, u); r.b1 = r.b1 + wt(x.y, z);
        r.a2 = r.a2 + wt(x.z, u); r.b2 = r.b2 + wt(x.z, z);
        r.a3 = r.a3 + wt(x.w, u); r.b3 = r.b3 + wt(x.w, z);
        r.a4 = r.a4 + wt(y.x, u); r.b4 = r.b4 + wt(y.x, z);
        r.a5 = r.a5 + wt(y.y, u); r.b5 = r.b5 + wt(y.y, z);
        r.a6 = r.a6 + wt(y.z, u); r.b6 = r.b6 + wt(y.z, z);
        r.a7 = r.a7 + wt(y.w, u); r.b7 = r.b7 + wt(y.w, z);
    }
    return r;
}

// Scaled scores of row i (tile row) at keys key .. key + 3, -inf where not visible.
fn masked(x: vec4<f32>, i: u32, key: u32) -> vec4<f32> {
    let n = neg_inf_f32();
    return vec4<f32>(select(n, p.scale * x.x, visible(i, key)),
                     select(n, p.scale * x.y, visible(i, key + 1u)),
                     select(n, p.scale * x.z, visible(i, key + 2u)),
                     select(n, p.scale * x.w, visible(i, key + 3u)));
}

// The max of 4 masked scores; NaN when one of them poisons the row.
fn pmax(x: vec4<f32>) -> f32 {
    if (poisons(x.x) || poisons(x.y) || poisons(x.z) || poisons(x.w)) {
        return nan_f32();
    }
    return max(max(x.x, x.y), max(x.z, x.w));
}

fn pr1(s: f32, m: f32) -> f32 {
    if (s == neg_inf_f32() || poisons(s)) {
        return 0.0;
    }
    return exp(s - m);
}

fn probs(x: vec4<f32>, m: f32) -> vec4<f32> {
    return vec4<f32>(pr1(x.x, m), pr1(x.y, m), pr1(x.z, m), pr1(x.w, m));
}

// out row r (< tq) of head h at the thread's dims.
fn put_out(r: u32, h: u32, cx: u32, a: vec4<f32>, b: vec4<f32>) {
    let at = (r * p.hq + h) * p.d;
    for (var e = 0u; e < 4u; e = e + 1u) {
        let c = 4u * cx + e;
        if (c < p.d) {
            f_out[at + c] = a[e];
        }
        if (c + DP / 2u < p.d) {
            f_out[at + c + DP / 2u] = b[e];
        }
    }
}

fn get_out(r: u32, h: u32, cx: u32) -> array<vec4<f32>, 2> {
    var a = vec4<f32>(0.0);
    var b = vec4<f32>(0.0);
    let at = (min(r, p.tq - 1u) * p.hq + h) * p.d;
    for (var e = 0u; e < 4u; e = e + 1u) {
        let c = 4u * cx + e;
        if (c < p.d) {
            a[e] = f_out[at + c];
        }
        if (c + DP / 2u < p.d) {
            b[e] = f_out[at + c + DP / 2u];
        }
    }
    return array<vec4<f32>, 2>(a, b);
}

fn o_row(o: O16, i: u32) -> array<vec4<f32>, 2> {
    switch (i) {
        case 0u: { return array<vec4<f32>, 2>(o.a0, o.b0); }
        case 1u: { return array<vec4<f32>, 2>(o.a1, o.b1); }
        case 2u: { return array<vec4<f32>, 2>(o.a2, o.b2); }
        case 3u: { return array<vec4<f32>, 2>(o.a3, o.b3); }
        case 4u: { return array<vec4<f32>, 2>(o.a4, o.b4); }
        case 5u: { return array<vec4<f32>, 2>(o.a5, o.b5); }
        case 6u: { return array<vec4<f32>, 2>(o.a6, o.b6); }
        default: { return array<vec4<f32>, 2>(o.a7, o.b7); }
    }
}

// The pass's earlier state: out (unnormalised) of the thread's 8 rows.
fn o_load(r0: u32, h: u32, kx: u32) -> O16 {
    let x0 = get_out(r0, h, kx); let x1 = get_out(r0 + 1u, h, kx);
    let x2 = get_out(r0 + 2u, h, kx); let x3 = get_out(r0 + 3u, h, kx);
    let x4 = get_out(r0 + 4u, h, kx); let x5 = get_out(r0 + 5u, h, kx);
    let x6 = get_out(r0 + 6u, h, kx); let x7 = get_out(r0 + 7u, h, kx);
    return O16(x0[0], x1[0], x2[0], x3[0], x4[0], x5[0], x6[0], x7[0],
               x0[1], x1[1], x2[1], x3[1], x4[1], x5[1], x6[1], x7[1]);
}

@compute @workgroup_size(WG)
fn attn_fwd(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let nqt = (p.tq + BQ - 1u) / BQ;
    let g = wg_linear(wid, nwg);
    if (g >= nqt * p.hq) {
        return;
    }
    let qt = g / p.hq;
    w_h = g % p.hq;
    w_kh = w_h / p.group;
    w_r0 = qt * BQ;
    tile_r0 = w_r0;
    v_put = 0u;
    v_get = 0u;
    let h = w_h;
    let r0 = w_r0;
    load_intervals(r0, lid);
    let first = (p.flags & FIRST) != 0u;
    let last = (p.flags & LAST) != 0u;
    let kx = lid % KX;
    let ry = lid / KX;
    if (lid < 3u) {
        atomicStore(&vbad[lid], 0u);
    }
    // Row state: fresh, or the previous pass's.
    for (var r = lid; r < BQ; r = r + WG) {
        var m = neg_inf_f32();
        var l = 0.0;
        var n = 0.0;
        if (!first) {
            let at = 3u * (min(r0 + r, p.tq - 1u) * p.hq + h);
            m = f_state[at];
            l = f_state[at + 1u];
            n = f_state[at + 2u];
        }
        row_m[r / 4u][r % 4u] = m;
        row_l[r / 4u][r % 4u] = l;
        row_n[r / 4u][r % 4u] = n;
    }
    let z = vec4<f32>(0.0);
    var o = O16(z, z, z, z, z, z, z, z, z, z, z, z, z, z, z, z);
    if (!first) {
        o = o_load(r0 + 8u * ry, h, kx);
    }
    let lb = list_bounds(0u, qt, lid);
    let span = pass_range(lb.x, lb.y);
    // The first tile's first step, then each step stages the next one (across tiles).
    if (span.x < span.y) {
        let k0 = (tiles[p.qlist_at + span.x] & ~FULL) * BK;
        store(0u, 0u, fetch(0u, k0, lid), lid);
    }
    workgroupBarrier();
    var cur = 0u;
    for (var it = span.x; it < span.y; it = it + 1u) {
        let w = tiles[p.qlist_at + it];
        tile_full = (w & FULL) != 0u;
        let k0 = (w & ~FULL) * BK;
        let more = it + 1u < span.y;
        var nk0 = 0u;
        if (more) {
            nk0 = (tiles[p.qlist_at + it + 1u] & ~FULL) * BK;
        }
        var t = SC8(z, z, z, z, z, z, z, z);
        for (var s = 0u; s < NST; s = s + 1u) {
            let wrap = s + 1u == NST;
            let ns = select(s + 1u, 0u, wrap);
            let go = !wrap || more;
            var f = Pre(z, z, z, z);
            if (go) {
                f = fetch(ns, select(k0, nk0, wrap), lid);
            }
            if (s < NSC) {
                t = score_step(t, cur, ry, kx);
            } else {
                let careful = atomicLoad(&vbad[v_get % 3u]) != 0u;
                v_get = v_get + 1u;
                o = pv_step(o, cur, s - NSC, ry, kx, careful);
            }
            if (go) {
                store(1u - cur, ns, f, lid);
            }
            workgroupBarrier();
            cur = 1u - cur;
            if (s + 1u == NSC) {
                // The online softmax. 1: scale and mask; each thread's partial row maxima
                // over its 4 keys (NaN: a score poisons the row).
                let key = k0 + 4u * kx;
                let i0 = 8u * ry;
                t = SC8(masked(t.s0, i0, key), masked(t.s1, i0 + 1u, key),
                       masked(t.s2, i0 + 2u, key), masked(t.s3, i0 + 3u, key),
                       masked(t.s4, i0 + 4u, key), masked(t.s5, i0 + 5u, key),
                       masked(t.s6, i0 + 6u, key), masked(t.s7, i0 + 7u, key));
                stat[kx * QV + 2u * ry] = vec4<f32>(pmax(t.s0), pmax(t.s1), pmax(t.s2),
                                                    pmax(t.s3));
                stat[kx * QV + 2u * ry + 1u] = vec4<f32>(pmax(t.s4), pmax(t.s5),
                                                         pmax(t.s6), pmax(t.s7));
                workgroupBarrier();
                // 2: each row's new max and alpha, the partials in kx order.
                for (var r = lid; r < BQ; r = r + WG) {
                    let m = row_m[r / 4u][r % 4u];
                    var cm = neg_inf_f32();
                    var bad = row_n[r / 4u][r % 4u] != 0.0;
                    for (var x = 0u; x < KX; x = x + 1u) {
                        let v = stat[x * QV + r / 4u][r % 4u];
                        if (is_nan_f32(v)) {
                            bad = true;
                        } else if (v > cm) {
                            cm = v;
                        }
                    }
                    let m_new = select(m, cm, cm > m);
                    var alpha = 0.0;
                    if (m != neg_inf_f32()) {
                        alpha = exp(m - m_new);
                    }
                    row_m[r / 4u][r % 4u] = m_new;
                    row_a[r / 4u][r % 4u] = alpha;
                    row_n[r / 4u][r % 4u] = select(0.0, 1.0, bad);
                }
                workgroupBarrier();
                // 3: probabilities into P (key-major), partial row sums, O scaled by alpha.
                let m0 = row_m[2u * ry];
                let m1 = row_m[2u * ry + 1u];
                let p0 = probs(t.s0, m0.x); let p1 = probs(t.s1, m0.y);
                let p2 = probs(t.s2, m0.z); let p3 = probs(t.s3, m0.w);
                let p4 = probs(t.s4, m1.x); let p5 = probs(t.s5, m1.y);
                let p6 = probs(t.s6, m1.z); let p7 = probs(t.s7, m1.w);
                let j = 4u * kx * PS + 2u * ry;
                buf[j] = vec4<f32>(p0.x, p1.x, p2.x, p3.x);
                buf[j + 1u] = vec4<f32>(p4.x, p5.x, p6.x, p7.x);
                buf[j + PS] = vec4<f32>(p0.y, p1.y, p2.y, p3.y);
                buf[j + PS + 1u] = vec4<f32>(p4.y, p5.y, p6.y, p7.y);
                buf[j + 2u * PS] = vec4<f32>(p0.z, p1.z, p2.z, p3.z);
                buf[j + 2u * PS + 1u] = vec4<f32>(p4.z, p5.z, p6.z, p7.z);
                buf[j + 3u * PS] = vec4<f32>(p0.w, p1.w, p2.w, p3.w);
                buf[j + 3u * PS + 1u] = vec4<f32>(p4.w, p5.w, p6.w, p7.w);
                stat[kx * QV + 2u * ry] = vec4<f32>(hsum(p0), hsum(p1), hsum(p2), hsum(p3));
                stat[kx * QV + 2u * ry + 1u] = vec4<f32>(hsum(p4), hsum(p5), hsum(p6),
                                                         hsum(p7));
                o = o_scale(o, row_a[2u * ry], row_a[2u * ry + 1u]);
                workgroupBarrier();
                // 4: each row's sum, the partials in kx order (stat is next written after
                // the accumulation steps' barriers).
                for (var r = lid; r < BQ; r = r + WG) {
                    var sum = 0.0;
                    for (var x = 0u; x < KX; x = x + 1u) {
                        sum = sum + stat[x * QV + r / 4u][r % 4u];
                    }
                    let l = row_l[r / 4u][r % 4u];
                    row_l[r / 4u][r % 4u] = l * row_a[r / 4u][r % 4u] + sum;
                }
            }
        }
    }
    // The rows' state or lse; row_a becomes each row's divisor (NaN: the row is NaN).
    for (var r = lid; r < BQ; r = r + WG) {
        let m = row_m[r / 4u][r % 4u];
        let l = row_l[r / 4u][r % 4u];
        let bad = row_n[r / 4u][r % 4u] != 0.0;
        if (r0 + r < p.tq) {
            if (!last) {
                let at = 3u * ((r0 + r) * p.hq + h);
                f_state[at] = m;
                f_state[at + 1u] = l;
                f_state[at + 2u] = select(0.0, 1.0, bad);
            } else {
                var lse = neg_inf_f32();
                if (bad) {
                    lse = nan_f32();
                } else if (l > 0.0) {
                    lse = m + log(l);
                }
                f_lse[(r0 + r) * p.hq + h] = lse;
            }
        }
        row_a[r / 4u][r % 4u] = select(l, nan_f32(), bad);
    }
    workgroupBarrier();
    let l0 = row_a[2u * ry];
    let l1 = row_a[2u * ry + 1u];
    for (var i = 0u; i < 8u; i = i + 1u) {
        let row = r0 + 8u * ry + i;
        if (row >= p.tq) {
            break;
        }
        let x = o_row(o, i);
        if (!last) {
            // Not the last pass: keep the unnormalised accumulators.
            put_out(row, h, kx, x[0], x[1]);
        } else {
            let lv = select(l1[i % 4u], l0[i % 4u], i < 4u);
            var a = vec4<f32>(0.0);
            var b = vec4<f32>(0.0);
            if (is_nan_f32(lv)) {
                a = vec4<f32>(nan_f32());
                b = a;
            } else if (lv > 0.0) {
                a = x[0] / lv;
                b = x[1] / lv;
            }
            put_out(row, h, kx, a, b);
        }
    }
}
