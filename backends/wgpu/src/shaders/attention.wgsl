// attention.wgsl: block-sparse attention over the compact mask, FlashAttention-2 style, f32.
//
// Layouts: q, out, d_out, dq (Tq, Hq, D); k, v, dk, dv (Tk, Hkv, D); lse (Tq, Hq); query head
// h reads kv head h / group. Work is a list of visible tiles built on the host (TileMap): a
// workgroup of 128 threads owns one (query tile, head) in the forward and dq kernels, one
// (key tile, kv head) in the dk/dv kernel, and visits only the tiles its list names. Inside a
// tile each (row, key) pair is checked against the row's two key intervals.
//
// Tiles: BQ rows x BK keys with BQ * D <= 2048 and BK * D <= 2048 (runtime sizes, fixed
// buffers): 31 KiB of workgroup memory. For the accumulators thread t owns row (or key)
// t / per and the dims t % per + per * c, c < 16, where per = 128 / BQ (or 128 / BK).
//
// Bank conflicts: workgroup memory has 32 banks of one word (NVIDIA; AMD 32 or 64), word w in
// bank w % 32. In the score loops consecutive threads take consecutive keys j and read
// row j of a tile, column c: with rows D words apart (D a multiple of 32 for the usual head
// dims) every thread of a warp hits one bank, a 16- to 32-way conflict on each load of the
// innermost loop. So staged tiles use an odd row stride, D | 1 (tile_stride): rows j and j'
// then start in different banks for any 32 consecutive j (an odd stride is invertible mod
// any power of two), and reading column c of 32 rows is conflict-free. The scores use the
// odd row stride BK | 1 (score_stride) for the same reason: the accumulation loops of the
// forward and dq read one score of each of 32 / per rows at once.
//
// The forward's online-softmax update is split over all 128 threads (per threads a row, a
// workgroup-memory reduction of their partial max and sum), not left to BQ of them; the
// accumulation loops run over keys (or rows) outside and the 16 dims inside (constant bound:
// unrollable, the accumulators can stay in registers; each score read once).
//
// NaN policy: a visible score that is NaN (or +inf) makes its row's out, lse and dq NaN, and
// its key's dk/dv NaN; products with a zero probability are skipped (select), so a NaN key
// never reaches rows that do not see it. Rows that see no key: out 0, lse -inf.
//
// Passes: see pass_range.
//
// tiles (u32): [q_off: nqt + 1][q_list][k_off: nkt + 1][k_list][ivs: 4 per query row, i32]
// q_list: the key tiles of each query tile; k_list: the query tiles of each key tile.

struct AttnParams {
    tq: u32, tk: u32, hq: u32, hkv: u32,
    d: u32, bq: u32, bk: u32, group: u32,
    scale: f32, qlist_at: u32, koff_at: u32, klist_at: u32,
    ivs_at: u32, w_first: u32, w_count: u32, flags: u32,
}

// A kernel's tile loop may be split over several dispatches (passes): this pass runs list
// iterations [w_first, w_first + w_count); state (softmax rows, accumulators) is carried in
// buffers between passes. Software rasterisers cap the loop iterations one invocation may run
// (llvmpipe: 65535 in all), so the host splits long lists there; GPUs run one pass.
const FIRST: u32 = 1u;
const LAST: u32 = 2u;

// Saturating: `lo + w_count` may not fit a u32 (a GPU's one pass sends the whole list
// length, but lo is where this tile's list starts in the concatenated lists).
fn pass_range(lo: u32, hi: u32) -> vec2<u32> {
    let a = lo + min(p.w_first, hi - lo);
    return vec2<u32>(a, a + min(p.w_count, hi - a));
}
@group(0) @binding(0) var<uniform> p: AttnParams;

const THREADS: u32 = 128u;
// A staged tile: BQ or BK rows (at most 64) at stride D | 1 <= D + 1, so at most
// 2048 + 64 words.
const TILE: u32 = 2112u;
// The scores: BQ rows at stride BK + 1, BQ * BK <= 1024, BQ <= 64.
const PAIRS: u32 = 1088u;
const ACC: u32 = 16u;        // accumulator dims per thread

