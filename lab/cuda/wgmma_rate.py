#!/usr/bin/env python3
"""Tensor-core rate of the wgmma shapes the attention backward issues (lab microbenchmark, run 31).

The backward step (64 queries x 128 keys, head_dim 128) is 48 SS m64n64k16 wgmmas (S^T, dP^T, dQ) and
16 RS m64n128k16 (dV, dK). An SS m64n64k16 reads 4 KB of shared memory for 131 kFLOP: at the SM's
4096 dense bf16 FLOP/clock that is 128 B/clock, all of shared memory's bandwidth. This measures what
each shape really sustains, with one or two warpgroups issuing and with a third warpgroup writing
shared memory (the backward's TMA, dS^T and dQ-staging traffic), so the step's floor is known.

One CTA per SM (132 x 384 threads, ~200 KB of shared memory holding random bf16); each issuing
warpgroup runs `iters` groups of 8 wgmmas (fence, 8 x wgmma, commit, wait 0) on the 128-byte-swizzled
panels the kernel uses. Reported: clocks per wgmma per warpgroup (clock64 of CTA 0) and the chip's
TFLOP/s from CUDA events.

Usage (repo root, on the H200): python3 lab/cuda/wgmma_rate.py
"""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import attention_lab as lab  # noqa: E402

# op ids: 0 SS m64n64k16 (K-major A and B: S^T), 1 SS m64n128k16, 2 RS m64n128k16 (dV/dK),
# 3 SS m64n64k16 both transposed (dQ), 4 RS m64n64k16, 5 SS m64n256k16 is not generated (no helper)
BENCH = r"""
#ifdef ATTN_WGMMA
// the 1024-byte-aligned dynamic shared memory (returned: its address; sb: its pointer), 192 KB of random small bf16
__device__ __forceinline__ u32 mb_smem(unsigned char*& sb) {
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const u32 raw_a = smem_u32(smem_raw);
    const u32 pad = ((raw_a + 1023u) & ~1023u) - raw_a;
    sb = smem_raw + pad;
    for (int i = threadIdx.x; i < 192 * 1024 / 4; i += blockDim.x) {
        u32 x = (u32)i * 2654435761u ^ 0x9e3779b9u;
        x ^= x >> 13; x *= 0x85ebca6bu; x ^= x >> 16;
        ((u32*)sb)[i] = (x & 0x807f807fu) | 0x3c003c00u;  // bf16 pairs in [-2, 2)
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    return raw_a + pad;
}
template <int op>
__device__ __forceinline__ void mb_body(int nwg, int noise, int iters, long long* clk, float* sink) {
    unsigned char* sb;
    const u32 sba = mb_smem(sb);
    const int tid = threadIdx.x, wg = tid >> 7;
    if (wg == 2) {
        if (noise) {  // shared-memory writes, 16 B per thread per store, into a 64 KB area the wgmmas do not read
            float4* dst = (float4*)(sb + 128 * 1024);
            const float4 v = make_float4(1.f, 2.f, 3.f, (float)tid);
            long long t0 = clock64();
            for (int it = 0; it < iters * noise; it++)
#pragma unroll
                for (int j = 0; j < 8; j++) dst[(j * 128 + (tid & 127) + it * 7) & 4095] = v;
            if ((tid & 127) == 0 && blockIdx.x == 0) clk[2] = clock64() - t0;
        }
        return;
    }
    if (wg >= nwg) return;
    float acc[64];
#pragma unroll
    for (int i = 0; i < 64; i++) acc[i] = 0.f;
    u32 a[4];
#pragma unroll
    for (int i = 0; i < 4; i++) a[i] = 0x3c003c00u ^ (u32)(tid * 977 + i);
    const u64 dA = gdesc(sba + wg * 64 * 128, 16, 1024);              // 64 rows x 128 cols, K-major panels
    const u64 dB = gdesc(sba + 32 * 1024, 16, 1024);                  // N rows, K-major
    const u64 dBt = gdesc(sba + 64 * 1024, 64 * 128, 1024);           // MN-major B (as dO^T / Q^T)
    const u64 dAt = gdesc(sba + 96 * 1024, 128 * 128, 1024);          // MN-major A (as dS)
    long long t0 = clock64();
    for (int it = 0; it < iters; it++) {
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < 8; kk++) {
            const u64 o = (u64)((kk >> 2) * 1024 + (kk & 3) * 2);  // 16-byte units: panel, 32-byte k-slice
            if constexpr (op == 0) wgmma_ss_n64(acc, dA + o, dB + o, 1);
            else if constexpr (op == 1) wgmma_ss_n128(acc, dA + o, dB + o, 1);
            else if constexpr (op == 2) wgmma_rs_n128(acc, a, dBt + (u64)(kk * 128));
            else if constexpr (op == 3) wgmma_ss_tt_n64(acc, dAt + (u64)(kk * 128), dBt + (u64)(kk * 128), 1);
            else wgmma_rs_n64(acc, a, dBt + (u64)(kk * 128));
        }
        wg_commit();
        wg_wait<0>();
        fence_regs<64>(acc);
    }
    long long t1 = clock64();
    if ((tid & 127) == 0 && blockIdx.x == 0) clk[wg] = t1 - t0;
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 64; i++) s += acc[i];
    if (s == 12345.f) sink[tid] = s;  // keeps the wgmmas
}
#define MB(op) extern "C" __global__ void __launch_bounds__(384, 1) \
    mb_op##op(int nwg, int noise, int iters, long long* clk, float* sink) { mb_body<op>(nwg, noise, iters, clk, sink); }
MB(0) MB(1) MB(2) MB(3) MB(4)

// The backward step's wgmma mix without its elementwise work or barriers: per step and warpgroup S^T and dP^T
// (16 SS m64n64k16, waited), dV and dK (8 RS m64n128k16, left in flight), and on every other step (alternating
// warpgroups; dqsplit: every step, half the columns each) the dQ (16 SS tt m64n64k16 as two halves, waited).
// flags (the real step's other parts, one at a time): 1 P^T/dS^T computed from S^T/dP^T (exp2, packing) as the A
// fragments of dV/dK; 2 a step barrier of both warpgroups (bar.sync 1, 256) after the dK/dV issue; 4 the warpgroup
// without dQ retires its dK/dV before the next step; 8 dS^T stored to shared memory (+ fence.proxy.async) first.
// Run 32 adds the rest of the kernel's step, one element at a time: 16 the ds_free mbarrier (a warpgroup stores its
// dS^T rows only once the dQ of the previous step has read them; the dQ warpgroup arrives after its dQ, the other
// after the step barrier), 32 the dQ staged in shared memory (32 float2 stores per thread and half, two tiles used
// alternately), 64 Q/dO loads (one producer thread, two 16 KB 1-d bulk copies per step from a 32 MB global buffer into
// a 2-stage ring on full/empty mbarriers; the wgmmas read the stage), 128 the writer warp (waits for the staged
// tile, adds it into a 32 KB global f32 area per CTA with one 1-d bulk reduction, frees the tile). 64 and 128 run on
// 384 threads (a producer warpgroup, setmaxnreg 24 / 240 as the kernel).
// 256: the staging (with 32) as 16-byte stores, the lane pairs first exchanging a column pair by shuffles.
// 512 (with 64 and 1): the per-step lse, D_i and row intervals (64 rows x 24 B) by producer warp 10's cp.async on the
// stage's full barrier (count 33, as the kernel), read by the elementwise part (16 float2 loads per thread).
enum { MIX_EW = 1, MIX_BAR = 2, MIX_KVW = 4, MIX_DS = 8, MIX_DSFREE = 16, MIX_STAGE = 32, MIX_LOAD = 64, MIX_WRITER = 128,
       MIX_V4 = 256, MIX_LSE = 512, MIX_LSE_NOREAD = 1024, MIX_LSE_EARLY = 2048 };
// 1024: the loads of 512 without the reads; 2048: the reads issued before the S^T/dP^T wait (under the wgmmas)
// smem: K 0, V 32K, Q/dO stage 0 64K, dS 96K, MIX_DS rows 112K, dQ staging 128K (2 x 32K), Q/dO stage 1 192K,
// mbarriers 224K: ds_free, full[2], empty[2], dq_full[2], dq_empty[2]
static __device__ __forceinline__ void mb_bulk_load(u32 dst, const void* src, u32 bytes, u32 bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}
static __device__ __forceinline__ void mb_bulk_red(float* dst, u32 src, u32 bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst), "r"(src),
                 "r"(bytes)
                 : "memory");
}
template <bool dqsplit, int flags = 0>
__device__ __forceinline__ void mix_body(int iters, long long* clk, float* sink, const unsigned char* gsrc = nullptr,
                                         float* gdq = nullptr) {
    unsigned char* sb;
    const u32 sba = mb_smem(sb);
    const int tid = threadIdx.x, wg = tid >> 7, lane = tid & 31;
    constexpr bool PROD = (flags & (MIX_LOAD | MIX_WRITER)) != 0;
    const u32 barDS = sba + 224 * 1024, barF = barDS + 8, barE = barDS + 24, barQF = barDS + 40, barQE = barDS + 56;
    if (tid == 0) {
        mbar_init(barDS, 256);
        for (int i = 0; i < 2; i++) {
            mbar_init(barF + 8 * i, (flags & MIX_LSE) ? 33 : 1);
            mbar_init(barE + 8 * i, 8);
            mbar_init(barQF + 8 * i, 128);
            mbar_init(barQE + 8 * i, 1);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    if constexpr (PROD) {
        if (wg == 2) {
            asm volatile("setmaxnreg.dec.sync.aligned.u32 24;\n");
            if ((flags & MIX_LOAD) && tid == 256) {
                for (int it = 0; it < iters; it++) {
                    const int st = it & 1;
                    if (it >= 2) mbar_wait(barE + 8 * st, ((it >> 1) - 1) & 1);
                    mbar_arrive_tx(barF + 8 * st, 32768);
                    const unsigned char* src = gsrc + ((size_t)((blockIdx.x * 977u + (unsigned)it * 61u) & 1023u) << 15);
                    const u32 dst = sba + (st ? 192 : 64) * 1024;
                    mb_bulk_load(dst, src, 16384, barF + 8 * st);
                    mb_bulk_load(dst + 16384, src + 16384, 16384, barF + 8 * st);
                }
            }
            if ((flags & MIX_LSE) && (tid >> 5) == 10) {  // lse, D_i, rows: into [stage][3][64] floats + ints
                for (int it = 0; it < iters; it++) {
                    const int st = it & 1;
                    if (it >= 2) mbar_wait(barE + 8 * st, ((it >> 1) - 1) & 1);
                    const float* src = (const float*)gsrc + (((blockIdx.x * 977u + (unsigned)it * 61u) & 1023u) << 8);
#pragma unroll
                    for (int j = 0; j < 2; j++)
#pragma unroll
                        for (int k = 0; k < 6; k++)
                            cp_async4(sba + 110 * 1024 + st * 1536 + (k * 64 + lane + 32 * j) * 4, src + k * 64 + lane + 32 * j,
                                      true);
                    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(barF + 8 * st) : "memory");
                }
            }
            if ((flags & MIX_WRITER) && (tid >> 5) == 11) {
                for (int it = 0; it < iters; it++) {
                    const int w = it & 1;
                    mbar_wait(barQF + 8 * w, (it >> 1) & 1);
                    if (lane == 0) {
                        mb_bulk_red(gdq + (size_t)blockIdx.x * 8192, sba + 128 * 1024 + w * 32768, 32768);
                        asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
                        asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
                    }
                    __syncwarp();
                    if (lane == 0) mbar_arrive(barQE + 8 * w);
                }
                if (lane == 0) asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
            }
            return;
        }
        asm volatile("setmaxnreg.inc.sync.aligned.u32 240;\n");
    }
    float sd[64], dka[64], dva[64];  // S^T | dP^T, then dQ in the S^T half (as the kernel's register reuse)
    float* s = sd;
    float* dp = sd + 32;
    float* dq = sd;
#pragma unroll
    for (int i = 0; i < 64; i++) sd[i] = 0.f;
#pragma unroll
    for (int i = 0; i < 64; i++) dka[i] = dva[i] = 0.f;
    u32 pa[4][4];
#pragma unroll
    for (int i = 0; i < 16; i++) pa[i / 4][i % 4] = 0x3c003c00u ^ (u32)(tid * 977 + i);
    const u64 dKa = gdesc(sba + wg * 64 * 128, 16, 1024), dVa = gdesc(sba + 32 * 1024 + wg * 64 * 128, 16, 1024);
    const u64 dQb = gdesc(sba + 64 * 1024, 16, 1024), dOb = gdesc(sba + 80 * 1024, 16, 1024);
    const u64 dQt = gdesc(sba + 64 * 1024, 64 * 128, 1024), dOt = gdesc(sba + 80 * 1024, 64 * 128, 1024);
    const u64 dSa = gdesc(sba + 96 * 1024, 128 * 128, 1024), dKt = gdesc(sba, 128 * 128, 1024);
    long long t0 = clock64();
    for (int it = 0; it < iters; it++) {
        // the Q/dO stage of this step (MIX_LOAD: the ring's; else always stage 0)
        const int st = (flags & MIX_LOAD) ? (it & 1) : 0;
        const u64 qo = (u64)(st ? (128 * 1024) >> 4 : 0);
        if constexpr ((flags & MIX_LOAD) != 0) mbar_wait(barF + 8 * st, (it >> 1) & 1);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < 8; kk++) {
            const u64 oa = (u64)((kk >> 2) * 1024 + (kk & 3) * 2), ob = (u64)((kk >> 2) * 512 + (kk & 3) * 2);
            wgmma_ss_n64(s, dKa + oa, dQb + qo + ob, 1);
        }
#pragma unroll
        for (int kk = 0; kk < 8; kk++) {
            const u64 oa = (u64)((kk >> 2) * 1024 + (kk & 3) * 2), ob = (u64)((kk >> 2) * 512 + (kk & 3) * 2);
            wgmma_ss_n64(dp, dVa + oa, dOb + qo + ob, 1);
        }
        wg_commit();
        float lse_r[16], di_r[16];
        if constexpr ((flags & MIX_LSE_EARLY) != 0) {
            const float* lS = (const float*)(sb + 110 * 1024 + st * 1536);
#pragma unroll
            for (int j = 0; j < 32; j += 4) {
                const float2 l2 = *(const float2*)(lS + (j / 4) * 8 + 2 * (tid & 3));
                const float2 d2 = *(const float2*)(lS + 64 + (j / 4) * 8 + 2 * (tid & 3));
                lse_r[j / 2] = l2.x, lse_r[j / 2 + 1] = l2.y, di_r[j / 2] = d2.x, di_r[j / 2 + 1] = d2.y;
            }
        }
        wg_wait<0>();
        fence_regs<32>(s);
        fence_regs<32>(dp);
        if constexpr ((flags & MIX_EW) != 0 && (flags & MIX_LSE_EARLY) != 0) {
#pragma unroll
            for (int j = 0; j < 32; j += 2) {
                const float p0 = ex2(fmaf(s[j], 0.18f, -lse_r[(j / 4) * 2])), p1 = ex2(fmaf(s[j + 1], 0.18f, -lse_r[(j / 4) * 2 + 1]));
                pa[j / 8][(j / 2) & 3] = pack_bf16(p0 * (dp[j] - di_r[(j / 4) * 2]), p1 * (dp[j + 1] - di_r[(j / 4) * 2 + 1]));
            }
        } else if constexpr ((flags & MIX_EW) != 0 && (flags & MIX_LSE) != 0 && (flags & MIX_LSE_NOREAD) == 0) {
            // with the step's lse and D_i from smem
            const float* lS = (const float*)(sb + 110 * 1024 + st * 1536);
#pragma unroll
            for (int j = 0; j < 32; j += 2) {
                const float2 l2 = *(const float2*)(lS + (j / 4) * 8 + 2 * (tid & 3));
                const float2 d2 = *(const float2*)(lS + 64 + (j / 4) * 8 + 2 * (tid & 3));
                const float p0 = ex2(fmaf(s[j], 0.18f, -l2.x)), p1 = ex2(fmaf(s[j + 1], 0.18f, -l2.y));
                pa[j / 8][(j / 2) & 3] = pack_bf16(p0 * (dp[j] - d2.x), p1 * (dp[j + 1] - d2.y));
            }
        } else if constexpr ((flags & MIX_EW) != 0) {
#pragma unroll
            for (int j = 0; j < 32; j += 2) {
                const float p0 = ex2(fmaf(s[j], 0.18f, -1.f)), p1 = ex2(fmaf(s[j + 1], 0.18f, -1.f));
                pa[j / 8][(j / 2) & 3] = pack_bf16(p0 * (dp[j] - 0.5f), p1 * (dp[j + 1] - 0.5f));
            }
        }
        wg_fence();
#pragma unroll
        for (int kc = 0; kc < 4; kc++) wgmma_rs_n128(dva, pa[kc], dOt + qo + (u64)(kc * 128));
#pragma unroll
        for (int kc = 0; kc < 4; kc++) wgmma_rs_n128(dka, pa[kc], dQt + qo + (u64)(kc * 128));
        wg_commit();
        if constexpr ((flags & MIX_DSFREE) != 0) {
            if (it > 0) mbar_wait(barDS, (it - 1) & 1);  // the dQ of the previous step has read dS^T
        }
        if constexpr ((flags & MIX_DS) != 0) {
#pragma unroll
            for (int j = 0; j < 16; j++)
                *(u32*)(sb + 112 * 1024 + wg * 8192 + (tid & 127) * 64 + ((j ^ (tid & 7)) << 2)) = pa[j / 4][j & 3];
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        }
        if constexpr ((flags & MIX_BAR) != 0) asm volatile("bar.sync 1, 256;\n" ::: "memory");
        if constexpr ((flags & MIX_KVW) != 0) {
            if (!dqsplit && (it & 1) != wg) wg_wait<0>();
        }
        const int w = it & 1;  // staged dQ tile of this step
        if (dqsplit || (it & 1) == wg) {
            wg_wait<0>();
            if constexpr ((flags & MIX_LOAD) != 0) {  // dK/dV retired: the stage goes back
                __syncwarp();
                if (lane == 0) mbar_arrive(barE + 8 * st);
            }
#pragma unroll
            for (int hh = 0; hh < (dqsplit ? 1 : 2); hh++) {
                const int col = dqsplit ? wg : hh;
                wg_fence();
#pragma unroll
                for (int kc = 0; kc < 8; kc++)
                    wgmma_ss_tt_n64(dq, dSa + (u64)(kc * 128), dKt + (u64)((col * 128 * 128 + kc * 16 * 128) >> 4), 1);
                wg_commit();
                wg_wait<0>();
                fence_regs<32>(dq);
                if constexpr ((flags & MIX_DSFREE) != 0) {
                    if (hh == (dqsplit ? 0 : 1)) mbar_arrive(barDS);
                }
                if constexpr ((flags & MIX_STAGE) != 0) {
                    if constexpr ((flags & MIX_WRITER) != 0) {
                        if (hh == 0 && it >= 2) mbar_wait(barQE + 8 * w, ((it >> 1) - 1) & 1);  // the writer read it
                    }
#pragma unroll
                    for (int i = 0; i < 2; i++) {
                        const int r = ((tid >> 5) & 3) * 16 + ((tid & 31) >> 2) + 8 * i;
                        if constexpr ((flags & MIX_V4) != 0) {
                            unsigned char* dst = sb + 128 * 1024 + w * 32768 + col * 2 * 8192 + r * 128;
                            const bool odd = (tid & 1) != 0;
#pragma unroll
                            for (int m = 0; m < 4; m++) {  // nt 2m (even lanes keep it) and 2m + 1 (odd lanes)
                                const float a0 = dq[(2 * m) * 4 + 2 * i], a1 = dq[(2 * m) * 4 + 2 * i + 1];
                                const float b0 = dq[(2 * m + 1) * 4 + 2 * i], b1 = dq[(2 * m + 1) * 4 + 2 * i + 1];
                                const float r0 = __shfl_xor_sync(0xffffffffu, odd ? a0 : b0, 1);
                                const float r1 = __shfl_xor_sync(0xffffffffu, odd ? a1 : b1, 1);
                                const float4 v = odd ? make_float4(r0, r1, b0, b1) : make_float4(a0, a1, r0, r1);
                                const int nt = 2 * m + (odd ? 1 : 0);
                                *(float4*)(dst + (nt >> 2) * 8192 + ((((nt & 3) * 2 + ((tid & 2) >> 1)) ^ (r & 7)) << 4)) = v;
                            }
                        } else {
                            unsigned char* dst = sb + 128 * 1024 + w * 32768 + col * 2 * 8192 + r * 128 + (tid & 1) * 8;
#pragma unroll
                            for (int nt = 0; nt < 8; nt++)
                                *(float2*)(dst + (nt >> 2) * 8192 + ((((nt & 3) * 2 + ((tid & 3) >> 1)) ^ (r & 7)) << 4)) =
                                    make_float2(dq[nt * 4 + 2 * i], dq[nt * 4 + 2 * i + 1]);
                        }
                    }
                }
            }
            if constexpr ((flags & MIX_STAGE) != 0) {
                asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
                if constexpr ((flags & MIX_WRITER) != 0) mbar_arrive(barQF + 8 * w);
            }
        } else {
            if constexpr ((flags & MIX_DSFREE) != 0) mbar_arrive(barDS);
            if constexpr ((flags & MIX_LOAD) != 0) {
                wg_wait<0>();  // dK/dV retired before the stage is released
                __syncwarp();
                if (lane == 0) mbar_arrive(barE + 8 * st);
            }
        }
    }
    wg_wait<0>();
    fence_regs<64>(dka);
    fence_regs<64>(dva);
    long long t1 = clock64();
    if ((tid & 127) == 0 && blockIdx.x == 0) clk[wg] = t1 - t0;
    float x = 0.f;
#pragma unroll
    for (int i = 0; i < 64; i++) x += sd[i];
#pragma unroll
    for (int i = 0; i < 64; i++) x += dka[i] + dva[i];
    if (x == 12345.f) sink[tid] = x;
}
extern "C" __global__ void __launch_bounds__(256, 1) mb_mix(int iters, long long* clk, float* sink) { mix_body<false>(iters, clk, sink); }
extern "C" __global__ void __launch_bounds__(256, 1) mb_mix_split(int iters, long long* clk, float* sink) { mix_body<true>(iters, clk, sink); }
#define MIXK(name, f) extern "C" __global__ void __launch_bounds__(256, 1) name(int iters, long long* clk, float* sink) { \
    mix_body<false, f>(iters, clk, sink); }
MIXK(mb_mix_ew, MIX_EW) MIXK(mb_mix_bar, MIX_BAR) MIXK(mb_mix_kvw, MIX_KVW) MIXK(mb_mix_bar_kvw, MIX_BAR | MIX_KVW)
MIXK(mb_mix_all, MIX_EW | MIX_BAR | MIX_KVW | MIX_DS)
constexpr int MIX_ALL = MIX_EW | MIX_BAR | MIX_KVW | MIX_DS;
MIXK(mb_all_dsfree, MIX_ALL | MIX_DSFREE) MIXK(mb_all_stage, MIX_ALL | MIX_STAGE)
MIXK(mb_all_dsfree_stage, MIX_ALL | MIX_DSFREE | MIX_STAGE)
#define MIXP(name, f) extern "C" __global__ void __launch_bounds__(384, 1) name(int iters, long long* clk, float* sink, \
    const unsigned char* gsrc, float* gdq) { mix_body<false, f>(iters, clk, sink, gsrc, gdq); }
MIXP(mb_all_load, MIX_ALL | MIX_LOAD) MIXP(mb_all_stage_writer, MIX_ALL | MIX_STAGE | MIX_WRITER)
MIXP(mb_all_load_dsfree, MIX_ALL | MIX_LOAD | MIX_DSFREE)
MIXP(mb_kernel_like, MIX_ALL | MIX_DSFREE | MIX_STAGE | MIX_LOAD | MIX_WRITER)
MIXK(mb_all_stage_v4, MIX_ALL | MIX_STAGE | MIX_V4)
MIXP(mb_kernel_like_lse, MIX_ALL | MIX_DSFREE | MIX_STAGE | MIX_LOAD | MIX_WRITER | MIX_LSE)
MIXP(mb_all_load_lse, MIX_ALL | MIX_LOAD | MIX_LSE)
MIXP(mb_all_load_lse_noread, MIX_ALL | MIX_LOAD | MIX_LSE | MIX_LSE_NOREAD)
MIXP(mb_all_load_lse_early, MIX_ALL | MIX_LOAD | MIX_LSE | MIX_LSE_EARLY)
MIXP(mb_kernel_like_lse_early, MIX_ALL | MIX_DSFREE | MIX_STAGE | MIX_LOAD | MIX_WRITER | MIX_LSE | MIX_LSE_EARLY)
MIXP(mb_kernel_like_v4, MIX_ALL | MIX_DSFREE | MIX_STAGE | MIX_LOAD | MIX_WRITER | MIX_V4)
#endif
"""

