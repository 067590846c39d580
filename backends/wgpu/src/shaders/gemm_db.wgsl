// gemm_db.wgsl: matmul128_db, matmul128 (gemm.wgsl, whose fetches, pair positions and stores it
// uses: the host puts this file after it in one module) with the overlap of loads and FMAs
// written out, for a driver that does not schedule it from matmul128 by itself (NVIDIA's Vulkan
// compiler keeps fewer loads in flight than NVRTC does with the same algorithm in CUDA C,
// lab/wgpu/gemm_twin.py). Behind `WgpuOptions::gemm = GemmKernel::DoubleBuffered`:
//
// - the workgroup tiles are double-buffered: a k-step computes from one buffer while the
//   fragments fetched for the next step go into the other, so one barrier a k-step instead
//   of two (the barrier that let the next step overwrite the tiles is the one that publishes
//   them);
// - inside a step, the four workgroup vec4 of row kk + 1 are loaded into registers before row
//   kk's 32 FMAs use the four loaded before them.
//
// The buffers are unpadded, 2 x 2 x 512 vec4 = 32 KiB (the host checks the adapter's workgroup
// storage, `DB_WORKGROUP_BYTES` in gemm.rs): a row of a tile is 32 vec4, and instead of a pad
// vec4 the columns of row kk are XOR-swizzled by kk / 2 (`swz`). That keeps the FMA loop's
// reads conflict-free (a half-warp's 16 columns stay one aligned block of 16) and makes the
// stores of an operand stored along k conflict-free: a warp writes the 4 lanes of one column
// in rows 0, 2, .., 14, which the swizzle spreads over 8 different vec4 of the 32 banks.

const DT: u32 = 512u; // vec4 per buffer of one operand's tile: WK rows of WM / 4
var<workgroup> wa2: array<vec4<f32>, 1024>; // [2][WK][32], columns swizzled by swz
var<workgroup> wb2: array<vec4<f32>, 1024>; // [2][WK][32], columns swizzled by swz

// Where vec4 column col (0..31) of tile row kk (0..15) lives in one buffer: at most
// 15 * 32 + 31 = 511 (kk / 2 < 8, so col ^ (kk / 2) < 32). Rows kk and kk + 1 of an even kk
// share the swizzle, so a pair along k is the same column 32 vec4 apart.
fn swz(kk: u32, col: u32) -> u32 {
    return kk * 32u + (col ^ (kk >> 1u));
}

// A pair at `at` (as put_pair_a places it) into buffer `buf` (0 or DT) of a tile `t` (0: a's,
// 1: b's). Along k, at.y is even (<= 14), so the second row's index is the first's + 32, still
// inside the buffer (swz of row at.y + 1 <= 15); across, x is even, so the second lane is
// l0 + 1 <= 3.
fn put_pair_db(t: u32, buf: u32, at: vec2<u32>, along_k: bool, v: vec2<f32>) {
    let w0 = buf + swz(at.y, at.x / 4u);
    let l0 = at.x % 4u;
    let w1 = select(w0, w0 + 32u, along_k);
    let l1 = select(l0 + 1u, l0, along_k);
    if (t == 0u) {
        wa2[w0][l0] = v.x;
        wa2[w1][l1] = v.y;
    } else {
        wb2[w0][l0] = v.x;
        wb2[w1][l1] = v.y;
    }
}

fn put_a128_db(lid: u32, buf: u32, f: FragA) {
    let ak = gp.ta == 0u;
    put_pair_db(0u, buf, pair_pos(lid, 0u, ak), ak, widen_a(f.p0));
    put_pair_db(0u, buf, pair_pos(lid, 1u, ak), ak, widen_a(f.p1));
    put_pair_db(0u, buf, pair_pos(lid, 2u, ak), ak, widen_a(f.p2));
    put_pair_db(0u, buf, pair_pos(lid, 3u, ak), ak, widen_a(f.p3));
}

fn put_b128_db(lid: u32, buf: u32, f: FragB) {
    let bk = gp.tb != 0u;
    put_pair_db(1u, buf, pair_pos(lid, 0u, bk), bk, widen_b(f.p0));
    put_pair_db(1u, buf, pair_pos(lid, 1u, bk), bk, widen_b(f.p1));
    put_pair_db(1u, buf, pair_pos(lid, 2u, bk), bk, widen_b(f.p2));
    put_pair_db(1u, buf, pair_pos(lid, 3u, bk), bk, widen_b(f.p3));
}

// A thread's 8 x 8 block of c, named as in matmul128 (cR0 / cR1: row 4 ty + R at columns 4 tx
// and 64 + 4 tx; dR0 / dR1 the same at row 64 + 4 ty + R): fixed fields, never an array
// indexed by a counter.
struct Acc128 {
    c00: vec4<f32>, c01: vec4<f32>, c10: vec4<f32>, c11: vec4<f32>,
    c20: vec4<f32>, c21: vec4<f32>, c30: vec4<f32>, c31: vec4<f32>,
    d00: vec4<f32>, d01: vec4<f32>, d10: vec4<f32>, d11: vec4<f32>,
    d20: vec4<f32>, d21: vec4<f32>, d30: vec4<f32>, d31: vec4<f32>,
}