// Three tiles in one array (naga passes no workgroup pointers to functions): X, Y, Z at
// these offsets.
var<workgroup> buf: array<f32, 6336>;
const XS: u32 = 0u;
const YS: u32 = 2112u;
const ZS: u32 = 4224u;
var<workgroup> sc: array<f32, PAIRS>;
// dq and dk/dv: the lse (stat_m) and dsum (stat_s) of each query row of the tile. The
// forward: each thread's partial max (stat_m) and partial sum (stat_s) of its share of its
// row's scores (one entry per thread), reduced over the row's threads.
var<workgroup> stat_m: array<f32, THREADS>;
var<workgroup> stat_s: array<f32, THREADS>;
var<workgroup> row_iv: array<i32, 256>;
var<workgroup> bounds: array<u32, 2>;

// Row stride of a staged tile (odd: see Bank conflicts); an even D's pad column is unused.
fn tile_stride() -> u32 {
    return p.d | 1u;
}

// Row stride of the scores (BK is a power of two, so BK + 1 for BK > 1: odd).
fn score_stride() -> u32 {
    return p.bk | 1u;
}

// Every kernel binds these four first.
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
@group(0) @binding(4) var<storage, read> tiles: array<u32>;

fn visible(r: u32, key: u32) -> bool {
    let kk = i32(key);
    let iv = r * 4u;
    return (kk >= row_iv[iv] && kk < row_iv[iv + 1u])
        || (kk >= row_iv[iv + 2u] && kk < row_iv[iv + 3u]);
}

// Whether x is not +-0, on the bits (a NaN counts as nonzero: float `!=` may be ordered).
fn nonzero(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) != 0u;
}

// exp(s - lse) that stays NaN when either is NaN (exp of NaN is not pinned down).
fn prob(s: f32, lse: f32) -> f32 {
    if (is_nan_f32(s) || is_nan_f32(lse)) {
        return nan_f32();
    }
    return exp(s - lse);
}

// A score that makes its row NaN: NaN itself, or +inf (inf - inf in the softmax).
fn poisons(s: f32) -> bool {
    return is_nan_f32(s) || (!is_finite_f32(s) && s > 0.0);
}

// Query rows [r0, r0 + BQ) of head `head` into a tile, zero past tq.
fn load_q(dst: u32, r0: u32, head: u32, lid: u32) {
    let st = tile_stride();
    for (var e = lid; e < p.bq * p.d; e = e + THREADS) {
        let i = e / p.d;
        let c = e % p.d;
        let r = r0 + i;
        var x = 0.0;
        if (r < p.tq) {
            x = q[(r * p.hq + head) * p.d + c];
        }
        buf[dst + i * st + c] = x;
    }
}

// Keys [k0, k0 + BK) of kv head kh of k (which 0) or v (which 1) into a tile, zero past tk.
fn load_kv(which: u32, dst: u32, k0: u32, kh: u32, lid: u32) {
    let st = tile_stride();
    for (var e = lid; e < p.bk * p.d; e = e + THREADS) {
        let j = e / p.d;
        let c = e % p.d;
        let key = k0 + j;
        var x = 0.0;
        if (key < p.tk) {
            let at = (key * p.hkv + kh) * p.d + c;
            x = select(k[at], v[at], which == 1u);
        }
        buf[dst + j * st + c] = x;
    }
}

fn load_k(dst: u32, k0: u32, kh: u32, lid: u32) {
    load_kv(0u, dst, k0, kh, lid);
}

fn load_v(dst: u32, k0: u32, kh: u32, lid: u32) {
    load_kv(1u, dst, k0, kh, lid);
}

// The intervals of query rows [r0, r0 + BQ) into row_iv (empty past tq).
fn load_intervals(r0: u32, lid: u32) {
    for (var e = lid; e < p.bq * 4u; e = e + THREADS) {
        let r = r0 + e / 4u;
        var x = 0;
        if (r < p.tq) {
            x = bitcast<i32>(tiles[p.ivs_at + r * 4u + e % 4u]);
        }
        row_iv[e] = x;
    }
}

// Row i of the tile at a (D wide) dotted with row j of the tile at b.
fn dot(a: u32, i: u32, b: u32, j: u32) -> f32 {
    let st = tile_stride();
    let x = a + i * st;
    let y = b + j * st;
    var s = 0.0;
    for (var c = 0u; c < p.d; c = c + 1u) {
        s = fma(buf[x + c], buf[y + c], s);
    }
    return s;
}

