// attention_fwd.wgsl: the forward (after attention.wgsl), one workgroup of WG threads per
// (query tile of BQ rows, head), WG = (BQ / 4) * (DP / 8). attention_fwd_sg.wgsl follows this
// file in the subgroup forward's module, sharing its layout and helpers: WG is then that
// kernel's, and `attn_fwd` here is not dispatched.
//
// Per key tile of BK keys, five barriers: stage K (fetched into registers during the last
// tile's P V) and fetch V; scores S = scale Q K^T (4 x 2 blocks, masked to -inf) into SC;
// stage V while the row threads take each row's partial max; the online-softmax update
// (probabilities in place of the scores, each row's alpha); fetch the next K, and O =
// alpha O + P V on the 4 x 8 register blocks.
//
// SC holds the scores key-major: key j's 4-row group g at buf[SC + j PSQ + g], so the
// accumulation reads one vec4 of 4 rows' weights per key. The row phase: thread lid takes
// row rr = lid % BQ and keys part, part + NPART, ... (part = lid / BQ); its partial max and
// sum are combined through stat_m / stat_s in part order (deterministic).

const PSQ: u32 = BQ / 4u + 1u;
const NPART: u32 = WG / BQ;
// QROWS (from the host): BQ where the query tile is staged at QT; 0 where the subgroup
// forward holds its query rows in registers (QREG).
const QT: u32 = 0u;
const KV: u32 = QROWS * QS;
const SC: u32 = (QROWS + BK) * QS;
const NBUF: u32 = (QROWS + BK) * QS + BK * PSQ;

var<workgroup> buf: array<vec4<f32>, NBUF>;
var<workgroup> stat_m: array<f32, WG>;
var<workgroup> stat_s: array<f32, WG>;
// Per row: alpha of the current tile; at the end the row's sum l (NaN: the row is NaN).
var<workgroup> row_a: array<vec4<f32>, BQ / 4u>;

@group(0) @binding(5) var<storage, read_write> f_out: array<f32>;
@group(0) @binding(6) var<storage, read_write> f_lse: array<f32>;
@group(0) @binding(7) var<storage, read_write> f_state: array<f32>; // (m, l, nan) per row

