// attention_regs.wgsl: what the subgroup kernels (attention_fwd_sg.wgsl, attention_dq_sg.wgsl)
// share, after attention.wgsl and their kernel's layout file: a row group's rows held in
// registers with the head dim split over 8 lanes, the scores of a staged tile against them
// reduce-scattered over those lanes, and the 4-rows-by-4-dims accumulation over a tile.

// ---- Rows in registers ----------------------------------------------------------------------
//
// The forward's dots4 reads 4 query rows (broadcasts) and one key row from workgroup memory per vec4 of the
// head dim: 5 loads per 4 vec4 FMAs, and the query tile takes ~17 KiB. With QREG the 4 rows
// live in registers instead, the head dim split over the 8 aligned lanes of each key group
// (lane ds of 8 holds vec4 columns 8 i + ds, i < NI): a lane takes 4 rows x 8 keys of partial
// dot products, 1 load per 4 vec4 FMAs, and a reduce-scatter over its 8 lanes (3 shuffle-xor
// steps on 4, 2, 1 vec4) leaves it the full scores of its own key, tx = 8 kg + ds, as dots4
// would. Slot t of lane ds holds key 8 kg + (t ^ ds): then the partner of every step holds
// the same key in the slot it sends, so no lane selects what to keep. K is staged unpadded
// (`put_kv` at stride DP4): lane ds reads column 8 i + ds of 8 distinct rows, one bank group
// each. The dq kernel holds q and d_out rows this way and scores both K and V.

const NI: u32 = DP4 / 8u;

// Four rows' vec4: a thread's accumulators (rows 0..3 at its 4 dims), or its query
// registers at one column.
struct R4 {
    r0: vec4<f32>,
    r1: vec4<f32>,
    r2: vec4<f32>,
    r3: vec4<f32>,
}

// The thread's registers of q (`dout` false) or d_out rows: [i] holds rows r .. r + 3 at
// column 8 i + ds (zero past D). The kernel's file says how a row is read (`reg_row4`).
fn load_regs(r: u32, h: u32, ds: u32, dout: bool) -> array<R4, NI> {
    let at = vec4<u32>(row_at(r, h), row_at(r + 1u, h), row_at(r + 2u, h), row_at(r + 3u, h));
    return regs_at(at, ds, dout);
}

// The registers of the four rows starting at elements `at` (as `load_regs`; `which` picks the
// tensor for `reg_row4`).
fn regs_at(at: vec4<u32>, ds: u32, which: bool) -> array<R4, NI> {
    var qr: array<R4, NI>;
    for (var i = 0u; i < NI; i = i + 1u) {
        let c = 8u * i + ds;
        qr[i] = R4(reg_row4(at.x, c, which), reg_row4(at.y, c, which),
                   reg_row4(at.z, c, which), reg_row4(at.w, c, which));
    }
    return qr;
}

// s + a . b as four FMAs.
fn dot_acc(s: f32, a: vec4<f32>, b: vec4<f32>) -> f32 {
    return fma(a.w, b.w, fma(a.z, b.z, fma(a.y, b.y, fma(a.x, b.x, s))));
}

// acc + the 4 query vec4 (one a row) dotted with the key slice u (component e: row e).
fn rows_acc(acc: vec4<f32>, q: R4, u: vec4<f32>) -> vec4<f32> {
    return vec4<f32>(dot_acc(acc.x, q.r0, u), dot_acc(acc.y, q.r1, u),
                     dot_acc(acc.z, q.r2, u), dot_acc(acc.w, q.r3, u));
}

// The 4 rows' scores against row 8 kg + ds of the tile staged unpadded at `tile` (component e:
// row e). The eight slots are named registers (an array indexed by a loop counter may be put
// in local memory), slot t reading tile row 8 kg + (t ^ ds).
fn scores_regs(qr: array<R4, NI>, tile: u32, kg: u32, ds: u32) -> vec4<f32> {
    var a0 = vec4<f32>(0.0); var a1 = vec4<f32>(0.0);
    var a2 = vec4<f32>(0.0); var a3 = vec4<f32>(0.0);
    var a4 = vec4<f32>(0.0); var a5 = vec4<f32>(0.0);
    var a6 = vec4<f32>(0.0); var a7 = vec4<f32>(0.0);
    for (var i = 0u; i < NI; i = i + 1u) {
        let q = qr[i];
        let at = tile + 8u * kg * DP4 + 8u * i + ds;
        a0 = rows_acc(a0, q, buf[at + ds * DP4]);
        a1 = rows_acc(a1, q, buf[at + (1u ^ ds) * DP4]);
        a2 = rows_acc(a2, q, buf[at + (2u ^ ds) * DP4]);
        a3 = rows_acc(a3, q, buf[at + (3u ^ ds) * DP4]);
        a4 = rows_acc(a4, q, buf[at + (4u ^ ds) * DP4]);
        a5 = rows_acc(a5, q, buf[at + (5u ^ ds) * DP4]);
        a6 = rows_acc(a6, q, buf[at + (6u ^ ds) * DP4]);
        a7 = rows_acc(a7, q, buf[at + (7u ^ ds) * DP4]);
    }
    let r0 = a0 + subgroupShuffleXor(a4, 4u);
    let r1 = a1 + subgroupShuffleXor(a5, 4u);
    let r2 = a2 + subgroupShuffleXor(a6, 4u);
    let r3 = a3 + subgroupShuffleXor(a7, 4u);
    let s0 = r0 + subgroupShuffleXor(r2, 2u);
    let s1 = r1 + subgroupShuffleXor(r3, 2u);
    return s0 + subgroupShuffleXor(s1, 1u);
}

// Where row r of head h starts in a (Tq, Hq, D) tensor (q, out), rows past tq clamped to the
// last (their scores are never visible, their outputs never written).
fn row_at(r: u32, h: u32) -> u32 {
    return (min(r, p.tq - 1u) * p.hq + h) * p.d;
}

fn r4_row(o: R4, r: u32) -> vec4<f32> {
    switch (r) {
        case 0u: { return o.r0; }
        case 1u: { return o.r1; }
        case 2u: { return o.r2; }
        default: { return o.r3; }
    }
}

// o += sum over j < n of w_j (x) V_j, w_j = buf[w + j ws] (the 4 rows' weights), V_j =
// buf[t + j ts] (a tile's rows `ts` vec4 apart); `careful` as acc_rows.
fn acc4(o: R4, w: u32, ws: u32, t: u32, ts: u32, n: u32, careful: bool) -> R4 {
    var r = o;
    if (!careful) {
        for (var j = 0u; j < n; j = j + 1u) {
            let x = buf[w + j * ws];
            let u = buf[t + j * ts];
            r.r0 = fma(vec4<f32>(x.x), u, r.r0);
            r.r1 = fma(vec4<f32>(x.y), u, r.r1);
            r.r2 = fma(vec4<f32>(x.z), u, r.r2);
            r.r3 = fma(vec4<f32>(x.w), u, r.r3);
        }
        return r;
    }
    let zero = vec4<f32>(0.0);
    for (var j = 0u; j < n; j = j + 1u) {
        let x = buf[w + j * ws];
        let u = buf[t + j * ts];
        r.r0 = r.r0 + select(zero, x.x * u, nonzero(x.x));
        r.r1 = r.r1 + select(zero, x.y * u, nonzero(x.y));
        r.r2 = r.r2 + select(zero, x.z * u, nonzero(x.z));
        r.r3 = r.r3 + select(zero, x.w * u, nonzero(x.w));
    }
    return r;
}