// [start, end) of a tile list, made workgroup-uniform (loop bounds around barriers).
fn list_bounds(off_at: u32, idx: u32, lid: u32) -> vec2<u32> {
    if (lid == 0u) {
        bounds[0] = tiles[off_at + idx];
        bounds[1] = tiles[off_at + idx + 1u];
    }
    let lo = workgroupUniformLoad(&bounds[0]);
    let hi = workgroupUniformLoad(&bounds[1]);
    return vec2<u32>(lo, hi);
}

// ---- forward --------------------------------------------------------------------------------

@group(0) @binding(5) var<storage, read_write> f_out: array<f32>;
@group(0) @binding(6) var<storage, read_write> f_lse: array<f32>;
@group(0) @binding(7) var<storage, read_write> f_state: array<f32>; // (m, l, nan) per row

@compute @workgroup_size(128)
fn attn_fwd(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let nqt = (p.tq + p.bq - 1u) / p.bq;
    let g = wg_linear(wid, nwg);
    if (g >= nqt * p.hq) {
        return;
    }
    let qt = g / p.hq;
    let h = g % p.hq;
    let kh = h / p.group;
    let r0 = qt * p.bq;
    load_q(XS, r0, h, lid);
    load_intervals(r0, lid);
    let first = (p.flags & FIRST) != 0u;
    let per = THREADS / p.bq;
    let my_row = lid / per;
    let my_lane = lid % per;
    let my_r = min(r0 + my_row, p.tq - 1u);
    let st = tile_stride();
    let row = my_row * score_stride(); // where my_row's scores start in sc
    let part = my_row * per;           // where my_row's threads' partials start in stat_*
    // The online softmax state of row my_row: every one of the row's `per` threads holds the
    // running max m and sum l, all computing the same values from the same reductions. `nan`
    // covers this thread's share of the row's scores; the row's flag is their OR (at the end).
    var m = neg_inf_f32();
    var l = 0.0;
    var nan = 0u;
    if (!first) {
        let at = 3u * (my_r * p.hq + h);
        m = f_state[at];
        l = f_state[at + 1u];
        nan = u32(f_state[at + 2u]);
    }
    var acc: array<f32, ACC>;
    for (var c = 0u; c < ACC; c = c + 1u) {
        let dd = my_lane + per * c;
        acc[c] = 0.0;
        if (!first && dd < p.d) {
            acc[c] = f_out[(my_r * p.hq + h) * p.d + dd];
        }
    }
    let lb = list_bounds(0u, qt, lid);
    let span = pass_range(lb.x, lb.y);
    for (var it = span.x; it < span.y; it = it + 1u) {
        let k0 = tiles[p.qlist_at + it] * p.bk;
        load_k(ZS, k0, kh, lid);
        workgroupBarrier();
        for (var e = lid; e < p.bq * p.bk; e = e + THREADS) {
            let i = e / p.bk;
            let j = e % p.bk;
            var s = neg_inf_f32();
            if (visible(i, k0 + j)) {
                s = p.scale * dot(XS, i, ZS, j);
            }
            sc[i * score_stride() + j] = s;
        }
        workgroupBarrier();
        // K is read no more: stage V now, its loads overlapping the softmax below (the
        // softmax's barriers publish it).
        load_v(ZS, k0, kh, lid);
        // Online softmax update of row my_row, split over the row's threads: this one takes
        // keys my_lane, my_lane + per, ...; invisible keys are -inf. Its partial max, then
        // the row's max from all partials.
        var cm = neg_inf_f32();
        for (var j = my_lane; j < p.bk; j = j + per) {
            let s = sc[row + j];
            if (poisons(s)) {
                nan = 1u;
            } else if (s > cm) {
                cm = s;
            }
        }
        stat_m[lid] = cm;
        workgroupBarrier();
        for (var u = 0u; u < per; u = u + 1u) {
            let x = stat_m[part + u];
            cm = select(cm, x, x > cm);
        }
        let m_new = select(m, cm, cm > m);
        var alpha = 0.0;
        if (m != neg_inf_f32()) {
            alpha = exp(m - m_new);
        }
        // This thread's probabilities (in place of its scores) and their partial sum, then
        // the row's sum from all partials.
        var sum = 0.0;
        for (var j = my_lane; j < p.bk; j = j + per) {
            let s = sc[row + j];
            var pr = 0.0;
            if (s != neg_inf_f32() && !poisons(s)) {
                pr = exp(s - m_new);
            }
            sc[row + j] = pr;
            sum = sum + pr;
        }
        stat_s[lid] = sum;
        workgroupBarrier(); // the probabilities, the partial sums and the V tile
        sum = 0.0;
        for (var u = 0u; u < per; u = u + 1u) {
            sum = sum + stat_s[part + u];
        }
        m = m_new;
        l = l * alpha + sum;
        // acc += P V, a key at a time over all of this thread's dims: each probability is
        // read once, and the dims loop has a constant bound (the driver can unroll it and
        // keep acc in registers).
        for (var c = 0u; c < ACC; c = c + 1u) {
            acc[c] = acc[c] * alpha;
        }
        for (var j = 0u; j < p.bk; j = j + 1u) {
            let pr = sc[row + j];
            let nz = nonzero(pr);
            let at = ZS + j * st + my_lane;
            for (var c = 0u; c < ACC; c = c + 1u) {
                if (my_lane + per * c < p.d) {
                    acc[c] = acc[c] + select(0.0, pr * buf[at + per * c], nz);
                }
            }
        }
        workgroupBarrier();
    }
    // The row's NaN flag: the OR of its threads' flags (stat_m is free: the loop ended on a
    // barrier, or never read it).
    stat_m[lid] = f32(nan);
    workgroupBarrier();
    var bad = false;
    for (var u = 0u; u < per; u = u + 1u) {
        bad = bad || (stat_m[part + u] != 0.0);
    }
    let r = r0 + my_row;
    if (r >= p.tq) {
        return;
    }
    if ((p.flags & LAST) == 0u) {
        // Not the last pass: keep the unnormalised accumulators and the row state.
        for (var c = 0u; c < ACC; c = c + 1u) {
            let dd = my_lane + per * c;
            if (dd < p.d) {
                f_out[(r * p.hq + h) * p.d + dd] = acc[c];
            }
        }
        if (my_lane == 0u) {
            let at = 3u * (r * p.hq + h);
            f_state[at] = m;
            f_state[at + 1u] = l;
            f_state[at + 2u] = select(0.0, 1.0, bad);
        }
        return;
    }
    for (var c = 0u; c < ACC; c = c + 1u) {
        let dd = my_lane + per * c;
        if (dd < p.d) {
            var o = 0.0;
            if (bad) {
                o = nan_f32();
            } else if (l > 0.0) {
                o = acc[c] / l;
            }
            f_out[(r * p.hq + h) * p.d + dd] = o;
        }
    }
    if (my_lane == 0u) {
        var lse = neg_inf_f32();
        if (bad) {
            lse = nan_f32();
        } else if (l > 0.0) {
            lse = m + log(l);
        }
        f_lse[r * p.hq + h] = lse;
    }
}

