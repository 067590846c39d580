// norm.wgsl: RMSNorm over the last dim, y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps).
// One workgroup of 256 threads per row for the row statistics (wg_sum: reduce.wgsl or
// reduce_subgroups.wgsl, a fixed order either way); dw as column sums over blocks of rows,
// then the blocks added in order. `/*rd-args*/` and `/*rd-init*/` mark where the subgroup
// variant adds its builtins and hands them to rd_init.

struct RowParams {
    rows: u32, cols: u32, eps: f32,
    s0: u32, s1: u32, s2: u32, s3: u32,  // element shifts of the bindings, in binding order
}
@group(0) @binding(0) var<uniform> rp: RowParams;

// ---- forward: x, w -> y, rstd -------------------------------------------------------------

@group(0) @binding(1) var<storage, read> f_x: array<f32>;
@group(0) @binding(2) var<storage, read> f_w: array<f32>;
@group(0) @binding(3) var<storage, read_write> f_y: array<f32>;
@group(0) @binding(4) var<storage, read_write> f_rstd: array<f32>;

@compute @workgroup_size(256)
fn rms_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32 /*rd-args*/) {
    /*rd-init*/
    let row = wg_linear(wid, nwg);
    if (row >= rp.rows) {
        return;
    }
    let x0 = rp.s0 + row * rp.cols;
    var acc = 0.0;
    for (var c = lid; c < rp.cols; c = c + 256u) {
        let v = f_x[x0 + c];
        acc = fma(v, v, acc);
    }
    let ms = wg_sum(acc, lid) / f32(rp.cols);
    let rstd = 1.0 / sqrt(ms + rp.eps);
    let y0 = rp.s2 + row * rp.cols;
    for (var c = lid; c < rp.cols; c = c + 256u) {
        f_y[y0 + c] = f_x[x0 + c] * rstd * f_w[c];
    }
    if (lid == 0u) {
        f_rstd[rp.s3 + row] = rstd;
    }
}

// ---- backward dx: dy, x, w, rstd -> dx ---------------------------------------------------
// xhat = x * rstd; dx = rstd * (dy * w - xhat * mean(dy * w * xhat)).

@group(0) @binding(1) var<storage, read> b_dy: array<f32>;
@group(0) @binding(2) var<storage, read> b_x: array<f32>;
@group(0) @binding(3) var<storage, read> b_w: array<f32>;
@group(0) @binding(4) var<storage, read> b_rstd: array<f32>;
@group(0) @binding(5) var<storage, read_write> b_dx: array<f32>;

// Shifts: rp.s0 dy, rp.s1 x, rp.s2 rstd, rp.s3 dx.
@compute @workgroup_size(256)
fn rms_norm_dx(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32 /*rd-args*/) {
    /*rd-init*/
    let row = wg_linear(wid, nwg);
    if (row >= rp.rows) {
        return;
    }
    let rstd = b_rstd[rp.s2 + row];
    let g0 = rp.s0 + row * rp.cols;
    let x0 = rp.s1 + row * rp.cols;
    var acc = 0.0;
    for (var c = lid; c < rp.cols; c = c + 256u) {
        acc = fma(b_dy[g0 + c] * b_w[c], b_x[x0 + c], acc);
    }
    let dot = wg_sum(acc, lid) * rstd / f32(rp.cols);
    let d0 = rp.s3 + row * rp.cols;
    for (var c = lid; c < rp.cols; c = c + 256u) {
        let xhat = b_x[x0 + c] * rstd;
        b_dx[d0 + c] = rstd * (b_dy[g0 + c] * b_w[c] - xhat * dot);
    }
}

// ---- backward dw, part 1: partial[block, c] = sum over the block's rows of dy * x * rstd --
// rp.rows: rows in this dispatch's bindings; shifts s0 dy, s1 x, s2 rstd; s3: first block.

const DW_BLOCK: u32 = 64u;

@group(0) @binding(1) var<storage, read> p_dy: array<f32>;
@group(0) @binding(2) var<storage, read> p_x: array<f32>;
@group(0) @binding(3) var<storage, read> p_rstd: array<f32>;
@group(0) @binding(4) var<storage, read_write> p_part: array<f32>;

@compute @workgroup_size(256)
fn rms_norm_dw_partial(@builtin(workgroup_id) wid: vec3<u32>,
                       @builtin(num_workgroups) nwg: vec3<u32>,
                       @builtin(local_invocation_index) lid: u32) {
    let col_groups = (rp.cols + 255u) / 256u;
    let g = wg_linear(wid, nwg);
    let block = g / col_groups;
    let c = (g % col_groups) * 256u + lid;
    let r0 = block * DW_BLOCK;
    if (r0 >= rp.rows || c >= rp.cols) {
        return;
    }
    let r1 = min(r0 + DW_BLOCK, rp.rows);
    var acc = 0.0;
    for (var r = r0; r < r1; r = r + 1u) {
        let at = r * rp.cols + c;
        acc = fma(p_dy[rp.s0 + at] * p_x[rp.s1 + at], p_rstd[rp.s2 + r], acc);
    }
    p_part[(rp.s3 + block) * rp.cols + c] = acc;
}

// ---- backward dw, part 2: dw[c] = sum over blocks of partial[block, c], in order ---------
// rp.rows: number of blocks.

@group(0) @binding(1) var<storage, read> s_part: array<f32>;
@group(0) @binding(2) var<storage, read_write> s_dw: array<f32>;

@compute @workgroup_size(256)
fn rms_norm_dw_sum(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                   @builtin(local_invocation_index) lid: u32) {
    let c = wg_linear(wid, nwg) * 256u + lid;
    if (c >= rp.cols) {
        return;
    }
    var acc = 0.0;
    for (var b = 0u; b < rp.rows; b = b + 1u) {
        acc = acc + s_part[b * rp.cols + c];
    }
    s_dw[c] = acc;
}
