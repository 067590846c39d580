#!/usr/bin/env python3
"""The wgpu GEMM's algorithm in CUDA C: is 25 TFLOP/s the algorithm or the Vulkan compiler?

`matmul128` (backends/wgpu/src/shaders/gemm.wgsl) runs `gemm.f32.8192` (a @ b^T, f32) at
~25 TFLOP/s on the H200 through Vulkan, 0.37 of the f32 peak, though its inner loop is 4
vec4 workgroup loads per 64 FMAs. This is the same kernel written in CUDA C, statement for
statement: 256 threads, a 128 x 128 tile of c, 8 x 8 outputs a thread in sixteen float4,
k-steps of 16 through two padded [16][33] float4 tiles, each thread fetching its next
k-step's 8 elements of each operand into registers (pairs along k: a and b^T are both
stored k-contiguous) before the step's FMAs, and the same bounds tests on every load.
Compiled by NVRTC for sm_90 and timed with CUDA events, with the compiler's register count
and local-memory (spill) bytes. If the twin runs far faster than 25, the WGSL path loses in
translation (what to look at then: the SASS of the Vulkan pipeline); if not, the algorithm
is the limit and the next GEMM must change it.

Variants (one define each): CHECKED (the WGSL loads' bounds tests, the default), and
UNCHECKED (no tests: sizes are multiples of the tile).

Usage (repo root, on the GPU machine; CuPy is in its image): python3 lab/wgpu/gemm_twin.py
"""
import sys

import cupy as cp

SRC = r"""
#define WM 128
#define WK 16
#define WS 33

struct Frag { float4 lo, hi; };

__device__ __forceinline__ float2 pair(const float* g, long at, bool lo, bool hi) {
#ifdef UNCHECKED
    return make_float2(g[at], g[at + 1]);
#else
    float2 v = make_float2(0.f, 0.f);
    if (lo) v.x = g[at];
    if (hi) v.y = g[at + 1];
    return v;
#endif
}

// Pair p of thread lid of a 128 x 16 tile stored k-contiguous at rows r0.., columns k0..
__device__ __forceinline__ float2 fetch2(const float* g, int ld, int rows, int k, int lid,
                                         int p, int r0, int k0) {
    int x = lid / 8 + 32 * p, kk = 2 * (lid % 8);
    int i = r0 + x, c = k0 + kk;
    bool in = i < rows;
    return pair(g, (long)i * ld + c, in && c < k, in && c + 1 < k);
}

__device__ __forceinline__ Frag fetch(const float* g, int ld, int rows, int k, int lid,
                                      int r0, int k0) {
    float2 a = fetch2(g, ld, rows, k, lid, 0, r0, k0), b = fetch2(g, ld, rows, k, lid, 1, r0, k0);
    float2 c = fetch2(g, ld, rows, k, lid, 2, r0, k0), d = fetch2(g, ld, rows, k, lid, 3, r0, k0);
    return Frag{make_float4(a.x, a.y, b.x, b.y), make_float4(c.x, c.y, d.x, d.y)};
}

__device__ __forceinline__ void put1(float4* t, int lid, int p, float2 v) {
    int x = lid / 8 + 32 * p, kk = 2 * (lid % 8);
    float* w0 = (float*)&t[kk * WS + x / 4] + x % 4;
    float* w1 = (float*)&t[(kk + 1) * WS + x / 4] + x % 4;
    *w0 = v.x;
    *w1 = v.y;
}

__device__ __forceinline__ void put(float4* t, int lid, Frag f) {
    put1(t, lid, 0, make_float2(f.lo.x, f.lo.y));
    put1(t, lid, 1, make_float2(f.lo.z, f.lo.w));
    put1(t, lid, 2, make_float2(f.hi.x, f.hi.y));
    put1(t, lid, 3, make_float2(f.hi.z, f.hi.w));
}

#define FMA4(c, s, b) c.x = fmaf(s, b.x, c.x); c.y = fmaf(s, b.y, c.y); \
                      c.z = fmaf(s, b.z, c.z); c.w = fmaf(s, b.w, c.w);

__device__ __forceinline__ void store4(float* c, int ldc, int m, int n, int i, int j, float4 v) {
    if (i >= m) return;
    if (j < n) c[(long)i * ldc + j] = v.x;
    if (j + 1 < n) c[(long)i * ldc + j + 1] = v.y;
    if (j + 2 < n) c[(long)i * ldc + j + 2] = v.z;
    if (j + 3 < n) c[(long)i * ldc + j + 3] = v.w;
}

// c (m, n) = a (m, k) @ b (n, k)^T, row-major.
extern "C" __global__ void __launch_bounds__(256) matmul128(const float* __restrict__ a,
        const float* __restrict__ b, float* __restrict__ c, int m, int n, int k) {
    __shared__ float4 wa[WK * WS], wb[WK * WS];
    int tiles_n = (n + WM - 1) / WM;
    int g = blockIdx.x;
    int m0 = (g / tiles_n) * WM, n0 = (g % tiles_n) * WM;
    int lid = threadIdx.x, tx = lid % 16, ty = lid / 16;
    float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
    float4 c00 = z, c01 = z, c10 = z, c11 = z, c20 = z, c21 = z, c30 = z, c31 = z;
    float4 d00 = z, d01 = z, d10 = z, d11 = z, d20 = z, d21 = z, d30 = z, d31 = z;
    Frag fa = fetch(a, k, m, k, lid, m0, 0), fb = fetch(b, k, n, k, lid, n0, 0);
    for (int k0 = 0; k0 < k; k0 += WK) {
        put(wa, lid, fa);
        put(wb, lid, fb);
        __syncthreads();
        if (k0 + WK < k) {
            fa = fetch(a, k, m, k, lid, m0, k0 + WK);
            fb = fetch(b, k, n, k, lid, n0, k0 + WK);
        }
#pragma unroll
        for (int kk = 0; kk < WK; kk++) {
            float4 a0 = wa[kk * WS + ty], a1 = wa[kk * WS + ty + 16];
            float4 b0 = wb[kk * WS + tx], b1 = wb[kk * WS + tx + 16];
            FMA4(c00, a0.x, b0) FMA4(c01, a0.x, b1) FMA4(c10, a0.y, b0) FMA4(c11, a0.y, b1)
            FMA4(c20, a0.z, b0) FMA4(c21, a0.z, b1) FMA4(c30, a0.w, b0) FMA4(c31, a0.w, b1)
            FMA4(d00, a1.x, b0) FMA4(d01, a1.x, b1) FMA4(d10, a1.y, b0) FMA4(d11, a1.y, b1)
            FMA4(d20, a1.z, b0) FMA4(d21, a1.z, b1) FMA4(d30, a1.w, b0) FMA4(d31, a1.w, b1)
        }
        __syncthreads();
    }
    int i0 = m0 + 4 * ty, i1 = m0 + 64 + 4 * ty, j0 = n0 + 4 * tx, j1 = n0 + 64 + 4 * tx;
    store4(c, n, m, n, i0, j0, c00); store4(c, n, m, n, i0, j1, c01);
    store4(c, n, m, n, i0 + 1, j0, c10); store4(c, n, m, n, i0 + 1, j1, c11);
    store4(c, n, m, n, i0 + 2, j0, c20); store4(c, n, m, n, i0 + 2, j1, c21);
    store4(c, n, m, n, i0 + 3, j0, c30); store4(c, n, m, n, i0 + 3, j1, c31);
    store4(c, n, m, n, i1, j0, d00); store4(c, n, m, n, i1, j1, d01);
    store4(c, n, m, n, i1 + 1, j0, d10); store4(c, n, m, n, i1 + 1, j1, d11);
    store4(c, n, m, n, i1 + 2, j0, d20); store4(c, n, m, n, i1 + 2, j1, d21);
    store4(c, n, m, n, i1 + 3, j0, d30); store4(c, n, m, n, i1 + 3, j1, d31);
}
"""


