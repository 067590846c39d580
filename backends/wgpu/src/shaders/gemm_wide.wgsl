// gemm_wide.wgsl: matmul128_w, matmul128 (gemm.wgsl, whose workgroup tiles `wa` / `wb`, fetches,
// pair positions, puts and stores it uses: the host puts this file after it in one module) on
// half the threads, each with twice the outputs, for a driver that gives matmul128 too few
// registers to keep enough loads in flight (NVIDIA's Vulkan compiler: 127 registers, against
// NVRTC's 171 for the same algorithm in CUDA C, lab/wgpu/gemm_twin.py). Behind
// `WgpuOptions::gemm = GemmKernel::Wide`:
//
// - 128 threads, one 128 x 128 tile of c a workgroup (the same grid as matmul128), each thread
//   8 rows x 16 columns of c in 32 vec4 registers;
// - per row kk of the k-step, 2 vec4 of a's tile (8 rows) and 4 of b's (16 columns) for 128
//   FMAs: 6 workgroup loads per 128 FMAs, against matmul128's 8;
// - each thread fetches 16 elements of each operand a k-step (8 pairs): the pairs of
//   matmul128's threads lid and lid + 128 (`fetch_a128` / `put_a128` at both), so the global
//   reads keep matmul128's coalescing and the workgroup writes its conflict-free pattern;
// - single-buffered like matmul128 (two barriers a k-step), in the same padded [16][33] vec4
//   tiles (16.5 KiB), the next k-step's fragments prefetched into registers.
//
// Its live state (128 accumulators, 32 prefetched and 24 operand floats) is past what a thread
// holds without spilling: NVRTC compiles its CUDA twin (lab/wgpu/gemm_twin.py) to 255 registers
// and 56 bytes of spills. Kept behind its switch to measure what Vulkan makes of it; if it
// loses, fetching the second half of the fragments after the FMAs is the first thing to try.
//
// The thread -> output mapping: tx = lid % 8, ty = lid / 8 (0..15). Thread (tx, ty) owns rows
// 4 ty + R and 64 + 4 ty + R (R = 0..3: vec4 ty and ty + 16 of a tile row of a) and columns
// 4 tx + C, 32 + 4 tx + C, 64 + 4 tx + C, 96 + 4 tx + C (vec4 tx, tx + 8, tx + 16, tx + 24 of
// a tile row of b). A warp (32 consecutive lid) is tx = 0..7 by four ty: each of its b reads is
// 8 consecutive vec4 (128 contiguous bytes, one shared-memory wavefront, each vec4 broadcast to
// 4 threads), each a read 4 consecutive vec4 (each broadcast to 8 threads): no bank conflicts.
// Interleaving the column blocks at a stride of 8 vec4 (rather than 16 contiguous columns a
// thread) is what keeps a warp's b reads one contiguous block.
//
// Every workgroup index is in bounds by construction (the module has no runtime checks): kk < 16,
// ty + 16 < 32 and tx + 24 < 32, so kk * WS + 31 <= 15 * 33 + 31 = 526 < 528; the puts see
// lid and lid + 128 < 256, matmul128's range.

// A thread's 8 x 16 block of c: cRC is row 4 ty + R at columns 32 C + 4 tx .. + 3, dRC the same
// at row 64 + 4 ty + R. Fixed fields, never an array indexed by a counter.
struct AccW {
    c00: vec4<f32>, c01: vec4<f32>, c02: vec4<f32>, c03: vec4<f32>,
    c10: vec4<f32>, c11: vec4<f32>, c12: vec4<f32>, c13: vec4<f32>,
    c20: vec4<f32>, c21: vec4<f32>, c22: vec4<f32>, c23: vec4<f32>,
    c30: vec4<f32>, c31: vec4<f32>, c32: vec4<f32>, c33: vec4<f32>,
    d00: vec4<f32>, d01: vec4<f32>, d02: vec4<f32>, d03: vec4<f32>,
    d10: vec4<f32>, d11: vec4<f32>, d12: vec4<f32>, d13: vec4<f32>,
    d20: vec4<f32>, d21: vec4<f32>, d22: vec4<f32>, d23: vec4<f32>,
    d30: vec4<f32>, d31: vec4<f32>, d32: vec4<f32>, d33: vec4<f32>,
}

// A thread's 16 elements of one operand's tile for one k-step (8 pairs): matmul128's fragments
// of threads lid (`lo`) and lid + 128 (`hi`), in the stored dtype.
struct FragAW {
    lo: FragA, hi: FragA,
}

struct FragBW {
    lo: FragB, hi: FragB,
}

fn fetch_aw(lid: u32, m0: u32, k0: u32) -> FragAW {
    return FragAW(fetch_a128(lid, m0, k0), fetch_a128(lid + 128u, m0, k0));
}

fn fetch_bw(lid: u32, k0: u32, n0: u32) -> FragBW {
    return FragBW(fetch_b128(lid, k0, n0), fetch_b128(lid + 128u, k0, n0));
}

