// attention_dq_sg.wgsl: the dq kernel on subgroups (after attention_dq.wgsl, whose bindings,
// row statistics and buffer it shares, and attention_regs.wgsl). The host chooses it
// (`AttnCfg::sg` on the dq kind) where a row group's LANES = DP / 4 = BK lanes hold one key
// each for the scores and 4 dims each of dq, and full subgroups of at least LANES lanes fill
// the workgroup of (BQ / 4) * LANES threads (256 at head dim 128).
//
// attn_dq stages Q and d_out again with every key tile (four stagings and five barriers a
// tile): here each lane holds its row group's q and d_out rows in registers, the head dim split
// over 8 lanes (as the forward's QREG), for the whole key list, so a key tile is K and V staged
// unpadded, both products (S = q.k and dP = d_out.v) reduce-scattered to the lane of their key,
// dS = P (dP - dsum) formed in registers where visible, and dq += dS K: two stagings and three
// barriers a tile. The K tile is flagged when it holds a non-finite value: dq then takes the
// careful path that skips zero weights (a NaN key reaches only the rows that see it; a NaN
// value reaches dS only where visible, so V needs no flag).

const LANES: u32 = BK;
// K and V unpadded (rows DP4 vec4 apart), then dS key-major as the forward's P.
const SG_K: u32 = 0u;
const SG_V: u32 = BK * DP4;
const SG_S: u32 = 2u * BK * DP4;

// Elements 4 c4 .. 4 c4 + 3 of the row of q or d_out at `at`, for `load_regs`.
fn reg_row4(at: u32, c4: u32, dout: bool) -> vec4<f32> {
    if (dout) {
        return d_out_row4(at, c4);
    }
    return q_row4(at, c4);
}

@compute @workgroup_size(WG)
fn attn_dq_sg(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
              @builtin(local_invocation_index) lid: u32,
              @builtin(subgroup_invocation_id) lane: u32,
              @builtin(subgroup_size) sgs: u32, @builtin(subgroup_id) sg: u32) {
    let g = wg_linear(wid, nwg);
    if (g >= q_tile_groups()) {
        return;
    }
    let tile = begin_q_tile(g, lid);
    let qt = tile.x;
    let h = tile.y;
    let kh = h / p.group;
    let r0 = qt * BQ;
    load_row_stats(r0, h, lid);
    let role = sg * sgs + lane;
    let ty = role / LANES;
    let tx = role % LANES;
    let qr = load_regs(r0 + 4u * ty, h, tx % 8u, false);
    let dr = load_regs(r0 + 4u * ty, h, tx % 8u, true);
    // dq of rows 4 ty .. 4 ty + 3 at dims 4 tx .. 4 tx + 3.
    var o = R4(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
    if ((p.flags & FIRST) == 0u) {
        o = R4(dq_get4(r0 + 4u * ty, h, tx), dq_get4(r0 + 4u * ty + 1u, h, tx),
               dq_get4(r0 + 4u * ty + 2u, h, tx), dq_get4(r0 + 4u * ty + 3u, h, tx));
    }
    // The K flag is cleared once, before list_bounds' barrier, and stays set for the rest
    // of the list: each tile stages K first, so a clear inside the loop would have no barrier
    // before its writers (`clear_flags`). A set flag only costs the careful path.
    clear_flags(lid);
    // The row statistics (and intervals) are visible after this uniform load's barrier.
    let lb = list_bounds(0u, qt, lid);
    let span = pass_range(lb.x, lb.y);
    for (var it = span.x; it < span.y; it = it + 1u) {
        let w = tiles[p.qlist_at + it];
        tile_full = (w & FULL) != 0u;
        let k0 = (w & ~FULL) * BK;
        put_kv(SG_K, DP4, fetch_kv(1u, k0, kh, lid), lid, 1u);
        put_kv(SG_V, DP4, fetch_kv(2u, k0, kh, lid), lid, 0u);
        workgroupBarrier();
        let s = scores_regs(qr, SG_K, tx / 8u, tx % 8u);
        let dp = scores_regs(dr, SG_V, tx / 8u, tx % 8u);
        var x = vec4<f32>(0.0);
        for (var e = 0u; e < 4u; e = e + 1u) {
            let i = 4u * ty + e;
            if (visible(i, k0 + tx)) {
                x[e] = prob(p.scale * s[e], row_l[i]) * (dp[e] - row_d[i]);
            }
        }
        buf[SG_S + tx * PSQ + ty] = x;
        workgroupBarrier();
        o = acc4(o, SG_S + ty, PSQ, SG_K + tx, DP4, BK, atomicLoad(&bad[0]) != 0u);
        workgroupBarrier();
    }
    // Scaled once, on the last pass.
    let f = select(1.0, p.scale, (p.flags & LAST) != 0u);
    for (var r = 0u; r < 4u; r = r + 1u) {
        let row = r0 + 4u * ty + r;
        if (row >= p.tq) {
            break;
        }
        let a = f * r4_row(o, r);
        for (var e = 0u; e < 4u; e = e + 1u) {
            let c = 4u * tx + e;
            if (c < p.d) {
                b_dq[dq_at(row, h, c)] = a[e];
            }
        }
    }
}

// Dims 4 tx .. 4 tx + 3 of dq row r of head h as the previous pass left them (zero past D;
// rows past tq clamped, never written).
fn dq_get4(r: u32, h: u32, tx: u32) -> vec4<f32> {
    var a = vec4<f32>(0.0);
    let row = min(r, p.tq - 1u);
    for (var e = 0u; e < 4u; e = e + 1u) {
        if (4u * tx + e < p.d) {
            a[e] = b_dq[dq_at(row, h, 4u * tx + e)];
        }
    }
    return a;
}
