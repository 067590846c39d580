// attention_dkdv.wgsl: the backward's dk/dv kernel (after attention.wgsl and
// attention_bwd.wgsl). One workgroup of
// WG = (BK / 4) * (DP / 8) threads per (key tile, kv head), BK = 4096 / DP (128 threads),
// its keys' dk and dv in registers (4 keys x 8 dims each per thread) across the whole list:
// for each query tile that sees the key tile and each query head of the kv head (one flat
// loop, no atomics), dv_j += sum_i P_ij d_out_i, dk_j += scale * sum_i dS_ij q_i.
// Two staging areas, KT (BK keys: K, then V) and RT (BQ rows: Q, d_out, Q): restaging K and V
// per step (hits in L1 / L2) instead of keeping both frees the memory for tiles twice as large
// (32 x 32 at d = 128 in 48 KiB) and twice the threads. Six barriers a step: stage K, Q;
// P^T (4 keys x 2 rows blocks) into SP; stage V, d_out; dS into SD (each block's thread
// reads its own P) and dv += P^T d_out; stage Q; dk += dS^T Q. SP and SD are row-major:
// query row i's 4-key group g at buf[SP + i PSK + g], one vec4 of 4 keys' weights per row.

const PSK: u32 = BK / 4u + 1u;
const KT: u32 = 0u;
const RT: u32 = BK * QS;
const SP: u32 = (BK + BQ) * QS;
const SD: u32 = (BK + BQ) * QS + BQ * PSK;
const NBUF: u32 = (BK + BQ) * QS + 2u * BQ * PSK;

var<workgroup> buf: array<vec4<f32>, NBUF>;

@group(0) @binding(8) var<storage, read_write> b_dk: array<f32>;
@group(0) @binding(9) var<storage, read_write> b_dv: array<f32>;

fn kv_at(key: u32, kh: u32, c: u32) -> u32 {
    return (key * p.hkv + kh) * p.d + c;
}

// Step w of a key tile's flat list of (query tile, query head of kv head kh) pairs: the
// query tile's first row and the head `(r0, h)`, with its intervals, row statistics and tile
// flags in place. row_iv, row_l and row_d were last read before the previous step's final
// barrier.
fn begin_kv_step(w: u32, kh: u32, lid: u32) -> vec2<u32> {
    let entry = tiles[p.klist_at + w / p.group];
    tile_full = (entry & FULL) != 0u;
    let r0 = (entry & ~FULL) * BQ;
    tile_r0 = r0;
    let h = kh * p.group + w % p.group;
    load_intervals(r0, lid);
    load_row_stats(r0, h, lid);
    return vec2<u32>(r0, h);
}

