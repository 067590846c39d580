// attention_fwd_sg.wgsl: the forward with its online softmax in registers and subgroup
// shuffles (after attention_fwd.wgsl, whose layout, bindings and helpers it shares). The host
// chooses it (`AttnCfg::sg`) where each thread's 4 x 2 score block lies on the 4 rows it
// accumulates (BQ BK / 8 == WG and BK / 2 == DP / 8: DP 128 with 32 x 32 tiles) and the
// adapter's subgroups have at least BK / 2 lanes and fill the workgroup.
//
// Thread roles come from the subgroup builtins (role = subgroup_id * subgroup_size + lane, a
// bijection onto 0..WG with full subgroups): ty = role / (BK / 2) is the 4-row group of both
// the scores and the accumulators, tx = role % (BK / 2) the score block's keys (tx and
// tx + BK / 2) and the accumulators' dims. The BK / 2 threads of a row group are then aligned
// lanes of one subgroup, so a row's max and sum are shuffle-xor butterflies over them (a fixed
// order: every lane gets the same bits, and the result is deterministic). Per key tile, four
// barriers: stage K and fetch V; scores, softmax, P into SC; stage V; O = alpha O + P V. The
// scores never pass through workgroup memory and no partial maxima or sums are exchanged.

// The butterfly over the BK / 2 lanes of a row group.
fn rows_max(x: vec4<f32>) -> vec4<f32> {
    var r = x;
    for (var s = 1u; s < BK / 2u; s = s * 2u) {
        r = max(r, subgroupShuffleXor(r, s));
    }
    return r;
}

fn rows_sum(x: vec4<f32>) -> vec4<f32> {
    var r = x;
    for (var s = 1u; s < BK / 2u; s = s * 2u) {
        r = r + subgroupShuffleXor(r, s);
    }
    return r;
}

fn rows_any(x: vec4<bool>) -> vec4<bool> {
    var r = select(vec4<u32>(0u), vec4<u32>(1u), x);
    for (var s = 1u; s < BK / 2u; s = s * 2u) {
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

@compute @workgroup_size(WG)
fn attn_fwd_sg(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32,
               @builtin(subgroup_invocation_id) lane: u32,
               @builtin(subgroup_size) sgs: u32, @builtin(subgroup_id) sg: u32) {
    let nqt = (p.tq + BQ - 1u) / BQ;
    let g = wg_linear(wid, nwg);
    if (g >= nqt * p.hq) {
        return;
    }
    let qt = q_tile_of(g / p.hq);
    let h = g % p.hq;
    let kh = h / p.group;
    let r0 = qt * BQ;
    tile_r0 = r0;
    stage_q(QT, r0, h, lid, 0u);
    load_intervals(r0, lid);
    let first = (p.flags & FIRST) != 0u;
    let last = (p.flags & LAST) != 0u;
    let role = sg * sgs + lane;
    let ty = role / (BK / 2u);
    let tx = role % (BK / 2u);
    let ninf = vec4<f32>(neg_inf_f32());
    // Rows 4 ty .. 4 ty + 3: the online-softmax state (the same in each lane of the group);
    // `nan` covers this lane's scores (the rows' flags are the OR over the group).
    var m = ninf;
    var l = vec4<f32>(0.0);
    var nan = vec4<bool>(false);
    var o = o8_zero();
    if (!first) {
        for (var r = 0u; r < 4u; r = r + 1u) {
            let at = 3u * (min(r0 + 4u * ty + r, p.tq - 1u) * p.hq + h);
            m[r] = f_state[at];
            l[r] = f_state[at + 1u];
            nan[r] = f_state[at + 2u] != 0.0;
            let x = get_out(r0 + 4u * ty + r, h, tx);
            o = o8_set(o, r, x[0], x[1]);
        }
    }
    let lb = list_bounds(0u, qt, lid);
    let span = pass_range(lb.x, lb.y);
    var kx = fetch_k_of(span.x, span, kh, lid);
    for (var it = span.x; it < span.y; it = it + 1u) {
        let k0 = begin_tile(it, lid);
        var vx: array<vec4<f32>, NKV>;
        if ((ABLATE & 8u) == 0u) {
            put_kv(KV, kx, lid, 0u);
            vx = fetch_kv(2u, k0, kh, lid);
        }
        workgroupBarrier();
        let s = score_block(ty, tx, k0);
        var x = s.x;
        var y = s.y;
        let px = poisons4(x);
        let py = poisons4(y);
        nan = nan | px | py;
        x = select(x, ninf, px);
        y = select(y, ninf, py);
        let m_new = max(m, rows_max(max(x, y)));
        let alpha = select(exp(m - m_new), vec4<f32>(0.0), m == ninf);
        let ex = probs4(x, m_new);
        let ey = probs4(y, m_new);
        l = l * alpha + rows_sum(ex + ey);
        m = m_new;
        buf[SC + tx * PSQ + ty] = ex;
        buf[SC + (tx + BK / 2u) * PSQ + ty] = ey;
        workgroupBarrier(); // K is read no more; P is written
        if ((ABLATE & 8u) == 0u) {
            put_kv(KV, vx, lid, 1u);
        }
        workgroupBarrier(); // V and its non-finite flag
        kx = fetch_k_of(it + 1u, span, kh, lid);
        o = o8_scale(o, alpha);
        if ((ABLATE & 4u) == 0u) {
            o = acc_rows(o, SC + ty, PSQ, KV + tx, BK, atomicLoad(&bad[0]) != 0u);
        }
        workgroupBarrier();
    }
    let row_bad = rows_any(nan);
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
        let xo = o8_row(o, r);
        if (!last) {
            put_out(row, h, tx, xo[0], xo[1]);
        } else {
            var a = vec4<f32>(0.0);
            var b = vec4<f32>(0.0);
            if (row_bad[r]) {
                a = vec4<f32>(nan_f32());
                b = a;
            } else if (l[r] > 0.0) {
                a = xo[0] / l[r];
                b = xo[1] / l[r];
            }
            put_out(row, h, tx, a, b);
        }
    }
}