// One row of k: acc += (a0 | a1) (8 rows of a) x (b0 | b1) (8 columns of b), 64 FMAs.
fn mac128(acc: Acc128, a0: vec4<f32>, a1: vec4<f32>, b0: vec4<f32>, b1: vec4<f32>) -> Acc128 {
    var r = acc;
    r.c00 = fma(vec4<f32>(a0.x), b0, r.c00); r.c01 = fma(vec4<f32>(a0.x), b1, r.c01);
    r.c10 = fma(vec4<f32>(a0.y), b0, r.c10); r.c11 = fma(vec4<f32>(a0.y), b1, r.c11);
    r.c20 = fma(vec4<f32>(a0.z), b0, r.c20); r.c21 = fma(vec4<f32>(a0.z), b1, r.c21);
    r.c30 = fma(vec4<f32>(a0.w), b0, r.c30); r.c31 = fma(vec4<f32>(a0.w), b1, r.c31);
    r.d00 = fma(vec4<f32>(a1.x), b0, r.d00); r.d01 = fma(vec4<f32>(a1.x), b1, r.d01);
    r.d10 = fma(vec4<f32>(a1.y), b0, r.d10); r.d11 = fma(vec4<f32>(a1.y), b1, r.d11);
    r.d20 = fma(vec4<f32>(a1.z), b0, r.d20); r.d21 = fma(vec4<f32>(a1.z), b1, r.d21);
    r.d30 = fma(vec4<f32>(a1.w), b0, r.d30); r.d31 = fma(vec4<f32>(a1.w), b1, r.d31);
    return r;
}

// A thread's 8 x 8 block into c (those inside the product): rows at.x + R and at.y + R
// (R = 0..3), columns at.z + 0..3 and at.w + 0..3.
fn store_acc128(acc: Acc128, at: vec4<u32>) {
    store4(at.x, at.z, acc.c00); store4(at.x, at.w, acc.c01);
    store4(at.x + 1u, at.z, acc.c10); store4(at.x + 1u, at.w, acc.c11);
    store4(at.x + 2u, at.z, acc.c20); store4(at.x + 2u, at.w, acc.c21);
    store4(at.x + 3u, at.z, acc.c30); store4(at.x + 3u, at.w, acc.c31);
    store4(at.y, at.z, acc.d00); store4(at.y, at.w, acc.d01);
    store4(at.y + 1u, at.z, acc.d10); store4(at.y + 1u, at.w, acc.d11);
    store4(at.y + 2u, at.z, acc.d20); store4(at.y + 2u, at.w, acc.d21);
    store4(at.y + 3u, at.z, acc.d30); store4(at.y + 3u, at.w, acc.d31);
}

@compute @workgroup_size(256)
fn matmul128_db(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
                @builtin(local_invocation_index) lid: u32) {
    let origin = tile_origin(wid, nwg, WM, WM);
    if (origin.z == 0u) {
        return; // the tail of a 2-D grid
    }
    let m0 = origin.x;
    let n0 = origin.y;
    let tx = lid % 16u;
    let ty = lid / 16u;
    let z = vec4<f32>(0.0);
    var acc = Acc128(z, z, z, z, z, z, z, z, z, z, z, z, z, z, z, z);
    var fa = fetch_a128(lid, m0, 0u);
    var fb = fetch_b128(lid, 0u, n0);
    put_a128_db(lid, 0u, fa);
    put_b128_db(lid, 0u, fb);
    workgroupBarrier();
    for (var k0 = 0u; k0 < gp.k; k0 = k0 + WK) {
        // Step k0 / WK's tiles are in buffer `cur` (0 or DT by construction); the next step's
        // go into the other, which every thread finished reading before the last barrier.
        let cur = ((k0 / WK) & 1u) * DT;
        let more = k0 + WK < gp.k;
        // The next step's elements are in flight while this step's FMAs run.
        if (more) {
            fa = fetch_a128(lid, m0, k0 + WK);
            fb = fetch_b128(lid, k0 + WK, n0);
        }
        // Row kk's workgroup loads are in flight while row kk - 1's FMAs run.
        var a0 = wa2[cur + swz(0u, ty)];
        var a1 = wa2[cur + swz(0u, ty + 16u)];
        var b0 = wb2[cur + swz(0u, tx)];
        var b1 = wb2[cur + swz(0u, tx + 16u)];
        for (var kk = 1u; kk < WK; kk = kk + 1u) {
            let na0 = wa2[cur + swz(kk, ty)];
            let na1 = wa2[cur + swz(kk, ty + 16u)];
            let nb0 = wb2[cur + swz(kk, tx)];
            let nb1 = wb2[cur + swz(kk, tx + 16u)];
            acc = mac128(acc, a0, a1, b0, b1);
            a0 = na0;
            a1 = na1;
            b0 = nb0;
            b1 = nb1;
        }
        acc = mac128(acc, a0, a1, b0, b1);
        // `more` is uniform (k0 and gp.k are), so every thread reaches the barrier or none.
        if (more) {
            put_a128_db(lid, DT - cur, fa);
            put_b128_db(lid, DT - cur, fb);
            workgroupBarrier();
        }
    }
    let i0 = m0 + 4u * ty;
    let i1 = m0 + 64u + 4u * ty;
    let j0 = n0 + 4u * tx;
    let j1 = n0 + 64u + 4u * tx;
    store_acc128(acc, vec4<u32>(i0, i1, j0, j1));
}