// Row i of c at the 16 columns j + 32 C + 0..3 (C = 0..3), those inside the product.
fn store16(i: u32, j: u32, v0: vec4<f32>, v1: vec4<f32>, v2: vec4<f32>, v3: vec4<f32>) {
    store4(i, j, v0);
    store4(i, j + 32u, v1);
    store4(i, j + 64u, v2);
    store4(i, j + 96u, v3);
}

@compute @workgroup_size(128)
fn matmul128_w(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
               @builtin(local_invocation_index) lid: u32) {
    let origin = tile_origin(wid, nwg, WM, WM);
    if (origin.z == 0u) {
        return; // the tail of a 2-D grid
    }
    let m0 = origin.x;
    let n0 = origin.y;
    let tx = lid % 8u;
    let ty = lid / 8u;
    let z = vec4<f32>(0.0);
    var acc = AccW(z, z, z, z, z, z, z, z, z, z, z, z, z, z, z, z,
                   z, z, z, z, z, z, z, z, z, z, z, z, z, z, z, z);
    var fa = fetch_aw(lid, m0, 0u);
    var fb = fetch_bw(lid, 0u, n0);
    for (var k0 = 0u; k0 < gp.k; k0 = k0 + WK) {
        put_a128(lid, fa.lo);
        put_a128(lid + 128u, fa.hi);
        put_b128(lid, fb.lo);
        put_b128(lid + 128u, fb.hi);
        workgroupBarrier();
        // The next step's elements are in flight while this step's FMAs run.
        if (k0 + WK < gp.k) {
            fa = fetch_aw(lid, m0, k0 + WK);
            fb = fetch_bw(lid, k0 + WK, n0);
        }
        for (var kk = 0u; kk < WK; kk = kk + 1u) {
            let a0 = wa[kk * WS + ty];
            let a1 = wa[kk * WS + ty + 16u];
            let b0 = wb[kk * WS + tx];
            let b1 = wb[kk * WS + tx + 8u];
            let b2 = wb[kk * WS + tx + 16u];
            let b3 = wb[kk * WS + tx + 24u];
            var s = vec4<f32>(a0.x);
            acc.c00 = fma(s, b0, acc.c00); acc.c01 = fma(s, b1, acc.c01);
            acc.c02 = fma(s, b2, acc.c02); acc.c03 = fma(s, b3, acc.c03);
            s = vec4<f32>(a0.y);
            acc.c10 = fma(s, b0, acc.c10); acc.c11 = fma(s, b1, acc.c11);
            acc.c12 = fma(s, b2, acc.c12); acc.c13 = fma(s, b3, acc.c13);
            s = vec4<f32>(a0.z);
            acc.c20 = fma(s, b0, acc.c20); acc.c21 = fma(s, b1, acc.c21);
            acc.c22 = fma(s, b2, acc.c22); acc.c23 = fma(s, b3, acc.c23);
            s = vec4<f32>(a0.w);
            acc.c30 = fma(s, b0, acc.c30); acc.c31 = fma(s, b1, acc.c31);
            acc.c32 = fma(s, b2, acc.c32); acc.c33 = fma(s, b3, acc.c33);
            s = vec4<f32>(a1.x);
            acc.d00 = fma(s, b0, acc.d00); acc.d01 = fma(s, b1, acc.d01);
            acc.d02 = fma(s, b2, acc.d02); acc.d03 = fma(s, b3, acc.d03);
            s = vec4<f32>(a1.y);
            acc.d10 = fma(s, b0, acc.d10); acc.d11 = fma(s, b1, acc.d11);
            acc.d12 = fma(s, b2, acc.d12); acc.d13 = fma(s, b3, acc.d13);
            s = vec4<f32>(a1.z);
            acc.d20 = fma(s, b0, acc.d20); acc.d21 = fma(s, b1, acc.d21);
            acc.d22 = fma(s, b2, acc.d22); acc.d23 = fma(s, b3, acc.d23);
            s = vec4<f32>(a1.w);
            acc.d30 = fma(s, b0, acc.d30); acc.d31 = fma(s, b1, acc.d31);
            acc.d32 = fma(s, b2, acc.d32); acc.d33 = fma(s, b3, acc.d33);
        }
        workgroupBarrier();
    }
    let i0 = m0 + 4u * ty;
    let i1 = m0 + 64u + 4u * ty;
    let j = n0 + 4u * tx;
    store16(i0, j, acc.c00, acc.c01, acc.c02, acc.c03);
    store16(i0 + 1u, j, acc.c10, acc.c11, acc.c12, acc.c13);
    store16(i0 + 2u, j, acc.c20, acc.c21, acc.c22, acc.c23);
    store16(i0 + 3u, j, acc.c30, acc.c31, acc.c32, acc.c33);
    store16(i1, j, acc.d00, acc.d01, acc.d02, acc.d03);
    store16(i1 + 1u, j, acc.d10, acc.d11, acc.d12, acc.d13);
    store16(i1 + 2u, j, acc.d20, acc.d21, acc.d22, acc.d23);
    store16(i1 + 3u, j, acc.d30, acc.d31, acc.d32, acc.d33);
}
