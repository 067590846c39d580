// gemm.wgsl: c = beta * c + op(a) @ op(b), f32 accumulation and f32 output; a and b are
// f32 or f16 (the compute format of read-only tensors), widened to f32 as they are loaded.
//
// One workgroup of 256 threads computes a 64 x 64 tile of c, 4 x 4 elements per thread
// (rows ty + 16 r, columns tx + 16 c: neighbouring threads read neighbouring words of the
// tiles), held in four vec4 registers. K advances in steps of 16 through two workgroup-memory tiles; each thread loads two
// pairs of neighbours along the stored matrix's contiguous dimension, so consecutive threads
// read consecutive addresses whichever way it is transposed, and a pair at an even element
// index is one 32-bit load of two f16 (one vec2<f16> element). Operands are given by an
// element offset and a row stride of their stored matrix, so the host can hand any sub-block
// (a chunk of a large matrix) to one dispatch. beta == 0 never reads c (it may hold NaN
// poison).
//
// The host puts the operand bindings (@binding(1) ga, @binding(2) gb) and their readers in
// front of this file, one variant per operand dtype: read_a(i) is stored element i as f32,
// read_a2(i) elements i and i + 1 (i even).

struct GemmParams {
    m: u32, n: u32, k: u32,
    a_off: u32, lda: u32, ta: u32,
    b_off: u32, ldb: u32, tb: u32,
    c_off: u32, ldc: u32, beta: f32,
}
@group(0) @binding(0) var<uniform> gp: GemmParams;
@group(0) @binding(3) var<storage, read_write> gc: array<f32>;

const BM: u32 = 64u;
const BN: u32 = 64u;
const BK: u32 = 16u;

// Row strides of the tiles, one word past the tile width: the loads write down a column of
// the tile for one of the two transposes (k, k + 1 at a stride of a row), and a stride of 64
// words would put those writes in one shared-memory bank.
const SA: u32 = 65u;
const SB: u32 = 65u;
var<workgroup> tile_a: array<f32, 1040>; // [BK][SA]
var<workgroup> tile_b: array<f32, 1040>; // [BK][SB]

// Stored elements base and base + 1 of a, where `lo` / `hi` say whether each is inside the
// operand (a pair at an even index inside is one load).
fn pair_a(base: u32, lo: bool, hi: bool) -> vec2<f32> {
    if (hi && (base & 1u) == 0u) {
        return read_a2(base);
    }
    var v = vec2<f32>(0.0, 0.0);
    if (lo) { v.x = read_a(base); }
    if (hi) { v.y = read_a(base + 1u); }
    return v;
}

fn pair_b(base: u32, lo: bool, hi: bool) -> vec2<f32> {
    if (hi && (base & 1u) == 0u) {
        return read_b2(base);
    }
    var v = vec2<f32>(0.0, 0.0);
    if (lo) { v.x = read_b(base); }
    if (hi) { v.y = read_b(base + 1u); }
    return v;
}

// Pair q (of 512) of a's tile at (m0, k0) into tile_a.
fn load_tile_a(q: u32, m0: u32, k0: u32) {
    if (gp.ta == 0u) {
        // stored (m, k): the pair is along k
        let ii = q / 8u;
        let kk = (q % 8u) * 2u;
        let i = m0 + ii;
        let p = k0 + kk;
        let inside = i < gp.m;
        let v = pair_a(gp.a_off + i * gp.lda + p, inside && p < gp.k, inside && p + 1u < gp.k);
        tile_a[kk * SA + ii] = v.x;
        tile_a[(kk + 1u) * SA + ii] = v.y;
    } else {
        // stored (k, m): the pair is along m
        let ii = (q % 32u) * 2u;
        let kk = q / 32u;
        let i = m0 + ii;
        let p = k0 + kk;
        let inside = p < gp.k;
        let v = pair_a(gp.a_off + p * gp.lda + i, inside && i < gp.m, inside && i + 1u < gp.m);
        tile_a[kk * SA + ii] = v.x;
        tile_a[kk * SA + ii + 1u] = v.y;
    }
}