def run(define, size, runs):
    opts = ("-arch=sm_90", "-lineinfo") + ((f"-D{define}",) if define else ())
    kern = cp.RawKernel(SRC, "matmul128", options=opts)
    m = n = k = size
    rng = cp.random.default_rng(0)
    a = rng.standard_normal((m, k), dtype=cp.float32)
    b = rng.standard_normal((n, k), dtype=cp.float32)
    c = cp.full((m, n), cp.nan, dtype=cp.float32)
    grid = (((m + 127) // 128) * ((n + 127) // 128),)
    args = (a, b, c, cp.int32(m), cp.int32(n), cp.int32(k))
    kern(grid, (256,), args)  # warm-up and correctness
    cp.cuda.Device().synchronize()
    ref = a[:256] @ b.T  # a 256-row slice against cuBLAS (f32, or TF32 if enabled)
    err = float(cp.max(cp.abs(c[:256] - ref)) / cp.max(cp.abs(ref)))
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for _ in range(runs):
        start.record()
        kern(grid, (256,), args)
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop) / 1e3)
    best = min(times)
    tf = 2.0 * m * n * k / best / 1e12
    print(f"{define or 'CHECKED'}: {size}^3 f32 a @ b^T: {tf:.1f} TFLOP/s (best of {runs}, "
          f"median {2.0 * m * n * k / sorted(times)[runs // 2] / 1e12:.1f}); regs "
          f"{kern.num_regs}, local bytes {kern.local_size_bytes}, shared {kern.shared_size_bytes}; "
          f"max rel err vs cuBLAS {err:.2e}")


def main():
    size = int(sys.argv[1]) if len(sys.argv) > 1 else 8192
    for define in ["", "UNCHECKED"]:
        run(define, size, 10)


if __name__ == "__main__":
    main()