// ---- backward: dsum = rowwise d_out . out ---------------------------------------------------
// Bindings 1..4 (q, k, v, tiles) unused here; d_out at 5, out at 6.

@group(0) @binding(5) var<storage, read> s_dout: array<f32>;
@group(0) @binding(6) var<storage, read> s_out: array<f32>;
@group(0) @binding(7) var<storage, read_write> s_dsum: array<f32>;

@compute @workgroup_size(128)
fn attn_dsum(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let i = wg_linear(wid, nwg) * THREADS + lid;
    if (i >= p.tq * p.hq) {
        return;
    }
    var s = 0.0;
    for (var c = 0u; c < p.d; c = c + 1u) {
        s = fma(s_dout[i * p.d + c], s_out[i * p.d + c], s);
    }
    s_dsum[i] = s;
}

// ---- backward: dq ---------------------------------------------------------------------------
// dP = d_out . v, P = exp(scale q.k - lse), dS = P (dP - dsum), dq = scale * sum_j dS k_j.

@group(0) @binding(5) var<storage, read> d_out: array<f32>;
@group(0) @binding(6) var<storage, read> lse_in: array<f32>;
@group(0) @binding(7) var<storage, read> dsum_in: array<f32>;
@group(0) @binding(8) var<storage, read_write> b_dq: array<f32>;
@group(0) @binding(8) var<storage, read_write> b_dk: array<f32>;
@group(0) @binding(9) var<storage, read_write> b_dv: array<f32>;

