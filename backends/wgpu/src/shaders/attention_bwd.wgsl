// attention_bwd.wgsl: what the two backward kernels share (after attention.wgsl, before
// attention_dq.wgsl or attention_dkdv.wgsl): their inputs past q, k, v, the tile lists and
// d_out (binding 5, declared by the host with q, k, v), the staged rows' lse and dsum, and
// the staging of d_out.

@group(0) @binding(6) var<storage, read> lse_in: array<f32>;
@group(0) @binding(7) var<storage, read> dsum_in: array<f32>;

// lse and dsum of the staged query rows.
var<workgroup> row_l: array<f32, BQ>;
var<workgroup> row_d: array<f32, BQ>;

// d_out rows [r0, r0 + BQ) of head h into the tile at dst (zero past tq), flagging
// non-finite values in bad[flag - 1] (0: no check), as stage_q.
fn stage_dout(dst: u32, r0: u32, h: u32, lid: u32, flag: u32) {
    stage_dout_rows(dst, QS, r0, h, lid, flag);
}

// As `stage_dout`, rows `stride` vec4 apart (DP4: dense, for register scores).
fn stage_dout_rows(dst: u32, stride: u32, r0: u32, h: u32, lid: u32, flag: u32) {
    var seen = false;
    for (var n = 0u; n < (BQ * DP4 + WG - 1u) / WG; n = n + 1u) {
        let e = lid + n * WG;
        if ((BQ * DP4) % WG == 0u || e < BQ * DP4) {
            let i = e / DP4;
            var x = vec4<f32>(0.0);
            if (r0 + i < p.tq) {
                x = d_out_row4(((r0 + i) * p.hq + h) * p.d, e % DP4);
            }
            seen = seen | nonfinite4(x);
            buf[dst + i * stride + e % DP4] = x;
        }
    }
    note(seen, flag);
}

// lse and dsum of query rows [r0, r0 + BQ) of head h into row_l / row_d (0 past tq).
fn load_row_stats(r0: u32, h: u32, lid: u32) {
    for (var e = lid; e < BQ; e = e + WG) {
        let r = r0 + e;
        var lv = 0.0;
        var ds = 0.0;
        if (r < p.tq) {
            lv = lse_in[r * p.hq + h];
            ds = dsum_in[r * p.hq + h];
        }
        row_l[e] = lv;
        row_d[e] = ds;
    }
}