OPS = {0: ("SS m64n64k16 (S^T, dP^T)", 64), 1: ("SS m64n128k16", 128), 2: ("RS m64n128k16 (dV, dK)", 128),
       3: ("SS m64n64k16 tt (dQ)", 64), 4: ("RS m64n64k16", 64)}


def main():
    import numpy as np
    import torch
    import cupy as cp

    src = lab.read_source() + BENCH
    ptx, _ = lab.nvrtc_compile(src, lab.NVRTC_OPTS)
    path = os.path.join(tempfile.mkdtemp(prefix="wgmmarate"), "mb.ptx")
    open(path, "wb").write(ptx)
    mod = cp.RawModule(path=path)
    smem = 226 * 1024  # (run 32: the staging tiles, the second Q/dO stage and the mbarriers up to 224 KB + 72 B)
    dev = torch.device("cuda")
    nsm = torch.cuda.get_device_properties(0).multi_processor_count
    clk = torch.zeros(4, dtype=torch.int64, device=dev)
    sink = torch.zeros(384, dtype=torch.float32, device=dev)
    iters = 4000
    print(f"{nsm} SMs, {iters} groups of 8 wgmmas per warpgroup; ideal: 32 clocks per m64n64k16, 64 per m64n128k16",
          flush=True)
    for op, (name, n) in ({} if os.environ.get("MB_MIX_ONLY") else OPS).items():
        fn = mod.get_function(f"mb_op{op}")
        fn.max_dynamic_shared_size_bytes = smem
        for nwg, noise in ((1, 0), (2, 0), (2, 1), (2, 2)):
            args = (np.int32(nwg), np.int32(noise), np.int32(iters), np.uint64(clk.data_ptr()),
                    np.uint64(sink.data_ptr()))
            ms = timed(torch, fn, nsm, 384, args, smem, clk)
            c = clk.cpu().tolist()
            flops = 2.0 * 64 * n * 16 * 8 * iters * nwg * nsm
            per = [c[w] / (8 * iters) for w in range(nwg)]
            extra = f", writer {c[2] / 1e3:.0f}k clk" if noise else ""
            print(f"{name:28s} {nwg} wg noise {noise}: {' / '.join(f'{p:6.1f}' for p in per)} clk/wgmma per wg, "
                  f"{flops / ms / 1e9:6.1f} TF/s{extra}", flush=True)
    mix(mod, torch, np, nsm, smem)