fn load_dout(dst: u32, r0: u32, head: u32, lid: u32) {
    let st = tile_stride();
    for (var e = lid; e < p.bq * p.d; e = e + THREADS) {
        let i = e / p.d;
        let c = e % p.d;
        let r = r0 + i;
        var x = 0.0;
        if (r < p.tq) {
            x = d_out[(r * p.hq + head) * p.d + c];
        }
        buf[dst + i * st + c] = x;
    }
}

// lse and dsum of rows [r0, r0 + BQ) of head h into stat_m and stat_s.
fn load_row_stats(r0: u32, h: u32, lid: u32) {
    if (lid < p.bq) {
        let r = r0 + lid;
        var l = 0.0;
        var ds = 0.0;
        if (r < p.tq) {
            l = lse_in[r * p.hq + h];
            ds = dsum_in[r * p.hq + h];
        }
        stat_m[lid] = l;
        stat_s[lid] = ds;
    }
}

@compute @workgroup_size(128)
fn attn_dq(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) lid: u32) {
    let nqt = (p.tq + p.bq - 1u) / p.bq;
    let g = wg_linear(wid, nwg);
    if (g >= nqt * p.hq) {
        return;
    }
    let qt = g / p.hq;
    let h = g % p.hq;
    let kh = h / p.group;
    let r0 = qt * p.bq;
    load_q(XS, r0, h, lid);
    load_dout(YS, r0, h, lid);
    load_intervals(r0, lid);
    load_row_stats(r0, h, lid);
    let per = THREADS / p.bq;
    let my_row = lid / per;
    let my_lane = lid % per;
    let my_r = min(r0 + my_row, p.tq - 1u);
    let st = tile_stride();
    let ss = score_stride();
    var acc: array<f32, ACC>;
    for (var c = 0u; c < ACC; c = c + 1u) {
        let dd = my_lane + per * c;
        acc[c] = 0.0;
        if ((p.flags & FIRST) == 0u && dd < p.d) {
            acc[c] = b_dq[(my_r * p.hq + h) * p.d + dd];
        }
    }
    let lb = list_bounds(0u, qt, lid);
    let span = pass_range(lb.x, lb.y);
    for (var it = span.x; it < span.y; it = it + 1u) {
        let k0 = tiles[p.qlist_at + it] * p.bk;
        load_v(ZS, k0, kh, lid);
        workgroupBarrier();
        for (var e = lid; e < p.bq * p.bk; e = e + THREADS) {
            let i = e / p.bk;
            let j = e % p.bk;
            var dp = 0.0;
            if (visible(i, k0 + j)) {
                dp = dot(YS, i, ZS, j);
            }
            sc[i * ss + j] = dp;
        }
        workgroupBarrier();
        load_k(ZS, k0, kh, lid);
        workgroupBarrier();
        for (var e = lid; e < p.bq * p.bk; e = e + THREADS) {
            let i = e / p.bk;
            let j = e % p.bk;
            var ds = 0.0;
            if (visible(i, k0 + j)) {
                let pr = prob(p.scale * dot(XS, i, ZS, j), stat_m[i]);
                ds = pr * (sc[i * ss + j] - stat_s[i]);
            }
            sc[i * ss + j] = ds;
        }
        workgroupBarrier();
        // acc += dS K, a key at a time over all of this thread's dims (as the forward's P V).
        for (var j = 0u; j < p.bk; j = j + 1u) {
            let ds = sc[my_row * ss + j];
            let nz = nonzero(ds);
            let at = ZS + j * st + my_lane;
            for (var c = 0u; c < ACC; c = c + 1u) {
                if (my_lane + per * c < p.d) {
                    acc[c] = acc[c] + select(0.0, ds * buf[at + per * c], nz);
                }
            }
        }
        workgroupBarrier();
    }
    let r = r0 + my_row;
    if (r >= p.tq) {
        return;
    }
    for (var c = 0u; c < ACC; c = c + 1u) {
        let dd = my_lane + per * c;
        if (dd < p.d) {
            // Scaled once, on the last pass.
            b_dq[(r * p.hq + h) * p.d + dd] = select(acc[c], p.scale * acc[c], (p.flags & LAST) != 0u);
        }
    }
}