// Pair q (of 512) of b's tile at (k0, n0) into tile_b.
fn load_tile_b(q: u32, k0: u32, n0: u32) {
    if (gp.tb == 0u) {
        // stored (k, n): the pair is along n
        let jj = (q % 32u) * 2u;
        let kk = q / 32u;
        let j = n0 + jj;
        let p = k0 + kk;
        let inside = p < gp.k;
        let v = pair_b(gp.b_off + p * gp.ldb + j, inside && j < gp.n, inside && j + 1u < gp.n);
        tile_b[kk * SB + jj] = v.x;
        tile_b[kk * SB + jj + 1u] = v.y;
    } else {
        // stored (n, k): the pair is along k
        let jj = q / 8u;
        let kk = (q % 8u) * 2u;
        let j = n0 + jj;
        let p = k0 + kk;
        let inside = j < gp.n;
        let v = pair_b(gp.b_off + j * gp.ldb + p, inside && p < gp.k, inside && p + 1u < gp.k);
        tile_b[kk * SB + jj] = v.x;
        tile_b[(kk + 1u) * SB + jj] = v.y;
    }
}

@compute @workgroup_size(256)
fn matmul(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let tiles_n = (gp.n + BN - 1u) / BN;
    let g = wg_linear(wid, nwg);
    if (g >= tiles_n * ((gp.m + BM - 1u) / BM)) {
        return; // the tail of a 2-D grid
    }
    let m0 = (g / tiles_n) * BM;
    let n0 = (g % tiles_n) * BN;
    let tx = lid % 16u;
    let ty = lid / 16u;
    // The 4 x 4 outputs in four vec4 registers (row r, columns c = 0..3): no array indexed
    // by a loop counter, which a shader compiler may place in local memory.
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    for (var k0 = 0u; k0 < gp.k; k0 = k0 + BK) {
        load_tile_a(lid, m0, k0);
        load_tile_b(lid, k0, n0);
        load_tile_a(lid + 256u, m0, k0);
        load_tile_b(lid + 256u, k0, n0);
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk = kk + 1u) {
            let ra = kk * SA + ty;
            let rb = kk * SB + tx;
            let av = vec4<f32>(tile_a[ra], tile_a[ra + 16u], tile_a[ra + 32u], tile_a[ra + 48u]);
            let bv = vec4<f32>(tile_b[rb], tile_b[rb + 16u], tile_b[rb + 32u], tile_b[rb + 48u]);
            acc0 = fma(vec4<f32>(av.x), bv, acc0);
            acc1 = fma(vec4<f32>(av.y), bv, acc1);
            acc2 = fma(vec4<f32>(av.z), bv, acc2);
            acc3 = fma(vec4<f32>(av.w), bv, acc3);
        }
        workgroupBarrier();
    }
    store_row(m0 + ty, n0 + tx, acc0);
    store_row(m0 + ty + 16u, n0 + tx, acc1);
    store_row(m0 + ty + 32u, n0 + tx, acc2);
    store_row(m0 + ty + 48u, n0 + tx, acc3);
}

// Row i of c at columns j, j + 16, j + 32, j + 48 (those inside the product).
fn store_row(i: u32, j: u32, v: vec4<f32>) {
    if (i >= gp.m) {
        return;
    }
    store(i, j, v.x);
    store(i, j + 16u, v.y);
    store(i, j + 32u, v.z);
    store(i, j + 48u, v.w);
}

fn store(i: u32, j: u32, x: f32) {
    if (j < gp.n) {
        let at = gp.c_off + i * gp.ldc + j;
        if (gp.beta == 0.0) {
            gc[at] = x;
        } else {
            gc[at] = gp.beta * gc[at] + x;
        }
    }
}
