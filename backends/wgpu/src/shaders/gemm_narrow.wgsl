// gemm_narrow.wgsl: matmul128_n, matmul128 (gemm.wgsl, whose a tile `wa`, fetches, puts and
// stores it uses, and gemm_wide.wgsl's `fetch_aw`: the host puts this file after both in one
// module) on half the threads with the same work per thread, so half the tile of c: 128 rows x
// 64 columns. Behind `WgpuOptions::gemm = GemmKernel::Narrow` (`DFLASH_WGPU_GEMM=matmul128_n`),
// untimed, off by default.
//
// Why: NVIDIA's Vulkan compiler gives matmul128 (256 threads) 127 registers, as if it aimed at
// two workgroups a multiprocessor, where NVRTC gives the same algorithm in CUDA C 171 and it
// runs 41.7 TFLOP/s against Vulkan's 26-27 (lab/wgpu/gemm_twin.py); the attention kernels, of
// 128 threads, get 156-254 registers from the same driver. The hypothesis: the driver caps a
// thread's registers by the workgroup's size. This kernel keeps matmul128's per-thread
// algorithm (8 x 8 outputs in sixteen vec4, 4 workgroup vec4 loads per 64 FMAs, k-steps of 16,
// the next step's fragments prefetched into registers before the FMAs, two barriers a step) on
// a 128-thread workgroup, to see whether it gets the registers matmul128 wants. Its cost: each
// element of a's tile now feeds 64 columns instead of 128, so a is read from global memory
// twice as often per output (the b traffic is unchanged).
//
// The thread -> output mapping: tx = lid % 8, ty = lid / 8 (0..15). Thread (tx, ty) owns rows
// 4 ty + R and 64 + 4 ty + R (R = 0..3: vec4 ty and ty + 16 of a tile row of a, matmul128's
// reads) and columns 4 tx + C and 32 + 4 tx + C (C = 0..3: vec4 tx and tx + 8 of a row of b's
// 64-wide tile). A warp (32 consecutive lid) is tx = 0..7 by four ty: each of its b reads is 8
// consecutive vec4 (128 contiguous bytes, one shared-memory wavefront, each vec4 broadcast to
// 4 threads), each a read 4 consecutive vec4 (each broadcast to 8 threads): no bank conflicts.
//
// Loads: a's tile is matmul128's 128 x 16 (`wa`), fetched as the fragments of matmul128's
// threads lid and lid + 128 (`fetch_aw`, `put_a128` at both), so its global reads keep
// matmul128's coalescing and its workgroup writes matmul128's pattern. b's tile is 16 x 64:
// 512 pairs, 4 a thread (`pair_pos_n`), in `wb_n`, k-major vec4 rows one vec4 past the tile
// width. A row is 17 vec4 = 68 words, 4 modulo 32 banks like matmul128's 33 vec4 = 132 words,
// and a warp's pairs cover the same positions modulo 32 as a warp's of matmul128 (along k:
// four x by eight even kk; across: 32 even x of one kk), so b's puts meet the banks exactly as
// matmul128's do (two threads a bank on a warp's 32 scalar writes, in both kernels, once a
// k-step). Workgroup memory: `wa` and `wb_n`, 12.5 KiB (`put_a128` reaches only `wa`, so
// matmul128's `wb` is not in this entry point's compacted module; pipelines/tests.rs checks
// the bytes).
//
// Every workgroup index is in bounds by construction (the module has no runtime checks):
// - FMA reads: kk < 16, ty + 16 < 32 and tx + 8 < 16, so wa's index is at most 15 * 33 + 31 =
//   526 < 528 and wb_n's 15 * 17 + 15 = 270 < 272;
// - a's puts: `put_a128` at lid and lid + 128 < 256, matmul128's range;
// - b's puts (`put_pair_n`): along k, x = lid / 8 + 16 p <= 15 + 48 = 63 and kk = 2 (lid % 8)
//   <= 14, so the second row's index is at most 15 * 17 + 63 / 4 = 270; across, x = 2 (lid %
//   32) <= 62 and kk = lid / 32 + 4 p <= 3 + 12 = 15, so at most 15 * 17 + 62 / 4 = 270, and
//   the lane x % 4 + 1 <= 3 (x is even). All < 272.

const WN: u32 = 64u; // columns of the tile of c (rows: matmul128's WM)
const WSN: u32 = 17u; // vec4 per row of b's tile: WN / 4 + 1
var<workgroup> wb_n: array<vec4<f32>, 272>; // [WK][WSN]

