// attention_fwd_sg.wgsl: the forward with its online softmax in registers and subgroup
// shuffles (after attention_fwd.wgsl, whose layout, bindings and helpers it shares), on twice
// the plain forward's threads. The host chooses it (`AttnCfg::sg`) where a row group's LANES =
// DP / 4 lanes cover the head dim 4 dims each and hold KPL keys each (BK = KPL LANES: DP 128
// with 32 x 32 tiles, or 32 x 64 with KPL 2; WG = (BQ / 4) * LANES = 256), and the adapter's
// subgroups have at least LANES lanes and fill the workgroup.
//
// Thread roles come from the subgroup builtins (role = subgroup_id * subgroup_size + lane, a
// bijection onto 0..WG with full subgroups): ty = role / LANES is the 4-row group of both the
// scores and the accumulators, tx = role % LANES the score blocks' keys (tx + c LANES, c <
// KPL) and the accumulators' dims 4 tx .. 4 tx + 3. The LANES threads of a row group are then
// aligned lanes of one subgroup, so a row's max and sum are shuffle-xor butterflies over them
// (a fixed order: every lane gets the same bits, and the result is deterministic). Per key
// tile, four barriers: stage K and fetch V; scores (4 rows x KPL keys, `dots4` from the staged
// query tile, or `scores_regs` (attention_regs.wgsl) from query registers with QREG), softmax, P into SC; stage V;
// O = alpha O + P V (4 rows x 4 dims, `acc4`). The scores never pass through workgroup memory
// and no partial maxima or sums are exchanged. KPL 2 halves the tiles, hence the barriers and
// the staging rounds, per key; its K and V tiles fit 48 KiB only without the query tile.

const LANES: u32 = BK / KPL;

// A q row's elements 4 c4 .. 4 c4 + 3, for `load_regs` (the forward holds no d_out).
fn reg_row4(at: u32, c4: u32, dout: bool) -> vec4<f32> {
    return q_row4(at, c4);
}
//
// Why twice the threads: the NVIDIA Vulkan driver gives a multiprocessor ~48 KiB of workgroup
// memory in all, so this ~39 KiB workgroup runs alone on its multiprocessor, and 256 threads
// hide more latency there than 128 (docs/PERF.md).

// Butterflies over aligned groups of n lanes (a power of two, at most the subgroup size): a
// fixed order, so every lane of a group gets the same bits.
fn lanes_max(x: vec4<f32>, n: u32) -> vec4<f32> {
    var r = x;
    for (var s = 1u; s < n; s = s * 2u) {
        r = max(r, subgroupShuffleXor(r, s));
    }
    return r;
}

fn lanes_sum(x: vec4<f32>, n: u32) -> vec4<f32> {
    var r = x;
    for (var s = 1u; s < n; s = s * 2u) {
        r = r + subgroupShuffleXor(r, s);
    }
    return r;
}

fn lanes_any(x: vec4<bool>, n: u32) -> vec4<bool> {
    var r = select(vec4<u32>(0u), vec4<u32>(1u), x);
    for (var s = 1u; s < n; s = s * 2u) {
        r = r | subgroupShuffleXor(r, s);
    }
    return r != vec4<u32>(0u);
}

// Which lanes hold a score that makes its row NaN (NaN or +inf, as `poisons`).
fn poisons4(x: vec4<f32>) -> vec4<bool> {
    let b = bitcast<vec4<u32>>(x);
    let special = (b & vec4<u32>(0x7fffffffu)) >= vec4<u32>(0x7f800000u);
    return special & (b != vec4<u32>(0xff800000u));
}

// exp(x - m) where x is a score (0 where x is -inf: masked, or no probability).
fn probs4(x: vec4<f32>, m: vec4<f32>) -> vec4<f32> {
    let ninf = vec4<f32>(neg_inf_f32());
    let e = select(exp(x - m), x - m, (ABLATE & 2u) != 0u);
    return select(e, vec4<f32>(0.0), x == ninf);
}

// Dot products over DP of the 4 staged rows at a, a + QS, a + 2 QS, a + 3 QS with the row at
// b: component r is row a + r QS.
fn dots4(a: u32, b: u32) -> vec4<f32> {
    var x0 = vec4<f32>(0.0); var x1 = vec4<f32>(0.0);
    var x2 = vec4<f32>(0.0); var x3 = vec4<f32>(0.0);
    for (var c = 0u; c < DP4; c = c + 1u) {
        let u = buf[b + c];
        x0 = fma(buf[a + c], u, x0);
        x1 = fma(buf[a + QS + c], u, x1);
        x2 = fma(buf[a + 2u * QS + c], u, x2);
        x3 = fma(buf[a + 3u * QS + c], u, x3);
    }
    return vec4<f32>(hsum(x0), hsum(x1), hsum(x2), hsum(x3));
}

// Rows 4 ty .. 4 ty + 3 against key j of the K tile at k0 (component e: row e): the scaled
// scores where visible, -inf elsewhere (QREG: from the query registers, the key group j / 8
// and this lane's slice j % 8 of it; else from the staged query tile).
fn key_scores(qr: array<R4, NI>, ty: u32, j: u32, k0: u32) -> vec4<f32> {
    var s = vec4<f32>(0.0);
    if ((ABLATE & 1u) == 0u) {
        if (QREG) {
            s = scores_regs(qr, KV, j / 8u, j % 8u);
        } else {
            s = dots4(QT + 4u * ty * QS, KV + j * QS);
        }
    }
    var x = vec4<f32>(neg_inf_f32());
    for (var e = 0u; e < 4u; e = e + 1u) {
        if (visible(4u * ty + e, k0 + j)) {
            x[e] = p.scale * s[e];
        }
    }
    return x;
}

