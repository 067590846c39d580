// attention_dq.wgsl: the backward's dsum and dq kernels (after attention.wgsl and
// attention_bwd.wgsl).
// dP = d_out . v, P = exp(scale q.k - lse), dS = P (dP - dsum), dq = scale * sum_j dS k_j.
// One workgroup of WG = (BQ / 4) * (DP / 8) threads per (query tile, head), the forward's
// tiles (BQ = 4096 / DP: 128 threads; BK as large as workgroup memory allows). Two staging
// areas, RT (BQ rows) and KT (BK keys), hold d_out and V, then Q and K: Q and d_out are
// staged again per key tile (hits in L1 / L2), which halves the memory against keeping both
// and so doubles the tile (32 x 32 at d = 128 in 48 KiB). Per key tile five barriers: stage
// d_out, V; dP (4 x 2 blocks) into SC; stage Q, K; dS in place of dP (each block's thread
// rewrites its own values); dq += dS K on the 4 x 8 register blocks. SC is key-major as the
// forward's (attention_fwd.wgsl).

const PSQ: u32 = BQ / 4u + 1u;
const RT: u32 = 0u;
const KT: u32 = BQ * QS;
const SC: u32 = (BQ + BK) * QS;
const NBUF: u32 = (BQ + BK) * QS + BK * PSQ;

var<workgroup> buf: array<vec4<f32>, NBUF>;

// ---- dsum = rowwise d_out . out ---------------------------------------------------------------
// Bindings 1..4 (q, k, v, tiles) unused here; d_out at 5, out at 6.

@group(0) @binding(5) var<storage, read> s_dout: array<f32>;
@group(0) @binding(6) var<storage, read> s_out: array<f32>;
@group(0) @binding(7) var<storage, read_write> s_dsum: array<f32>;

@compute @workgroup_size(128)
fn attn_dsum(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let i = wg_linear(wid, nwg) * 128u + lid;
    if (i >= p.tq * p.hq) {
        return;
    }
    var s = 0.0;
    for (var c = 0u; c < p.d; c = c + 1u) {
        s = fma(s_dout[i * p.d + c], s_out[i * p.d + c], s);
    }
    s_dsum[i] = s;
}

// ---- dq ---------------------------------------------------------------------------------------

@group(0) @binding(8) var<storage, read_write> b_dq: array<f32>;

fn dq_at(r: u32, h: u32, c: u32) -> u32 {
    return (r * p.hq + h) * p.d + c;
}

@compute @workgroup_size(WG)
fn attn_dq(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
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
    load_row_stats(r0, h, lid);
    let ry = lid / DP8;
    let cx = lid % DP8;
    var o = o8_zero();
    if ((p.flags & FIRST) == 0u) {
        for (var r = 0u; r < 4u; r = r + 1u) {
            let row = min(r0 + 4u * ry + r, p.tq - 1u);
            var a = vec4<f32>(0.0);
            var b = vec4<f32>(0.0);
            for (var e = 0u; e < 4u; e = e + 1u) {
                let c = 4u * cx + e;
                if (c < p.d) {
                    a[e] = b_dq[dq_at(row, h, c)];
                }
                if (c + DP / 2u < p.d) {
                    b[e] = b_dq[dq_at(row, h, c + DP / 2u)];
                }
            }
            o = o8_set(o, r, a, b);
        }
    }
    let lb = list_bounds(0u, qt, lid);
    let span = pass_range(lb.x, lb.y);
    for (var it = span.x; it < span.y; it = it + 1u) {
        let w = tiles[p.qlist_at + it];
        tile_full = (w & FULL) != 0u;
        let k0 = (w & ~FULL) * BK;
        // The previous tile's readers of the flags passed its last barrier; this tile's
        // writer (K below) comes after its second.
        clear_flags(lid);
        stage_dout(RT, r0, h, lid, 0u);
        stage_kv(2u, KT, k0, kh, lid, 0u);
        workgroupBarrier();
        // dP: block sb is rows 4 ty .. 4 ty + 3 against keys tx and tx + BK / 2.
        for (var sb = lid; sb < BQ * BK / 8u; sb = sb + WG) {
            let ty = sb / (BK / 2u);
            let tx = sb % (BK / 2u);
            let s = dots8(RT + 4u * ty * QS, KT + tx * QS, KT + (tx + BK / 2u) * QS);
            buf[SC + tx * PSQ + ty] = s.x;
            buf[SC + (tx + BK / 2u) * PSQ + ty] = s.y;
        }
        workgroupBarrier();
        // K is flagged: dq accumulates dS K.
        stage_q(RT, r0, h, lid, 0u);
        stage_kv(1u, KT, k0, kh, lid, 1u);
        workgroupBarrier();
        for (var sb = lid; sb < BQ * BK / 8u; sb = sb + WG) {
            let ty = sb / (BK / 2u);
            let tx = sb % (BK / 2u);
            let s = dots8(RT + 4u * ty * QS, KT + tx * QS, KT + (tx + BK / 2u) * QS);
            let dpx = buf[SC + tx * PSQ + ty];
            let dpy = buf[SC + (tx + BK / 2u) * PSQ + ty];
            var x = vec4<f32>(0.0);
            var y = vec4<f32>(0.0);
            for (var e = 0u; e < 4u; e = e + 1u) {
                let i = 4u * ty + e;
                if (visible(i, k0 + tx)) {
                    x[e] = prob(p.scale * s.x[e], row_l[i]) * (dpx[e] - row_d[i]);
                }
                if (visible(i, k0 + tx + BK / 2u)) {
                    y[e] = prob(p.scale * s.y[e], row_l[i]) * (dpy[e] - row_d[i]);
                }
            }
            buf[SC + tx * PSQ + ty] = x;
            buf[SC + (tx + BK / 2u) * PSQ + ty] = y;
        }
        workgroupBarrier();
        o = acc_rows(o, SC + ry, PSQ, KT + cx, BK, atomicLoad(&bad[0]) != 0u);
        workgroupBarrier();
    }
    // Scaled once, on the last pass.
    let f = select(1.0, p.scale, (p.flags & LAST) != 0u);
    for (var r = 0u; r < 4u; r = r + 1u) {
        let row = r0 + 4u * ry + r;
        if (row >= p.tq) {
            break;
        }
        let x = o8_row(o, r);
        for (var e = 0u; e < 4u; e = e + 1u) {
            let c = 4u * cx + e;
            if (c < p.d) {
                b_dq[dq_at(row, h, c)] = f * x[0][e];
            }
            if (c + DP / 2u < p.d) {
                b_dq[dq_at(row, h, c + DP / 2u)] = f * x[1][e];
            }
        }
    }
}