def timed(torch, fn, nsm, threads, args, smem, clk):
    """One warm-up launch, then one timed launch (CUDA events, ms) with the clock buffer zeroed."""
    fn((nsm,), (threads,), args, shared_mem=smem)
    torch.cuda.synchronize()
    clk.zero_()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    fn((nsm,), (threads,), args, shared_mem=smem)
    e1.record()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1)


def mix(mod, torch, np, nsm, smem):
    """The step mix (mb_mix, mb_mix_split): cycles per step against the 2560-cycle tensor floor."""
    dev = torch.device("cuda")
    clk = torch.zeros(4, dtype=torch.int64, device=dev)
    sink = torch.zeros(384, dtype=torch.float32, device=dev)
    iters = 2000
    gsrc = (torch.rand(32 << 20, device=dev) * 255).to(torch.uint8)  # 32 MB of source for the Q/dO loads
    gdq = torch.zeros(nsm * 8192, dtype=torch.float32, device=dev)   # 32 KB of f32 per CTA for the writer
    names = ["mb_mix", "mb_mix_split", "mb_mix_ew", "mb_mix_bar", "mb_mix_kvw", "mb_mix_bar_kvw", "mb_mix_all",
             "mb_all_dsfree", "mb_all_stage", "mb_all_dsfree_stage", "mb_all_load", "mb_all_load_dsfree",
             "mb_all_stage_writer", "mb_kernel_like", "mb_all_stage_v4", "mb_kernel_like_v4",
             "mb_all_load_lse", "mb_kernel_like_lse", "mb_all_load_lse_noread",
             "mb_all_load_lse_early", "mb_kernel_like_lse_early"]
    if os.environ.get("MB_MIX_ONLY"):
        names = [n for n in names if n in os.environ["MB_MIX_ONLY"].split(",")]
    for name in names:
        fn = mod.get_function(name)
        fn.max_dynamic_shared_size_bytes = smem
        prod = name in ("mb_all_load", "mb_all_load_dsfree", "mb_all_stage_writer", "mb_kernel_like", "mb_kernel_like_v4",
                        "mb_all_load_lse", "mb_kernel_like_lse", "mb_all_load_lse_noread",
                        "mb_all_load_lse_early", "mb_kernel_like_lse_early")
        args = (np.int32(iters), np.uint64(clk.data_ptr()), np.uint64(sink.data_ptr()))
        if prod:
            args = args + (np.uint64(gsrc.data_ptr()), np.uint64(gdq.data_ptr()))
        ms = timed(torch, fn, nsm, 384 if prod else 256, args, smem, clk)
        c = clk.cpu().tolist()
        flops = 2.0 * 64 * 128 * 128 * 5 * iters * nsm  # 5 GEMMs of a 64-query x 128-key step
        print(f"{name:14s}: {c[0] / iters:6.0f} / {c[1] / iters:6.0f} cycles per step (floor 2560), "
              f"{flops / ms / 1e9:6.1f} TF/s", flush=True)


if __name__ == "__main__":
    main()