// ---- backward: dk, dv -----------------------------------------------------------------------
// For each query tile that sees this key tile and each query head of the kv head:
// dv_j += sum_i P_ij d_out_i, dk_j += scale * sum_i dS_ij q_i.

@compute @workgroup_size(128)
fn attn_dkdv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let nkt = (p.tk + p.bk - 1u) / p.bk;
    let g = wg_linear(wid, nwg);
    if (g >= nkt * p.hkv) {
        return;
    }
    let kt = g / p.hkv;
    let kh = g % p.hkv;
    let k0 = kt * p.bk;
    load_k(YS, k0, kh, lid);
    load_v(ZS, k0, kh, lid);
    let per = THREADS / p.bk;
    let my_key = lid / per;
    let my_lane = lid % per;
    let my_k = min(k0 + my_key, p.tk - 1u);
    let st = tile_stride();
    let ss = score_stride();
    var dk: array<f32, ACC>;
    var dv: array<f32, ACC>;
    for (var c = 0u; c < ACC; c = c + 1u) {
        let dd = my_lane + per * c;
        dk[c] = 0.0;
        dv[c] = 0.0;
        if ((p.flags & FIRST) == 0u && dd < p.d) {
            dk[c] = b_dk[(my_k * p.hkv + kh) * p.d + dd];
            dv[c] = b_dv[(my_k * p.hkv + kh) * p.d + dd];
        }
    }
    let lb = list_bounds(p.koff_at, kt, lid);
    // One flat loop over (query tile, query head of this kv head) pairs.
    let span = pass_range(lb.x * p.group, lb.y * p.group);
    for (var w = span.x; w < span.y; w = w + 1u) {
        let r0 = tiles[p.klist_at + w / p.group] * p.bq;
        let h = kh * p.group + w % p.group;
        load_intervals(r0, lid);
        load_q(XS, r0, h, lid);
        load_row_stats(r0, h, lid);
        workgroupBarrier();
        for (var e = lid; e < p.bq * p.bk; e = e + THREADS) {
            let i = e / p.bk;
            let j = e % p.bk;
            var pr = 0.0;
            if (visible(i, k0 + j)) {
                pr = prob(p.scale * dot(XS, i, YS, j), stat_m[i]);
            }
            sc[i * ss + j] = pr;
        }
        workgroupBarrier();
        load_dout(XS, r0, h, lid);
        workgroupBarrier();
        // dv += P^T d_out, a query row at a time over all of this thread's dims.
        for (var i = 0u; i < p.bq; i = i + 1u) {
            let pr = sc[i * ss + my_key];
            let nz = nonzero(pr);
            let at = XS + i * st + my_lane;
            for (var c = 0u; c < ACC; c = c + 1u) {
                if (my_lane + per * c < p.d) {
                    dv[c] = dv[c] + select(0.0, pr * buf[at + per * c], nz);
                }
            }
        }
        workgroupBarrier();
        for (var e = lid; e < p.bq * p.bk; e = e + THREADS) {
            let i = e / p.bk;
            let j = e % p.bk;
            if (visible(i, k0 + j)) {
                sc[i * ss + j] = sc[i * ss + j] * (dot(XS, i, ZS, j) - stat_s[i]);
            }
        }
        workgroupBarrier();
        load_q(XS, r0, h, lid);
        workgroupBarrier();
        // dk += dS^T q (scaled on the last pass).
        for (var i = 0u; i < p.bq; i = i + 1u) {
            let ds = sc[i * ss + my_key];
            let nz = nonzero(ds);
            let at = XS + i * st + my_lane;
            for (var c = 0u; c < ACC; c = c + 1u) {
                if (my_lane + per * c < p.d) {
                    dk[c] = dk[c] + select(0.0, ds * buf[at + per * c], nz);
                }
            }
        }
        workgroupBarrier();
    }
    let key = k0 + my_key;
    for (var c = 0u; c < ACC; c = c + 1u) {
        let dd = my_lane + per * c;
        if (dd < p.d && key < p.tk) {
            b_dk[(key * p.hkv + kh) * p.d + dd] = select(dk[c], p.scale * dk[c], (p.flags & LAST) != 0u);
            b_dv[(key * p.hkv + kh) * p.d + dd] = dv[c];
        }
    }
}
