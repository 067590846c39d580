// attention_dkdv_sg.wgsl: the dk/dv kernel on subgroups (after attention_dkdv.wgsl, whose
// bindings and buffer it shares, and attention_regs.wgsl). The host chooses it (`AttnCfg::sg`
// on the dk/dv kind) where a key group's LANES = DP / 4 = BQ lanes hold one query row each
// for the scores and 4 dims each of dk and dv, and full subgroups of at least LANES lanes fill
// the workgroup of (BK / 4) * LANES threads (256 at head dim 128).
//
// attn_dkdv stages K and V again with every query tile, and Q twice (six barriers a tile):
// here each lane holds its key group's k and v rows in registers, the head dim split over 8
// lanes (the layout of the forward's QREG), for the whole list, so a query tile is Q and
// d_out staged unpadded, both products (S^T = k.q and dP^T = v.d_out) reduce-scattered to the
// lane of their query row, P and dS formed in registers where visible, then dv += P^T d_out
// and dk += dS^T Q: two stagings and three barriers a tile. Q and d_out are flagged when they
// hold a non-finite value: their accumulation then takes the careful path that skips zero
// weights, for that tile and the rest of the workgroup's list.

const LANES: u32 = BQ;
// Q and d_out unpadded (rows DP4 vec4 apart), then P and dS query-major: query row j's 4-key
// group g at buf[SG_P + j PSK + g].
const SG_Q: u32 = 0u;
const SG_O: u32 = BQ * DP4;
const SG_P: u32 = 2u * BQ * DP4;
const SG_D: u32 = 2u * BQ * DP4 + BQ * PSK;

// Elements 4 c4 .. 4 c4 + 3 of the row of k (`v` false) or v at `at`, for `load_regs`.
fn reg_row4(at: u32, c4: u32, v: bool) -> vec4<f32> {
    if (v) {
        return v_row4(at, c4);
    }
    return k_row4(at, c4);
}

// Where key `key` of kv head kh starts in k or v (keys past tk clamped to the last: their
// scores are never visible, their gradients never written).
fn key_at(key: u32, kh: u32) -> u32 {
    return (min(key, p.tk - 1u) * p.hkv + kh) * p.d;
}

// The thread's registers of k (`v` false) or v rows: [i] holds keys key .. key + 3 at column
// 8 i + ds, as `load_regs` (whose rows are queries).
fn load_key_regs(key: u32, kh: u32, ds: u32, v: bool) -> array<R4, NI> {
    let at = vec4<u32>(key_at(key, kh), key_at(key + 1u, kh), key_at(key + 2u, kh),
                       key_at(key + 3u, kh));
    return regs_at(at, ds, v);
}

// Dims 4 tx .. 4 tx + 3 of key `key`'s row of dk (`dv` false) or dv, as the previous pass
// left them (zero past D).
fn kv_get4(key: u32, kh: u32, tx: u32, dv: bool) -> vec4<f32> {
    var a = vec4<f32>(0.0);
    for (var e = 0u; e < 4u; e = e + 1u) {
        let c = 4u * tx + e;
        if (c < p.d) {
            let at = kv_at(min(key, p.tk - 1u), kh, c);
            a[e] = select(b_dk[at], b_dv[at], dv);
        }
    }
    return a;
}

@compute @workgroup_size(WG)
fn attn_dkdv_sg(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32,
                @builtin(subgroup_invocation_id) lane: u32,
                @builtin(subgroup_size) sgs: u32, @builtin(subgroup_id) sg: u32) {
    let nkt = (p.tk + BK - 1u) / BK;
    let g = wg_linear(wid, nwg);
    if (g >= nkt * p.hkv) {
        return;
    }
    let kt = k_tile_of(g / p.hkv);
    let kh = g % p.hkv;
    let k0 = kt * BK;
    let role = sg * sgs + lane;
    let ty = role / LANES;
    let tx = role % LANES;
    let key = k0 + 4u * ty;
    let kr = load_key_regs(key, kh, tx % 8u, false);
    let vr = load_key_regs(key, kh, tx % 8u, true);
    // dk and dv of keys 4 ty .. 4 ty + 3 at dims 4 tx .. 4 tx + 3.
    let zero = vec4<f32>(0.0);
    var dk = R4(zero, zero, zero, zero);
    var dv = R4(zero, zero, zero, zero);
    if ((p.flags & FIRST) == 0u) {
        dk = R4(kv_get4(key, kh, tx, false), kv_get4(key + 1u, kh, tx, false),
                kv_get4(key + 2u, kh, tx, false), kv_get4(key + 3u, kh, tx, false));
        dv = R4(kv_get4(key, kh, tx, true), kv_get4(key + 1u, kh, tx, true),
                kv_get4(key + 2u, kh, tx, true), kv_get4(key + 3u, kh, tx, true));
    }
    // The flags are cleared once, before list_bounds' barrier, and stay set for the rest of
    // the list: the steps stage their flagged tiles first, so a clear inside the loop would
    // have no barrier before those writers (`clear_flags`). A set flag only costs the careful
    // path.
    clear_flags(lid);
    let lb = list_bounds(p.koff_at, kt, lid);
    // One flat loop over (query tile, query head of this kv head) pairs.
    let span = pass_range(lb.x * p.group, lb.y * p.group);
    for (var w = span.x; w < span.y; w = w + 1u) {
        let step = begin_kv_step(w, kh, lid);
        let r0 = step.x;
        let h = step.y;
        // Q flags bad[1] (dk accumulates dS^T Q), d_out bad[0] (dv accumulates P^T d_out).
        stage_q_rows(SG_Q, DP4, r0, h, lid, 2u);
        stage_dout_rows(SG_O, DP4, r0, h, lid, 1u);
        workgroupBarrier();
        // Keys 4 ty + e against query row tx.
        let s = scores_regs(kr, SG_Q, tx / 8u, tx % 8u);
        let dp = scores_regs(vr, SG_O, tx / 8u, tx % 8u);
        var pr = vec4<f32>(0.0);
        var ds = vec4<f32>(0.0);
        for (var e = 0u; e < 4u; e = e + 1u) {
            if (visible(tx, key + e)) {
                pr[e] = prob(p.scale * s[e], row_l[tx]);
                ds[e] = pr[e] * (dp[e] - row_d[tx]);
            }
        }
        buf[SG_P + tx * PSK + ty] = pr;
        buf[SG_D + tx * PSK + ty] = ds;
        workgroupBarrier();
        dv = acc4(dv, SG_P + ty, PSK, SG_O + tx, DP4, BQ, atomicLoad(&bad[0]) != 0u);
        dk = acc4(dk, SG_D + ty, PSK, SG_Q + tx, DP4, BQ, atomicLoad(&bad[1]) != 0u);
        workgroupBarrier();
    }
    // dk scaled once, on the last pass.
    let f = select(1.0, p.scale, (p.flags & LAST) != 0u);
    for (var r = 0u; r < 4u; r = r + 1u) {
        let kk = key + r;
        if (kk >= p.tk) {
            break;
        }
        let xk = f * r4_row(dk, r);
        let xv = r4_row(dv, r);
        for (var e = 0u; e < 4u; e = e + 1u) {
            let c = 4u * tx + e;
            if (c < p.d) {
                b_dk[kv_at(kk, kh, c)] = xk[e];
                b_dv[kv_at(kk, kh, c)] = xv[e];
            }
        }
    }
}