// Dims 4 tx .. 4 tx + 3 of out row r (< tq) of head h, those inside D.
fn put_out4(r: u32, h: u32, tx: u32, a: vec4<f32>) {
    let at = (r * p.hq + h) * p.d;
    for (var e = 0u; e < 4u; e = e + 1u) {
        if (4u * tx + e < p.d) {
            f_out[at + 4u * tx + e] = a[e];
        }
    }
}

fn get_out4(r: u32, h: u32, tx: u32) -> vec4<f32> {
    var a = vec4<f32>(0.0);
    let at = row_at(r, h);
    for (var e = 0u; e < 4u; e = e + 1u) {
        if (4u * tx + e < p.d) {
            a[e] = f_out[at + 4u * tx + e];
        }
    }
    return a;
}

@compute @workgroup_size(WG)
fn attn_fwd_sg(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
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
    if (!QREG) {
        stage_q(QT, r0, h, lid, 0u);
    }
    let first = (p.flags & FIRST) != 0u;
    let last = (p.flags & LAST) != 0u;
    let role = sg * sgs + lane;
    let ty = role / LANES;
    let tx = role % LANES;
    var qr: array<R4, NI>;
    if (QREG) {
        qr = load_regs(r0 + 4u * ty, h, tx % 8u, false);
    }
    let ninf = vec4<f32>(neg_inf_f32());
    // Rows 4 ty .. 4 ty + 3: the online-softmax state (the same in each lane of the group);
    // `nan` covers this lane's scores (the rows' flags are the OR over the group).
    var m = ninf;
    var l = vec4<f32>(0.0);
    var nan = vec4<bool>(false);
    var o = R4(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
    if (!first) {
        for (var r = 0u; r < 4u; r = r + 1u) {
            let at = 3u * (min(r0 + 4u * ty + r, p.tq - 1u) * p.hq + h);
            m[r] = f_state[at];
            l[r] = f_state[at + 1u];
            nan[r] = f_state[at + 2u] != 0.0;
        }
        o = R4(get_out4(r0 + 4u * ty, h, tx), get_out4(r0 + 4u * ty + 1u, h, tx),
               get_out4(r0 + 4u * ty + 2u, h, tx), get_out4(r0 + 4u * ty + 3u, h, tx));
    }
    let lb = list_bounds(0u, qt, lid);
    let span = pass_range(lb.x, lb.y);
    var kx = fetch_k_of(span.x, span, kh, lid);
    for (var it = span.x; it < span.y; it = it + 1u) {
        let k0 = begin_tile(it, lid);
        let vx = stage_k_fetch_v(kx, k0, kh, lid);
        workgroupBarrier();
        // The lane's keys tx and, with KPL 2, tx + LANES: their scores, masked to -inf.
        let x0 = key_scores(qr, ty, tx, k0);
        var x1 = ninf;
        if (KPL == 2u) {
            x1 = key_scores(qr, ty, tx + LANES, k0);
        }
        let p0 = poisons4(x0);
        let p1 = poisons4(x1);
        nan = nan | p0 | p1;
        let y0 = select(x0, ninf, p0);
        let y1 = select(x1, ninf, p1);
        let m_new = max(m, lanes_max(max(y0, y1), LANES));
        let alpha = select(exp(m - m_new), vec4<f32>(0.0), m == ninf);
        let e0 = probs4(y0, m_new);
        var esum = e0;
        buf[SC + tx * PSQ + ty] = e0;
        if (KPL == 2u) {
            let e1 = probs4(y1, m_new);
            esum = esum + e1;
            buf[SC + (tx + LANES) * PSQ + ty] = e1;
        }
        l = l * alpha + lanes_sum(esum, LANES);
        m = m_new;
        workgroupBarrier(); // K is read no more; P is written
        stage_v(vx, lid);
        workgroupBarrier(); // V and its non-finite flag
        kx = fetch_k_of(it + 1u, span, kh, lid);
        o = R4(o.r0 * alpha.x, o.r1 * alpha.y, o.r2 * alpha.z, o.r3 * alpha.w);
        if ((ABLATE & 4u) == 0u) {
            o = acc4(o, SC + ty, PSQ, KV + tx, QS, BK, atomicLoad(&bad[0]) != 0u);
        }
        workgroupBarrier();
    }
    let row_bad = lanes_any(nan, LANES);
    for (var r = 0u; r < 4u; r = r + 1u) {
        let row = r0 + 4u * ty + r;
        if (row >= p.tq) {
            break;
        }
        if (tx == 0u) {
            if (!last) {
                let at = 3u * (row * p.hq + h);
                f_state[at] = m[r];
                f_state[at + 1u] = l[r];
                f_state[at + 2u] = select(0.0, 1.0, row_bad[r]);
            } else {
                var lse = neg_inf_f32();
                if (row_bad[r]) {
                    lse = nan_f32();
                } else if (l[r] > 0.0) {
                    lse = m[r] + log(l[r]);
                }
                f_lse[row * p.hq + h] = lse;
            }
        }
        let xo = r4_row(o, r);
        if (!last) {
            put_out4(row, h, tx, xo);
        } else {
            var a = vec4<f32>(0.0);
            if (row_bad[r]) {
                a = vec4<f32>(nan_f32());
            } else if (l[r] > 0.0) {
                a = xo / l[r];
            }
            put_out4(row, h, tx, a);
        }
    }
}
