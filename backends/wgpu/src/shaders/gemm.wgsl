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
// front of this file, one variant per operand dtype: Raw_a is a pair of stored elements in the
// stored dtype, raw_a(i) stored element i, raw_a2(i) elements i and i + 1 (i even), widen_a(r)
// a pair as f32.

struct GemmParams {
    m: u32, n: u32, k: u32,
    a_off: u32, lda: u32, ta: u32,
    b_off: u32, ldb: u32, tb: u32,
    c_off: u32, ldc: u32, beta: f32,
}
@group(0) @binding(0) var<uniform> gp: GemmParams;
@group(0) @binding(3) var<storage, read_write> gc: array<f32>;

// The first row and column of the tile of c (`tm` rows, `tn` columns) that workgroup `wid` of
// the grid computes, and whether it computes one (z = 0: the tail of a 2-D grid, which
// returns). The host's grid is ceil(m / tm) * ceil(n / tn) workgroups (gemm.rs).
fn tile_origin(wid: vec3<u32>, nwg: vec3<u32>, tm: u32, tn: u32) -> vec3<u32> {
    let tiles_n = (gp.n + tn - 1u) / tn;
    let g = wg_linear(wid, nwg);
    let inside = g < tiles_n * ((gp.m + tm - 1u) / tm);
    return vec3<u32>((g / tiles_n) * tm, (g % tiles_n) * tn, select(0u, 1u, inside));
}

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

// Stored elements base and base + 1 of a, unconverted, where `lo` / `hi` say whether each is
// inside the operand (0 outside; a pair at an even index inside is one load).
fn pair_a(base: u32, lo: bool, hi: bool) -> Raw_a {
    if (hi && (base & 1u) == 0u) {
        return raw_a2(base);
    }
    var v = Raw_a();
    if (lo) { v.x = raw_a(base); }
    if (hi) { v.y = raw_a(base + 1u); }
    return v;
}

fn pair_b(base: u32, lo: bool, hi: bool) -> Raw_b {
    if (hi && (base & 1u) == 0u) {
        return raw_b2(base);
    }
    var v = Raw_b();
    if (lo) { v.x = raw_b(base); }
    if (hi) { v.y = raw_b(base + 1u); }
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
        let v = widen_a(pair_a(gp.a_off + i * gp.lda + p, inside && p < gp.k, inside && p + 1u < gp.k));
        tile_a[kk * SA + ii] = v.x;
        tile_a[(kk + 1u) * SA + ii] = v.y;
    } else {
        // stored (k, m): the pair is along m
        let ii = (q % 32u) * 2u;
        let kk = q / 32u;
        let i = m0 + ii;
        let p = k0 + kk;
        let inside = p < gp.k;
        let v = widen_a(pair_a(gp.a_off + p * gp.lda + i, inside && i < gp.m, inside && i + 1u < gp.m));
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
        let v = widen_b(pair_b(gp.b_off + p * gp.ldb + j, inside && j < gp.n, inside && j + 1u < gp.n));
        tile_b[kk * SB + jj] = v.x;
        tile_b[kk * SB + jj + 1u] = v.y;
    } else {
        // stored (n, k): the pair is along k
        let jj = q / 8u;
        let kk = (q % 8u) * 2u;
        let j = n0 + jj;
        let p = k0 + kk;
        let inside = j < gp.n;
        let v = widen_b(pair_b(gp.b_off + j * gp.ldb + p, inside && p < gp.k, inside && p + 1u < gp.k));
        tile_b[kk * SB + jj] = v.x;
        tile_b[(kk + 1u) * SB + jj] = v.y;
    }
}