@compute @workgroup_size(WG)
fn attn_dkdv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let nkt = (p.tk + BK - 1u) / BK;
    let g = wg_linear(wid, nwg);
    if (g >= nkt * p.hkv) {
        return;
    }
    let kt = k_tile_of(g / p.hkv);
    let kh = g % p.hkv;
    let k0 = kt * BK;
    let ky = lid / DP8;
    let cx = lid % DP8;
    var dk = o8_zero();
    var dv = o8_zero();
    if ((p.flags & FIRST) == 0u) {
        for (var r = 0u; r < 4u; r = r + 1u) {
            let key = min(k0 + 4u * ky + r, p.tk - 1u);
            var ka = vec4<f32>(0.0);
            var kb = vec4<f32>(0.0);
            var va = vec4<f32>(0.0);
            var vb = vec4<f32>(0.0);
            for (var e = 0u; e < 4u; e = e + 1u) {
                let c = 4u * cx + e;
                if (c < p.d) {
                    ka[e] = b_dk[kv_at(key, kh, c)];
                    va[e] = b_dv[kv_at(key, kh, c)];
                }
                if (c + DP / 2u < p.d) {
                    kb[e] = b_dk[kv_at(key, kh, c + DP / 2u)];
                    vb[e] = b_dv[kv_at(key, kh, c + DP / 2u)];
                }
            }
            dk = o8_set(dk, r, ka, kb);
            dv = o8_set(dv, r, va, vb);
        }
    }
    let lb = list_bounds(p.koff_at, kt, lid);
    // One flat loop over (query tile, query head of this kv head) pairs.
    let span = pass_range(lb.x * p.group, lb.y * p.group);
    for (var w = span.x; w < span.y; w = w + 1u) {
        let step = begin_kv_step(w, kh, lid);
        let r0 = step.x;
        let h = step.y;
        // The flags' readers passed the previous step's last barrier; their writers (d_out
        // and Q below) come after this step's first.
        clear_flags(lid);
        stage_kv(1u, KT, k0, kh, lid, 0u);
        stage_q(RT, r0, h, lid, 0u);
        workgroupBarrier();
        // P^T: block sb is keys 4 tk .. 4 tk + 3 against query rows tr and tr + BQ / 2.
        for (var sb = lid; sb < BQ * BK / 8u; sb = sb + WG) {
            let tk = sb / (BQ / 2u);
            let tr = sb % (BQ / 2u);
            let s = dots8(KT + 4u * tk * QS, RT + tr * QS, RT + (tr + BQ / 2u) * QS);
            var x = vec4<f32>(0.0);
            var y = vec4<f32>(0.0);
            for (var e = 0u; e < 4u; e = e + 1u) {
                let key = k0 + 4u * tk + e;
                if (visible(tr, key)) {
                    x[e] = prob(p.scale * s.x[e], row_l[tr]);
                }
                if (visible(tr + BQ / 2u, key)) {
                    y[e] = prob(p.scale * s.y[e], row_l[tr + BQ / 2u]);
                }
            }
            buf[SP + tr * PSK + tk] = x;
            buf[SP + (tr + BQ / 2u) * PSK + tk] = y;
        }
        workgroupBarrier();
        // d_out is flagged: dv accumulates P^T d_out.
        stage_kv(2u, KT, k0, kh, lid, 0u);
        stage_dout(RT, r0, h, lid, 1u);
        workgroupBarrier();
        // dS = P (dP - dsum), dP = V d_out^T; then dv += P^T d_out.
        for (var sb = lid; sb < BQ * BK / 8u; sb = sb + WG) {
            let tk = sb / (BQ / 2u);
            let tr = sb % (BQ / 2u);
            let s = dots8(KT + 4u * tk * QS, RT + tr * QS, RT + (tr + BQ / 2u) * QS);
            let px = buf[SP + tr * PSK + tk];
            let py = buf[SP + (tr + BQ / 2u) * PSK + tk];
            var x = vec4<f32>(0.0);
            var y = vec4<f32>(0.0);
            for (var e = 0u; e < 4u; e = e + 1u) {
                let key = k0 + 4u * tk + e;
                if (visible(tr, key)) {
                    x[e] = px[e] * (s.x[e] - row_d[tr]);
                }
                if (visible(tr + BQ / 2u, key)) {
                    y[e] = py[e] * (s.y[e] - row_d[tr + BQ / 2u]);
                }
            }
            buf[SD + tr * PSK + tk] = x;
            buf[SD + (tr + BQ / 2u) * PSK + tk] = y;
        }
        dv = acc_rows(dv, SP + ky, PSK, RT + cx, BQ, atomicLoad(&bad[0]) != 0u);
        workgroupBarrier();
        // Q is flagged: dk accumulates dS^T Q.
        stage_q(RT, r0, h, lid, 2u);
        workgroupBarrier();
        // dk += dS^T q (scaled on the last pass).
        dk = acc_rows(dk, SD + ky, PSK, RT + cx, BQ, atomicLoad(&bad[1]) != 0u);
        workgroupBarrier();
    }
    let f = select(1.0, p.scale, (p.flags & LAST) != 0u);
    for (var r = 0u; r < 4u; r = r + 1u) {
        let key = k0 + 4u * ky + r;
        if (key >= p.tk) {
            break;
        }
        let xk = o8_row(dk, r);
        let xv = o8_row(dv, r);
        for (var e = 0u; e < 4u; e = e + 1u) {
            let c = 4u * cx + e;
            if (c < p.d) {
                b_dk[kv_at(key, kh, c)] = f * xk[0][e];
                b_dv[kv_at(key, kh, c)] = xv[0][e];
            }
            if (c + DP / 2u < p.d) {
                b_dk[kv_at(key, kh, c + DP / 2u)] = f * xk[1][e];
                b_dv[kv_at(key, kh, c + DP / 2u)] = xv[1][e];
            }
        }
    }
}