// Where pair p (0..3) of thread lid (0..127) starts in b's 64 x 16 tile whose stored matrix is
// contiguous along k (`along_k`: the pair is (kk, kk + 1)) or along n (the pair is (x, x + 1)):
// (x of 64, kk of 16). Along k, 8 consecutive threads read one stored row's 16 consecutive
// elements (rows lid / 8 + 16 p); across, 32 consecutive threads read one k row's 64 (k rows
// lid / 32 + 4 p). An f16 pair at an even element index is one 32-bit load.
fn pair_pos_n(lid: u32, p: u32, along_k: bool) -> vec2<u32> {
    if (along_k) {
        return vec2<u32>(lid / 8u + 16u * p, 2u * (lid % 8u));
    }
    return vec2<u32>(2u * (lid % 32u), lid / 32u + 4u * p);
}

// Pair p of b's 64-wide tile at (k0, n0) for thread lid, 0 outside the product (as fetch_b2).
fn fetch_b2n(lid: u32, p: u32, k0: u32, n0: u32) -> Raw_b {
    let at = pair_pos_n(lid, p, gp.tb != 0u);
    let j = n0 + at.x;
    let kk = k0 + at.y;
    if (gp.tb != 0u) {
        let inside = j < gp.n;
        return pair_b(gp.b_off + j * gp.ldb + kk, inside && kk < gp.k, inside && kk + 1u < gp.k);
    }
    let inside = kk < gp.k;
    return pair_b(gp.b_off + kk * gp.ldb + j, inside && j < gp.n, inside && j + 1u < gp.n);
}

fn fetch_bn(lid: u32, k0: u32, n0: u32) -> FragB {
    return FragB(fetch_b2n(lid, 0u, k0, n0), fetch_b2n(lid, 1u, k0, n0),
                 fetch_b2n(lid, 2u, k0, n0), fetch_b2n(lid, 3u, k0, n0));
}

// A pair at `at` into wb_n (put_pair_b's for b's 64-wide tile).
fn put_pair_n(at: vec2<u32>, along_k: bool, v: vec2<f32>) {
    let s = pair_slots(at, along_k, WSN);
    wb_n[s.x][s.y] = v.x;
    wb_n[s.z][s.w] = v.y;
}

fn put_bn(lid: u32, f: FragB) {
    let bk = gp.tb != 0u;
    put_pair_n(pair_pos_n(lid, 0u, bk), bk, widen_b(f.p0));
    put_pair_n(pair_pos_n(lid, 1u, bk), bk, widen_b(f.p1));
    put_pair_n(pair_pos_n(lid, 2u, bk), bk, widen_b(f.p2));
    put_pair_n(pair_pos_n(lid, 3u, bk), bk, widen_b(f.p3));
}

@compute @workgroup_size(128)
fn matmul128_n(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let origin = tile_origin(wid, nwg, WM, WN);
    if (origin.z == 0u) {
        return; // the tail of a 2-D grid
    }
    let m0 = origin.x;
    let n0 = origin.y;
    let tx = lid % 8u;
    let ty = lid / 8u;
    // gemm_db.wgsl's Acc128, its columns here 4 tx and 32 + 4 tx.
    let z = vec4<f32>(0.0);
    var acc = Acc128(z, z, z, z, z, z, z, z, z, z, z, z, z, z, z, z);
    var fa = fetch_aw(lid, m0, 0u);
    var fb = fetch_bn(lid, 0u, n0);
    for (var k0 = 0u; k0 < gp.k; k0 = k0 + WK) {
        put_a128(lid, fa.lo);
        put_a128(lid + 128u, fa.hi);
        put_bn(lid, fb);
        workgroupBarrier();
        // The next step's elements are in flight while this step's FMAs run.
        if (k0 + WK < gp.k) {
            fa = fetch_aw(lid, m0, k0 + WK);
            fb = fetch_bn(lid, k0 + WK, n0);
        }
        for (var kk = 0u; kk < WK; kk = kk + 1u) {
            let a0 = wa[kk * WS + ty];
            let a1 = wa[kk * WS + ty + 16u];
            let b0 = wb_n[kk * WSN + tx];
            let b1 = wb_n[kk * WSN + tx + 8u];
            acc = mac128(acc, a0, a1, b0, b1);
        }
        workgroupBarrier();
    }
    let i0 = m0 + 4u * ty;
    let i1 = m0 + 64u + 4u * ty;
    let j0 = n0 + 4u * tx;
    let j1 = n0 + 32u + 4u * tx;
    store_acc128(acc, vec4<u32>(i0, i1, j0, j1));
}
