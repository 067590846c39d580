// attention.wgsl: the shared part of the block-sparse attention kernels (attention_fwd.wgsl,
// attention_dq.wgsl, attention_dkdv.wgsl), FlashAttention-2 style, f32.
//
// Layouts: q, out, d_out, dq (Tq, Hq, D); k, v, dk, dv (Tk, Hkv, D); lse (Tq, Hq); query head
// h reads kv head h / group. Work is a list of visible tiles built on the host (TileMap): a
// workgroup owns one (query tile, head) in the forward and dq kernels, one (key tile, kv head)
// in the dk/dv kernel, and visits only the tiles its list names. A list entry's top bit marks
// a full tile (every pair visible: no per-element interval check, only the tensor edges);
// inside a partial tile each (row, key) pair is checked against the row's two key intervals.
//
// Each module is generated per head-dim class and tile configuration: the host puts
// `const DP` (the head dim padded to a power of two >= 32), `BQ`, `BK` (tile rows and keys)
// and `WG` (threads) in front of this file. Register blocking, as the GEMM's matmul128:
// - Staged tiles are rows of DP / 4 vec4 at the odd stride QS = DP / 4 + 1 vec4 (conflict-free
//   vec4 reads of one column by the rows of a warp), zero past the tensor's edge and past D.
// - Scores (`dots8`): a thread computes a 4 x 2 block (4 rows of tile A against 2 rows of
//   tile B) with 8 vec4 accumulators over DP / 4 steps: 6 vec4 loads per 32 FMAs.
// - Accumulation (`acc_rows`): a thread owns 4 output rows x 8 dims (dims 4 cx .. 4 cx + 3
//   and DP / 2 + 4 cx ..) in 8 vec4 registers, so WG = (rows / 4) * (DP / 8); per key (or
//   query row) one vec4 of weights and two vec4 of the value tile: 3 loads per 32 FMAs.
// Per-thread state lives in named vec4 registers or structs of them, never in arrays indexed
// by loop counters (those end up in local memory on NVIDIA's compiler).
//
// NaN policy: a visible score that is NaN (or +inf) makes its row's out, lse and dq NaN, and
// its key's dk/dv NaN; products with a zero weight must not turn a NaN of an unseen row or key
// into NaN elsewhere, so when a staged value tile holds a non-finite value (flagged while it
// is loaded) the accumulation takes the careful path that skips zero weights. Rows that see
// no key: out 0, lse -inf.
//
// tiles (u32): [q_off: nqt + 1][q_order: nqt][q_list][k_off: nkt + 1][k_order: nkt][k_list]
// [ivs: 4 per query row, i32]. q_list: the key tiles of each query tile; k_list: the query
// tiles of each key tile; the orders: the tiles by descending list length, which workgroups
// take in turn (the longest first, so short ones fill the end of the dispatch).

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
// The full-tile flag of a list entry.
const FULL: u32 = 0x80000000u;

// Saturating: `lo + w_count` may not fit a u32 (a GPU's one pass sends the whole list
// length, but lo is where this tile's list starts in the concatenated lists).
fn pass_range(lo: u32, hi: u32) -> vec2<u32> {
    let a = lo + min(p.w_first, hi - lo);
    return vec2<u32>(a, a + min(p.w_count, hi - a));
}
@group(0) @binding(0) var<uniform> p: AttnParams;

const DP4: u32 = DP / 4u;
const DP8: u32 = DP / 8u;
const QS: u32 = DP4 + 1u;

// Every kernel binds q, k, v at 1-3 (the host declares them in front of this file, with
// their readers q_row4, k_row4, v_row4: as vec4 where D % 4 == 0) and the tile lists.
@group(0) @binding(4) var<storage, read> tiles: array<u32>;

// The key intervals of the staged query tile's rows, the list bounds, and two flags for
// non-finite values in staged tiles (integer atomics: set by any loading thread).
// Each 16 bytes (two elements used): every workgroup variable a multiple of 16 bytes, so
// that wherever a driver places them the next one starts 16-byte aligned, as the
// matrix loads of attention_fwd_coop.wgsl need.
var<workgroup> row_iv: array<i32, 4u * BQ>;
var<workgroup> bounds: array<u32, 4>;
var<workgroup> bad: array<atomic<u32>, 4>;
// The first row of the staged query tile and whether the current tile is full.
var<private> tile_r0: u32;
var<private> tile_full: bool;