@compute @workgroup_size(256)
fn matmul(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
          @builtin(local_invocation_index) lid: u32) {
    let origin = tile_origin(wid, nwg, BM, BN);
    if (origin.z == 0u) {
        return; // the tail of a 2-D grid
    }
    let m0 = origin.x;
    let n0 = origin.y;
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

// ---- matmul128: 128 x 128 tiles, 8 x 8 outputs per thread ------------------------------------
//
// The same product with four times the work per workgroup-memory read: each of the 256 threads
// keeps an 8 x 8 block of c (rows 4 ty + r and 64 + 4 ty + r, columns 4 tx + c and 64 + 4 tx + c)
// in sixteen vec4 registers and reads, per step of k, two vec4 of a's tile and two of b's: 4
// workgroup loads for 64 FMAs (matmul: 8 for 16). The tiles are k-major vec4 rows (the m or n
// direction packed four to a vec4) one vec4 past the tile width, so a row's reads by the 16
// threads of a half-warp are 16 consecutive vec4 (conflict-free) or one broadcast.
//
// Loads are software-pipelined: each thread fetches its 8 elements of the next k-step's tiles
// into registers (a FragA / FragB, still in the stored dtype) before the current step's FMAs,
// so the global-memory latency hides behind them, and widens and writes them to workgroup
// memory after the step's barrier. Consecutive
// threads fetch consecutive pairs along the stored matrix's contiguous dimension (a warp
// reads whole 64- or 256-byte row segments), whichever way the operand is transposed.

const WM: u32 = 128u;
const WK: u32 = 16u;
const WS: u32 = 33u; // vec4 per tile row: WM / 4 + 1
var<workgroup> wa: array<vec4<f32>, 528>; // [WK][WS]
var<workgroup> wb: array<vec4<f32>, 528>; // [WK][WS]

// A thread's 8 elements of one operand's tile for one k-step, as four pairs of neighbours
// along the stored matrix's contiguous dimension (pair p in field p), in the stored dtype:
// they are widened only when put into workgroup memory after the step's FMAs, so nothing
// waits for the loads before them. Fixed fields, never an array indexed by a counter.
struct FragA {
    p0: Raw_a, p1: Raw_a, p2: Raw_a, p3: Raw_a,
}

struct FragB {
    p0: Raw_b, p1: Raw_b, p2: Raw_b, p3: Raw_b,
}

// Where pair p (0..3) of thread lid starts in a 128 x 16 tile whose stored matrix is
// contiguous along k (`along_k`: the pair is (kk, kk + 1)) or along the 128-wide dimension
// (the pair is (x, x + 1)): (x of 128, kk of 16). Along k, 8 consecutive threads read one
// row's 16 consecutive elements; across, 64 consecutive threads read one k row's 128. An f16
// pair at an even element index is one 32-bit load.
fn pair_pos(lid: u32, p: u32, along_k: bool) -> vec2<u32> {
    if (along_k) {
        return vec2<u32>(lid / 8u + 32u * p, 2u * (lid % 8u));
    }
    return vec2<u32>(2u * (lid % 64u), lid / 64u + 4u * p);
}

// Pair p of a's tile at (m0, k0) for thread lid, 0 outside the product.
fn fetch_a2(lid: u32, p: u32, m0: u32, k0: u32) -> Raw_a {
    let at = pair_pos(lid, p, gp.ta == 0u);
    let i = m0 + at.x;
    let kk = k0 + at.y;
    if (gp.ta == 0u) {
        let inside = i < gp.m;
        return pair_a(gp.a_off + i * gp.lda + kk, inside && kk < gp.k, inside && kk + 1u < gp.k);
    }
    let inside = kk < gp.k;
    return pair_a(gp.a_off + kk * gp.lda + i, inside && i < gp.m, inside && i + 1u < gp.m);
}

// Pair p of b's tile at (k0, n0) (the tile indexed (column of 128, kk)), 0 outside.
fn fetch_b2(lid: u32, p: u32, k0: u32, n0: u32) -> Raw_b {
    let at = pair_pos(lid, p, gp.tb != 0u);
    let j = n0 + at.x;
    let kk = k0 + at.y;
    if (gp.tb != 0u) {
        let inside = j < gp.n;
        return pair_b(gp.b_off + j * gp.ldb + kk, inside && kk < gp.k, inside && kk + 1u < gp.k);
    }
    let inside = kk < gp.k;
    return pair_b(gp.b_off + kk * gp.ldb + j, inside && j < gp.n, inside && j + 1u < gp.n);
}

fn fetch_a128(lid: u32, m0: u32, k0: u32) -> FragA {
    return FragA(fetch_a2(lid, 0u, m0, k0), fetch_a2(lid, 1u, m0, k0),
                 fetch_a2(lid, 2u, m0, k0), fetch_a2(lid, 3u, m0, k0));
}

fn fetch_b128(lid: u32, k0: u32, n0: u32) -> FragB {
    return FragB(fetch_b2(lid, 0u, k0, n0), fetch_b2(lid, 1u, k0, n0),
                 fetch_b2(lid, 2u, k0, n0), fetch_b2(lid, 3u, k0, n0));
}

// Where a pair at `at` goes in a k-major tile of `stride` vec4 a row: the vec4 and lane of its
// first element (x, y) and of its second (z, w). Along k it spans two tile rows, across it is
// two lanes of one vec4 (x is even).
fn pair_slots(at: vec2<u32>, along_k: bool, stride: u32) -> vec4<u32> {
    let w0 = at.y * stride + at.x / 4u;
    let l0 = at.x % 4u;
    return vec4<u32>(w0, l0, select(w0, w0 + stride, along_k), select(l0 + 1u, l0, along_k));
}

// A pair into a's tile (`wa`) or b's (`wb`): a function per tile, so that a kernel putting only
// a's tile reaches only `wa` (wgpu compiles each entry point from the module compacted to what
// it reaches, and a reached tile is workgroup memory the driver may allocate: matmul128_n).
fn put_pair_a(at: vec2<u32>, along_k: bool, v: vec2<f32>) {
    let s = pair_slots(at, along_k, WS);
    wa[s.x][s.y] = v.x;
    wa[s.z][s.w] = v.y;
}

fn put_pair_b(at: vec2<u32>, along_k: bool, v: vec2<f32>) {
    let s = pair_slots(at, along_k, WS);
    wb[s.x][s.y] = v.x;
    wb[s.z][s.w] = v.y;
}

fn put_a128(lid: u32, f: FragA) {
    let ak = gp.ta == 0u;
    put_pair_a(pair_pos(lid, 0u, ak), ak, widen_a(f.p0));
    put_pair_a(pair_pos(lid, 1u, ak), ak, widen_a(f.p1));
    put_pair_a(pair_pos(lid, 2u, ak), ak, widen_a(f.p2));
    put_pair_a(pair_pos(lid, 3u, ak), ak, widen_a(f.p3));
}

fn put_b128(lid: u32, f: FragB) {
    let bk = gp.tb != 0u;
    put_pair_b(pair_pos(lid, 0u, bk), bk, widen_b(f.p0));
    put_pair_b(pair_pos(lid, 1u, bk), bk, widen_b(f.p1));
    put_pair_b(pair_pos(lid, 2u, bk), bk, widen_b(f.p2));
    put_pair_b(pair_pos(lid, 3u, bk), bk, widen_b(f.p3));
}

@compute @workgroup_size(256)
fn matmul128(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
             @builtin(local_invocation_index) lid: u32) {
    let origin = tile_origin(wid, nwg, WM, WM);
    if (origin.z == 0u) {
        return; // the tail of a 2-D grid
    }
    let m0 = origin.x;
    let n0 = origin.y;
    let tx = lid % 16u;
    let ty = lid / 16u;
    // cR0 / cR1: c row 4 ty + R at columns 4 tx and 64 + 4 tx; dR0 / dR1 the same at row
    // 64 + 4 ty + R.
    var c00 = vec4<f32>(0.0); var c01 = vec4<f32>(0.0);
    var c10 = vec4<f32>(0.0); var c11 = vec4<f32>(0.0);
    var c20 = vec4<f32>(0.0); var c21 = vec4<f32>(0.0);
    var c30 = vec4<f32>(0.0); var c31 = vec4<f32>(0.0);
    var d00 = vec4<f32>(0.0); var d01 = vec4<f32>(0.0);
    var d10 = vec4<f32>(0.0); var d11 = vec4<f32>(0.0);
    var d20 = vec4<f32>(0.0); var d21 = vec4<f32>(0.0);
    var d30 = vec4<f32>(0.0); var d31 = vec4<f32>(0.0);
    var fa = fetch_a128(lid, m0, 0u);
    var fb = fetch_b128(lid, 0u, n0);
    for (var k0 = 0u; k0 < gp.k; k0 = k0 + WK) {
        put_a128(lid, fa);
        put_b128(lid, fb);
        workgroupBarrier();
        // The next step's elements are in flight while this step's FMAs run.
        if (k0 + WK < gp.k) {
            fa = fetch_a128(lid, m0, k0 + WK);
            fb = fetch_b128(lid, k0 + WK, n0);
        }
        for (var kk = 0u; kk < WK; kk = kk + 1u) {
            let a0 = wa[kk * WS + ty];
            let a1 = wa[kk * WS + ty + 16u];
            let b0 = wb[kk * WS + tx];
            let b1 = wb[kk * WS + tx + 16u];
            c00 = fma(vec4<f32>(a0.x), b0, c00); c01 = fma(vec4<f32>(a0.x), b1, c01);
            c10 = fma(vec4<f32>(a0.y), b0, c10); c11 = fma(vec4<f32>(a0.y), b1, c11);
            c20 = fma(vec4<f32>(a0.z), b0, c20); c21 = fma(vec4<f32>(a0.z), b1, c21);
            c30 = fma(vec4<f32>(a0.w), b0, c30); c31 = fma(vec4<f32>(a0.w), b1, c31);
            d00 = fma(vec4<f32>(a1.x), b0, d00); d01 = fma(vec4<f32>(a1.x), b1, d01);
            d10 = fma(vec4<f32>(a1.y), b0, d10); d11 = fma(vec4<f32>(a1.y), b1, d11);
            d20 = fma(vec4<f32>(a1.z), b0, d20); d21 = fma(vec4<f32>(a1.z), b1, d21);
            d30 = fma(vec4<f32>(a1.w), b0, d30); d31 = fma(vec4<f32>(a1.w), b1, d31);
        }
        workgroupBarrier();
    }
    let i0 = m0 + 4u * ty;
    let i1 = m0 + 64u + 4u * ty;
    let j0 = n0 + 4u * tx;
    let j1 = n0 + 64u + 4u * tx;
    store4(i0, j0, c00); store4(i0, j1, c01);
    store4(i0 + 1u, j0, c10); store4(i0 + 1u, j1, c11);
    store4(i0 + 2u, j0, c20); store4(i0 + 2u, j1, c21);
    store4(i0 + 3u, j0, c30); store4(i0 + 3u, j1, c31);
    store4(i1, j0, d00); store4(i1, j1, d01);
    store4(i1 + 1u, j0, d10); store4(i1 + 1u, j1, d11);
    store4(i1 + 2u, j0, d20); store4(i1 + 2u, j1, d21);
    store4(i1 + 3u, j0, d30); store4(i1 + 3u, j1, d31);
}

// Row i of c at columns j .. j + 3 (those inside the product).
fn store4(i: u32, j: u32, v: vec4<f32>) {
    if (i >= gp.m) {
        return;
    }
    store(i, j, v.x);
    store(i, j + 1u, v.y);
    store(i, j + 2u, v.z);
    store(i, j + 3u, v.w);
}