fn score_at(i: u32, j: u32) -> f32 {
    return buf[SC + j * PSQ + i / 4u][i % 4u];
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

// The start of list iteration `it`: the tile's full flag, its first key (returned), the
// non-finite flag of its V tile cleared.
fn begin_tile(it: u32, lid: u32) -> u32 {
    let w = tiles[p.qlist_at + it];
    tile_full = (w & FULL) != 0u;
    // The previous tile's readers passed its last barrier; the writer (V) comes two
    // barriers later.
    clear_flags(lid);
    return (w & ~FULL) * BK;
}

// This thread's share of the K tile of list iteration `it` (zero past the pass's span).
fn fetch_k_of(it: u32, span: vec2<u32>, kh: u32, lid: u32) -> array<vec4<f32>, NKV> {
    var x: array<vec4<f32>, NKV>;
    if (it < span.y && (ABLATE & 8u) == 0u) {
        x = fetch_kv(1u, (tiles[p.qlist_at + it] & ~FULL) * BK, kh, lid);
    }
    return x;
}

// Stores this thread's fetched share of the K tile and fetches its share of the V tile at
// k0, to be stored (`stage_v`) once K is read no more.
fn stage_k_fetch_v(kx: array<vec4<f32>, NKV>, k0: u32, kh: u32, lid: u32)
    -> array<vec4<f32>, NKV> {
    var vx: array<vec4<f32>, NKV>;
    if ((ABLATE & 8u) == 0u) {
        // Dense rows for the subgroup forward's register scores (QREG), which read them
        // conflict-free; padded for the column reads of the others.
        put_kv(KV, select(QS, DP4, QREG), kx, lid, 0u);
        vx = fetch_kv(2u, k0, kh, lid);
    }
    return vx;
}

// The V share in K's place, flagging non-finite values (bad[0]).
fn stage_v(vx: array<vec4<f32>, NKV>, lid: u32) {
    if ((ABLATE & 8u) == 0u) {
        put_kv(KV, QS, vx, lid, 1u);
    }
}

// The scaled scores of rows 4 ty .. 4 ty + 3 (components) against keys k0 + tx (x) and
// k0 + tx + BK / 2 (y) from the staged Q and K tiles, -inf where a pair is not visible.
fn score_block(ty: u32, tx: u32, k0: u32) -> S8 {
    var s = S8(vec4<f32>(0.0), vec4<f32>(0.0));
    if ((ABLATE & 1u) == 0u) {
        s = dots8(QT + 4u * ty * QS, KV + tx * QS, KV + (tx + BK / 2u) * QS);
    }
    var x = vec4<f32>(neg_inf_f32());
    var y = vec4<f32>(neg_inf_f32());
    for (var e = 0u; e < 4u; e = e + 1u) {
        if (visible(4u * ty + e, k0 + tx)) {
            x[e] = p.scale * s.x[e];
        }
        if (visible(4u * ty + e, k0 + tx + BK / 2u)) {
            y[e] = p.scale * s.y[e];
        }
    }
    return S8(x, y);
}

@compute @workgroup_size(WG)
fn attn_fwd(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let g = wg_linear(wid, nwg);
    if (g >= q_tile_groups()) {
        return;
    }
    let tile = begin_q_tile(g, lid);
    let qt = tile.x;
    let h = tile.y;
    let kh = h / p.group;
    let r0 = qt * BQ;
    stage_q(QT, r0, h, lid, 0u);
    let first = (p.flags & FIRST) != 0u;
    let last = (p.flags & LAST) != 0u;
    // The row phase's row and part, the accumulation's 4-row group and dims.
    let rr = lid % BQ;
    let part = lid / BQ;
    let ry = lid / DP8;
    let cx = lid % DP8;
    // The online-softmax state of row rr, the same in each of its NPART threads; `nan`
    // covers this thread's share of the row's scores (the row's flag is their OR).
    var m = neg_inf_f32();
    var l = 0.0;
    var nan = 0u;
    if (!first) {
        let at = 3u * (min(r0 + rr, p.tq - 1u) * p.hq + h);
        m = f_state[at];
        l = f_state[at + 1u];
        nan = u32(f_state[at + 2u]);
    }
    var o = o8_zero();
    if (!first) {
        for (var r = 0u; r < 4u; r = r + 1u) {
            let x = get_out(r0 + 4u * ry + r, h, cx);
            o = o8_set(o, r, x[0], x[1]);
        }
    }
    let lb = list_bounds(0u, qt, lid);
    let span = pass_range(lb.x, lb.y);
    // Tiles are fetched into registers ahead of their staging: K of the first tile here, of
    // each next one during the P V products, V of a tile during its scores.
    var kx = fetch_k_of(span.x, span, kh, lid);
    for (var it = span.x; it < span.y; it = it + 1u) {
        let k0 = begin_tile(it, lid);
        let vx = stage_k_fetch_v(kx, k0, kh, lid);
        workgroupBarrier();
        // Scores: block sb is rows 4 ty .. 4 ty + 3 against keys tx and tx + BK / 2.
        for (var sb = lid; sb < BQ * BK / 8u; sb = sb + WG) {
            let ty = sb / (BK / 2u);
            let tx = sb % (BK / 2u);
            let s = score_block(ty, tx, k0);
            buf[SC + tx * PSQ + ty] = s.x;
            buf[SC + (tx + BK / 2u) * PSQ + ty] = s.y;
        }
        workgroupBarrier();
        // K is read no more: V in its place (flagging non-finite values).
        stage_v(vx, lid);
        var cm = neg_inf_f32();
        for (var j = part; j < BK; j = j + NPART) {
            let s = score_at(rr, j);
            if (poisons(s)) {
                nan = 1u;
            } else if (s > cm) {
                cm = s;
            }
        }
        stat_m[lid] = cm;
        workgroupBarrier();
        for (var u = 0u; u < NPART; u = u + 1u) {
            let x = stat_m[rr + BQ * u];
            cm = select(cm, x, x > cm);
        }
        let m_new = select(m, cm, cm > m);
        var alpha = 0.0;
        if (m != neg_inf_f32()) {
            alpha = exp(m - m_new);
        }
        var sum = 0.0;
        for (var j = part; j < BK; j = j + NPART) {
            let s = score_at(rr, j);
            var pr = 0.0;
            if (s != neg_inf_f32() && !poisons(s)) {
                pr = select(exp(s - m_new), s - m_new, (ABLATE & 2u) != 0u);
            }
            buf[SC + j * PSQ + rr / 4u][rr % 4u] = pr;
            sum = sum + pr;
        }
        stat_s[lid] = sum;
        if (part == 0u) {
            row_a[rr / 4u][rr % 4u] = alpha;
        }
        m = m_new;
        workgroupBarrier(); // the probabilities, alphas, partial sums and the V tile
        sum = 0.0;
        for (var u = 0u; u < NPART; u = u + 1u) {
            sum = sum + stat_s[rr + BQ * u];
        }
        l = l * alpha + sum;
        kx = fetch_k_of(it + 1u, span, kh, lid);
        o = o8_scale(o, row_a[ry]);
        if ((ABLATE & 4u) == 0u) {
            o = acc_rows(o, SC + ry, PSQ, KV + cx, BK, atomicLoad(&bad[0]) != 0u);
        }
        workgroupBarrier();
    }
    // The row's NaN flag: the OR of its threads' flags (stat_m is free: the loop ended on a
    // barrier, or never read it).
    stat_m[lid] = f32(nan);
    workgroupBarrier();
    var row_bad = false;
    for (var u = 0u; u < NPART; u = u + 1u) {
        row_bad = row_bad || (stat_m[rr + BQ * u] != 0.0);
    }
    if (part == 0u) {
        let r = r0 + rr;
        if (r < p.tq) {
            if (!last) {
                let at = 3u * (r * p.hq + h);
                f_state[at] = m;
                f_state[at + 1u] = l;
                f_state[at + 2u] = select(0.0, 1.0, row_bad);
            } else {
                var lse = neg_inf_f32();
                if (row_bad) {
                    lse = nan_f32();
                } else if (l > 0.0) {
                    lse = m + log(l);
                }
                f_lse[r * p.hq + h] = lse;
            }
        }
        row_a[rr / 4u][rr % 4u] = select(l, nan_f32(), row_bad);
    }
    workgroupBarrier();
    let ls = row_a[ry];
    for (var r = 0u; r < 4u; r = r + 1u) {
        let row = r0 + 4u * ry + r;
        if (row >= p.tq) {
            break;
        }
        let x = o8_row(o, r);
        if (!last) {
            // Not the last pass: keep the unnormalised accumulators.
            put_out(row, h, cx, x[0], x[1]);
        } else {
            let lv = ls[r];
            var a = vec4<f32>(0.0);
            var b = vec4<f32>(0.0);
            if (is_nan_f32(lv)) {
                a = vec4<f32>(nan_f32());
                b = a;
            } else if (lv > 0.0) {
                a = x[0] / lv;
                b = x[1] / lv;
            }
            put_out(row, h, cx, a, b);
        }
    }
}