fn visible(i: u32, key: u32) -> bool {
    if (tile_full) {
        return tile_r0 + i < p.tq && key < p.tk;
    }
    let kk = i32(key);
    let iv = i * 4u;
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

fn hsum(x: vec4<f32>) -> f32 {
    return (x.x + x.y) + (x.z + x.w);
}

// Whether x holds a NaN or infinity.
fn nonfinite4(x: vec4<f32>) -> bool {
    let e = bitcast<vec4<u32>>(x) & vec4<u32>(0x7f800000u);
    return any(e == vec4<u32>(0x7f800000u));
}

// Clears both non-finite flags (thread 0). A clear must be ordered before every `note` it
// could erase by a barrier between them (and after the previous readers by another): a
// kernel that stages a flagged tile right after clearing, with no barrier between, loses
// the flag when thread 0 clears after a faster thread has set it (seen on NVIDIA, where
// warps run apart; lavapipe runs the threads in order and never shows it).
fn clear_flags(lid: u32) {
    if (lid == 0u) {
        atomicStore(&bad[0], 0u);
        atomicStore(&bad[1], 0u);
    }
}

// Flags `which` (1 or 2; 0: no check) when `seen`: one atomic per thread and staged tile,
// after its loads (an atomic inside the load loop keeps the compiler from issuing the loads
// of several iterations together).
fn note(seen: bool, which: u32) {
    if (which != 0u && seen) {
        atomicOr(&bad[which - 1u], 1u);
    }
}

// Elements 4 c4 .. 4 c4 + 3 of the D-wide row starting at element `at` of q (0), k (1) or
// v (2), zero past D.
fn row4(which: u32, at: u32, c4: u32) -> vec4<f32> {
    if (which == 0u) {
        return q_row4(at, c4);
    } else if (which == 1u) {
        return k_row4(at, c4);
    }
    return v_row4(at, c4);
}

// Staging loops run a constant number of iterations (ceil(rows DP4 / WG)) with no side effect
// but the workgroup store, so the driver can unroll them and issue all global loads first.

// Query rows [r0, r0 + BQ) of head `head` into the tile at dst, zero past tq.
fn stage_q(dst: u32, r0: u32, head: u32, lid: u32, flag: u32) {
    stage_q_rows(dst, QS, r0, head, lid, flag);
}

// As `stage_q`, rows `stride` vec4 apart (QS: padded; DP4: dense, for register scores).
fn stage_q_rows(dst: u32, stride: u32, r0: u32, head: u32, lid: u32, flag: u32) {
    var seen = false;
    for (var n = 0u; n < (BQ * DP4 + WG - 1u) / WG; n = n + 1u) {
        let e = lid + n * WG;
        if ((BQ * DP4) % WG == 0u || e < BQ * DP4) {
            let i = e / DP4;
            let c4 = e % DP4;
            var x = vec4<f32>(0.0);
            if (r0 + i < p.tq) {
                x = row4(0u, ((r0 + i) * p.hq + head) * p.d, c4);
            }
            seen = seen | nonfinite4(x);
            buf[dst + i * stride + c4] = x;
        }
    }
    note(seen, flag);
}

// A thread's share of a K or V tile: element e = lid + n WG of the tile's BK x DP4 vec4 is
// its n-th (a constant count: the loops unroll and the array stays in registers).
const NKV: u32 = (BK * DP4 + WG - 1u) / WG;

// This thread's share of keys [k0, k0 + BK) of kv head kh of k (which 1) or v (which 2),
// zero past tk. The loads are only issued here: a kernel that fetches a tile before other
// work and stores it after (`put_kv`) hides their latency behind that work.
fn fetch_kv(which: u32, k0: u32, kh: u32, lid: u32) -> array<vec4<f32>, NKV> {
    var x: array<vec4<f32>, NKV>;
    for (var n = 0u; n < NKV; n = n + 1u) {
        let e = lid + n * WG;
        let j = e / DP4;
        var y = vec4<f32>(0.0);
        if (((BK * DP4) % WG == 0u || e < BK * DP4) && k0 + j < p.tk) {
            y = row4(which, ((k0 + j) * p.hkv + kh) * p.d, e % DP4);
        }
        x[n] = y;
    }
    return x;
}

// A fetched share into the tile at dst, rows `stride` vec4 apart (QS: the padded rows every
// kernel reads by column; DP4: dense), flagging non-finite values in bad[flag - 1].
fn put_kv(dst: u32, stride: u32, share: array<vec4<f32>, NKV>, lid: u32, flag: u32) {
    var x = share;
    var seen = false;
    for (var n = 0u; n < NKV; n = n + 1u) {
        let e = lid + n * WG;
        if ((BK * DP4) % WG == 0u || e < BK * DP4) {
            seen = seen | nonfinite4(x[n]);
            buf[dst + (e / DP4) * stride + e % DP4] = x[n];
        }
    }
    note(seen, flag);
}

// Keys [k0, k0 + BK) of kv head kh of k (which 1) or v (which 2) into the tile at dst, zero
// past tk.
fn stage_kv(which: u32, dst: u32, k0: u32, kh: u32, lid: u32, flag: u32) {
    put_kv(dst, QS, fetch_kv(which, k0, kh, lid), lid, flag);
}

// The intervals of query rows [r0, r0 + BQ) into row_iv (empty past tq).
fn load_intervals(r0: u32, lid: u32) {
    for (var e = lid; e < BQ * 4u; e = e + WG) {
        let r = r0 + e / 4u;
        var x = 0;
        if (r < p.tq) {
            x = bitcast<i32>(tiles[p.ivs_at + r * 4u + e % 4u]);
        }
        row_iv[e] = x;
    }
}

// The query tile of the i-th workgroup (of each head), and the key tile of the i-th (of each
// kv head): the i-th of q_order / k_order.
fn q_tile_of(i: u32) -> u32 {
    return tiles[(p.tq + BQ - 1u) / BQ + 1u + i];
}

fn k_tile_of(i: u32) -> u32 {
    return tiles[p.koff_at + (p.tk + BK - 1u) / BK + 1u + i];
}

// The workgroups of a kernel with one per (query tile, head).
fn q_tile_groups() -> u32 {
    return (p.tq + BQ - 1u) / BQ * p.hq;
}

// (query tile, head) of workgroup g < q_tile_groups() in such a kernel; sets tile_r0 and loads
// the tile rows' key intervals.
fn begin_q_tile(g: u32, lid: u32) -> vec2<u32> {
    let qt = q_tile_of(g / p.hq);
    tile_r0 = qt * BQ;
    load_intervals(tile_r0, lid);
    return vec2<u32>(qt, g % p.hq);
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

// Dot products over DP of the 4 staged rows at a, a + QS, a + 2 QS, a + 3 QS with the rows at
// b (x) and b2 (y): component r of x is row a + r QS with b.
struct S8 {
    x: vec4<f32>,
    y: vec4<f32>,
}

fn dots8(a: u32, b: u32, b2: u32) -> S8 {
    var x0 = vec4<f32>(0.0); var x1 = vec4<f32>(0.0);
    var x2 = vec4<f32>(0.0); var x3 = vec4<f32>(0.0);
    var y0 = vec4<f32>(0.0); var y1 = vec4<f32>(0.0);
    var y2 = vec4<f32>(0.0); var y3 = vec4<f32>(0.0);
    for (var c = 0u; c < DP4; c = c + 1u) {
        let a0 = buf[a + c];
        let a1 = buf[a + QS + c];
        let a2 = buf[a + 2u * QS + c];
        let a3 = buf[a + 3u * QS + c];
        let u = buf[b + c];
        let w = buf[b2 + c];
        x0 = fma(a0, u, x0); x1 = fma(a1, u, x1); x2 = fma(a2, u, x2); x3 = fma(a3, u, x3);
        y0 = fma(a0, w, y0); y1 = fma(a1, w, y1); y2 = fma(a2, w, y2); y3 = fma(a3, w, y3);
    }
    return S8(vec4<f32>(hsum(x0), hsum(x1), hsum(x2), hsum(x3)),
              vec4<f32>(hsum(y0), hsum(y1), hsum(y2), hsum(y3)));
}

// A thread's accumulators: 4 rows (0..3) x dims 4 cx .. 4 cx + 3 (a) and DP / 2 + 4 cx .. (b).
struct O8 {
    a0: vec4<f32>, b0: vec4<f32>,
    a1: vec4<f32>, b1: vec4<f32>,
    a2: vec4<f32>, b2: vec4<f32>,
    a3: vec4<f32>, b3: vec4<f32>,
}

fn o8_zero() -> O8 {
    let z = vec4<f32>(0.0);
    return O8(z, z, z, z, z, z, z, z);
}

fn o8_scale(o: O8, s: vec4<f32>) -> O8 {
    return O8(o.a0 * s.x, o.b0 * s.x, o.a1 * s.y, o.b1 * s.y,
              o.a2 * s.z, o.b2 * s.z, o.a3 * s.w, o.b3 * s.w);
}

// o += sum over j < n of w_j (x) T_j, where w_j = buf[w + j ws] holds the 4 rows' weights and
// T_j's two vec4 are buf[t + j QS] and buf[t + j QS + DP8] (t includes the thread's cx).
// `careful`: T holds a non-finite value, so zero weights are skipped (0 * NaN must not count).
fn acc_rows(o: O8, w: u32, ws: u32, t: u32, n: u32, careful: bool) -> O8 {
    var r = o;
    if (!careful) {
        for (var j = 0u; j < n; j = j + 1u) {
            let x = buf[w + j * ws];
            let u = buf[t + j * QS];
            let z = buf[t + j * QS + DP8];
            r.a0 = fma(vec4<f32>(x.x), u, r.a0); r.b0 = fma(vec4<f32>(x.x), z, r.b0);
            r.a1 = fma(vec4<f32>(x.y), u, r.a1); r.b1 = fma(vec4<f32>(x.y), z, r.b1);
            r.a2 = fma(vec4<f32>(x.z), u, r.a2); r.b2 = fma(vec4<f32>(x.z), z, r.b2);
            r.a3 = fma(vec4<f32>(x.w), u, r.a3); r.b3 = fma(vec4<f32>(x.w), z, r.b3);
        }
        return r;
    }
    let zero = vec4<f32>(0.0);
    for (var j = 0u; j < n; j = j + 1u) {
        let x = buf[w + j * ws];
        let u = buf[t + j * QS];
        let z = buf[t + j * QS + DP8];
        r.a0 = r.a0 + select(zero, x.x * u, nonzero(x.x));
        r.b0 = r.b0 + select(zero, x.x * z, nonzero(x.x));
        r.a1 = r.a1 + select(zero, x.y * u, nonzero(x.y));
        r.b1 = r.b1 + select(zero, x.y * z, nonzero(x.y));
        r.a2 = r.a2 + select(zero, x.z * u, nonzero(x.z));
        r.b2 = r.b2 + select(zero, x.z * z, nonzero(x.z));
        r.a3 = r.a3 + select(zero, x.w * u, nonzero(x.w));
        r.b3 = r.b3 + select(zero, x.w * z, nonzero(x.w));
    }
    return r;
}

// Row r of an O8 as (a, b).
fn o8_row(o: O8, r: u32) -> array<vec4<f32>, 2> {
    switch (r) {
        case 0u: { return array<vec4<f32>, 2>(o.a0, o.b0); }
        case 1u: { return array<vec4<f32>, 2>(o.a1, o.b1); }
        case 2u: { return array<vec4<f32>, 2>(o.a2, o.b2); }
        default: { return array<vec4<f32>, 2>(o.a3, o.b3); }
    }
}

fn o8_set(o: O8, r: u32, a: vec4<f32>, b: vec4<f32>) -> O8 {
    var x = o;
    switch (r) {
        case 0u: { x.a0 = a; x.b0 = b; }
        case 1u: { x.a1 = a; x.b1 = b; }
        case 2u: { x.a2 = a; x.b2 = b; }
        default: { x.a3 = a; x.b3 = b; }
    }
    return x;
}
