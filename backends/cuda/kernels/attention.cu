// Block-sparse flash attention (forward and backward) for the CUDA backend.
//
// Compiled once per device at start-up by NVRTC with only its built-in headers:
//   nvrtc options: --gpu-architecture=compute_90a (H100/H200; compute_XY elsewhere)  (PTX, JIT-compiled
//   by the driver)
// On compute_90a (`__CUDA_ARCH_FEAT_SM90_ALL`): warpgroup MMA (`wgmma.mma_async`) for the forward (S = Q K^T
// with both operands in 128-byte-swizzled shared memory, O += P V with P in registers; warp-specialised: a
// producer warpgroup that issues the Q/K/V tiles as TMA loads on mbarriers + two consumer warpgroups ping-ponging
// softmax and GEMMs: attn_fwd_ws_impl) and for the backward of head_dim 64/128 (FA3-style: S^T, dP^T, dV, dK,
// dQ per key tile, Q/dO tiles by TMA, dQ added into dq_accum by TMA tensor reductions: attn_bwd_ws_impl).
// Otherwise (other devices, compute_90 without the `a`) and for the head_dim-256 backward:
// `mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32`, operands from shared memory through `ldmatrix`,
// global->shared copies through `cp.async`.
// bf16 inputs/outputs, fp32 accumulation and softmax statistics, f32 lse.
//
// Layouts (crates/core/src/ops/attention.rs): q (Tq,Hq,D), k/v (Tk,Hkv,D), out (Tq,Hq,D) row-major,
// lse (Tq,Hq) natural log of sum_k exp(scale * q.k); GQA: query head h uses kv head h / (Hq/Hkv).
// A row with no visible key: out = 0, lse = -inf, and it contributes nothing to dq/dk/dv.
//
// Mask: four i32 arrays, one entry per query row: first_start, first_end, second_start, second_end.
// Row r sees keys [fs[r], fe[r]) U [ss[r], se[r]) (an interval with start >= end is empty).
// Tile classification (the "compact description"): for a tile of query rows the kernel derives
//   hull_i = [min start_i, max end_i)         over rows with a non-empty interval i
//   full_i = [max start_i, min end_i)         intersection over *all* rows of the tile (empty if
//                                              any row is empty / past Tq)
// Key tiles touched by hull_1 U hull_2 are visited (in increasing order, at most two ranges); a key
// tile lying inside full_1 or full_2 is Full (no per-element check), the others are Partial: each
// warp then skips 16-key (fwd) / 16-query (bwd) chunks that none of its rows can see and checks
// the remaining elements against the row intervals. Nothing outside the hulls is ever touched, so
// work is proportional to the visible tiles; there is no dense score matrix and no fallback.
//   forward : each CTA reduces its own BM rows' intervals in shared memory (no extra pass).
//   backward: attn_bwd_pre_d* writes one 8-int summary per 64-row query tile (and D_i, and zeroes
//             dq_accum); attn_bwd_dkdv_d* (one CTA per key tile and kv head) scans the summaries to
//             list the query tiles that can see its key tile, then walks (query tile x group head).
//
// Entry points (D = 64, 128, 256):
//   attn_config(int* out)                    per-D launch configuration, see ATTN_CONFIG_* below
//   attn_fwd_d{D}(q,k,v,fs,fe,ss,se,out,lse,work,Tq,Tk,Hq,Hkv,scale,hgroup,tm_q,tm_k,tm_v)
//       items ceil(Tq/BM)*Hq (query tile, head), in groups of hgroup kv heads (fwd_tile_of in
//       attention/common.cuh; >= Hkv: one group); grid = the items, or at most one CTA per SM where attn_config's
//       fwd_persist is 1 (the CTAs then take further items from the counter *work, an int zeroed before the
//       launch; unused otherwise); block FWD_THREADS, dynamic smem FWD_SMEM. tm_q / tm_k / tm_v: TMA tensor maps
//       of q (Tq, Hq, D) / k, v (Tk, Hkv, D) as bf16, boxes of 64 columns x 1 head x fwd_BM (q) or
//       fwd_tma_bn (k, v) rows, 128-byte swizzle, zero fill; read only where fwd_tma_bn > 0
//   attn_bwd_pre_d{D}(o,dout,fs,fe,ss,se,Di,dq_accum,summary,Tq,Hq)
//       grid ceil(Tq/64)*Hq (block = query tile * Hq + head), block 256, no dynamic smem. Di (Tq,Hq) f32; dq_accum (Tq,Hq,D) f32 zeroed;
//       summary (ceil(Tq/64), 8) i32
//   attn_bwd_dkdv_d{D}(q,k,v,dout,lse,Di,summary,fs,fe,ss,se,dq_accum,dk,dv,Tq,Tk,Hq,Hkv,scale,hgroup,tm_q,tm_do,tm_dq)
//       grid ceil(Tk/BN)*Hkv, block BWD_THREADS (384 for the wgmma kernel of D 64/128, else 256),
//       the CTAs in groups of hgroup kv heads (bwd_tile_of in attention/common.cuh; >= Hkv: one group),
//       dynamic smem BWD_SMEM; dk/dv bf16 written, dq_accum += dS K. tm_q / tm_do / tm_dq: TMA tensor
//       maps (TmaDesc, by value) of q / dout as bf16 (Tq, Hq, D) in boxes of 64 columns x 1 head x 64
//       rows, and of dq_accum as f32 (Tq, Hq, D) in boxes of 32 columns x 1 head x 64 rows; all
//       128-byte swizzle, zero fill; read only where attn_config's bwd_tma field is 1
//   attn_bwd_dq_convert(dq_accum, dq, n, scale)   dq = bf16(scale * dq_accum), n = Tq*Hq*D (mult of 4)
//       grid ceil(n/1024), block 256
// Kernels needing more than 48 KB of dynamic shared memory need
// cuFuncSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) once after loading.
//
// Measurements, method and the tuning history: docs/kernel-lab-attention.md; lab script and CPU
// emulator: lab/cuda/. This file and its parts are what ships; the lab's variants (other tile
// configurations, timing knobs, clock traces) live in lab/cuda/variants.patch, which the lab applies
// to a copy of these files. The empty ATTN_TR / ATTN_FTR / ATTN_BTR / ATTN_CTR / ATTN_TR_ITEM
// macros are the points where that patch records clock stamps.

// The kernels, in dependency order. NVRTC has no file system, so the backend (kernels.rs,
// flash_source) and the lab (attention_lab.py, read_source) splice these parts in at the
// #include lines; nvcc and the CPU emulator include them as files.
#include "attention/common.cuh"
#include "attention/fwd_mma.cuh"
#include "attention/wgmma_gen.cuh"
#include "attention/fwd_wgmma.cuh"
#include "attention/bwd_mma.cuh"
#include "attention/bwd_wgmma.cuh"

// Entry points (extern "C"): dq conversion, instantiations, launch configuration.
extern "C" __global__ void __launch_bounds__(256) attn_bwd_dq_convert(const float* __restrict__ acc, bf16_t* __restrict__ dq,
                                                                     long long n, float scale) {
    long long i = ((long long)blockIdx.x * 256 + threadIdx.x) * 4;
    if (i < n) {
        float4 a = *(const float4*)(acc + i);
        uint2 r = make_uint2(pack_bf16(a.x * scale, a.y * scale), pack_bf16(a.z * scale, a.w * scale));
        *(uint2*)(dq + i) = r;
    }
}

// ------------------------------------------------------------------------------------------------
// Instantiations. Tile choices (H200, mma.sync):
//   fwd d64 : BM 128, BN 64, 4 warps (32 rows/warp), Q fragments kept in registers
//   fwd d128: BM 128, BN 64, 4 warps (32 rows/warp), Q re-read from smem each key tile. BN 64 spills
//             ~150 B (outside the MMA loops) yet beat BN 32 / 48 and 8-warp / 64-row variants on every
//             benchmark shape: more independent accumulators per k-step hide the HMMA latency better
//   fwd d256: BM 128, BN 64, 8 warps (16 rows/warp)
//   bwd d64/d128: BN 128 keys (8 warps x 16), 64 query rows per step; d256: BN 64, D split in two
// ------------------------------------------------------------------------------------------------
#define ATTN_FWD_MINB_64 2
#define ATTN_FWD_MINB_128 2
#define ATTN_FWD_MINB_256 1
#define ATTN_FWD_CFG_64 64, 128, 64, 4, true
#define ATTN_FWD_CFG_128 128, 128, 64, 4, false
#define ATTN_FWD_CFG_256 256, 128, 64, 8, false
#define ATTN_BWD_CFG_64 64, 8, 1
#define ATTN_BWD_CFG_128 128, 8, 1
#define ATTN_BWD_CFG_256 256, 8, 2

// Forward: the wgmma kernel where compiled for compute_90a, else the mma.sync kernel.
#ifdef ATTN_WGMMA
#define ATTN_WG_CFG_64 64, 128
#define ATTN_WG_CFG_128 128, 128
#define ATTN_WG_CFG_256 256, 64
#define ATTN_FWD_C(DD) WsCfg<ATTN_WG_CFG_##DD>
#define ATTN_FWD_MINB(DD) 1
#define ATTN_FWD_CALL(DD) attn_fwd_ws_impl<ATTN_WG_CFG_##DD>
#define ATTN_FWD_ARGS fs, fe, ss, se, out, lse, work, Tq, Tk, Hq, Hkv, scale, hgroup, &tm_q, &tm_k, &tm_v  // q, k, v: TMA
#define ATTN_FWD_TMA_BN(DD) WsCfg<ATTN_WG_CFG_##DD>::BN_
#define ATTN_FWD_PERSIST(DD) (WsCfg<ATTN_WG_CFG_##DD>::PERSIST ? 1 : 0)
#else
#define ATTN_FWD_C(DD) FwdCfg<ATTN_FWD_CFG_##DD>
#define ATTN_FWD_MINB(DD) ATTN_FWD_MINB_##DD
#define ATTN_FWD_CALL(DD) attn_fwd_impl<ATTN_FWD_CFG_##DD>
#define ATTN_FWD_ARGS q, k, v, fs, fe, ss, se, out, lse, Tq, Tk, Hq, Hkv, scale, hgroup
#define ATTN_FWD_TMA_BN(DD) 0
#define ATTN_FWD_PERSIST(DD) 0
#endif

// Backward: the wgmma kernel (attn_bwd_ws_impl) where compiled for compute_90a, for D 64 and 128;
// the mma.sync kernel otherwise (and for D 256).
#if defined(ATTN_WGMMA)
#define ATTN_BWD_WG_ON 1
#else
#define ATTN_BWD_WG_ON 0
#endif
template <int D, int NW, int DSPLIT>
struct BwdSel {
    static constexpr bool WG = ATTN_BWD_WG_ON && D <= 128;
    static constexpr int BN = WG ? WsBwdCfg<D <= 128 ? D : 128>::BN : BwdCfg<D, NW, DSPLIT>::BN;
    static constexpr int THREADS = WG ? WsBwdCfg<D <= 128 ? D : 128>::THREADS : BwdCfg<D, NW, DSPLIT>::THREADS;
    static constexpr int SMEM = WG ? WsBwdCfg<D <= 128 ? D : 128>::SMEM : BwdCfg<D, NW, DSPLIT>::SMEM;
};

#define ATTN_DEFINE(DD)                                                                                               \
    extern "C" __global__ void __launch_bounds__(ATTN_FWD_C(DD)::THREADS, ATTN_FWD_MINB(DD)) attn_fwd_d##DD(         \
        const bf16_t* q, const bf16_t* k, const bf16_t* v, const int* fs, const int* fe, const int* ss,               \
        const int* se, bf16_t* out, float* lse, int* work, int Tq, int Tk, int Hq, int Hkv, float scale, int hgroup,  \
        const __grid_constant__ TmaDesc tm_q, const __grid_constant__ TmaDesc tm_k,                                    \
        const __grid_constant__ TmaDesc tm_v) {                                                                        \
        ATTN_FWD_CALL(DD)(ATTN_FWD_ARGS);                                                                             \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(PRE_THREADS) attn_bwd_pre_d##DD(                                     \
        const bf16_t* o, const bf16_t* dout, const int* fs, const int* fe, const int* ss, const int* se, float* Di,   \
        float* dq_accum, int* summary, int Tq, int Hq) {                                                               \
        attn_bwd_pre_impl<DD>(o, dout, fs, fe, ss, se, Di, dq_accum, summary, Tq, Hq);                                 \
    }                                                                                                                  \
    extern "C" __global__ void __launch_bounds__(BwdSel<ATTN_BWD_CFG_##DD>::THREADS, 1) attn_bwd_dkdv_d##DD(         \
        const bf16_t* q, const bf16_t* k, const bf16_t* v, const bf16_t* dout, const float* lse, const float* Di,      \
        const int* summary, const int* fs, const int* fe, const int* ss, const int* se, float* dq_accum, bf16_t* dk,  \
        bf16_t* dv, int Tq, int Tk, int Hq, int Hkv, float scale, int hgroup, const __grid_constant__ TmaDesc tm_q,    \
        const __grid_constant__ TmaDesc tm_do, const __grid_constant__ TmaDesc tm_dq) {                                \
        if constexpr (BwdSel<ATTN_BWD_CFG_##DD>::WG)                                                                   \
            attn_bwd_ws_impl<DD>(k, v, lse, Di, summary, fs, fe, ss, se, dk, dv, Tq, Tk, Hq, Hkv,                       \
                                 scale, hgroup, &tm_q, &tm_do, &tm_dq);                                        \
        else                                                                                                           \
            attn_bwd_dkdv_impl<ATTN_BWD_CFG_##DD>(q, k, v, dout, lse, Di, summary, fs, fe, ss, se, dq_accum, dk, dv,  \
                                                  Tq, Tk, Hq, Hkv, scale, hgroup);                                     \
    }

ATTN_DEFINE(64)
ATTN_DEFINE(128)
ATTN_DEFINE(256)

// Launch configuration, one row of ATTN_CONFIG_FIELDS ints per head_dim (64, 128, 256):
//   [D, fwd_BM, fwd_threads, fwd_smem, bwd_BN, bwd_threads, bwd_smem, bwd_BM(summary tile), pre_threads,
//    bwd_tma (1: attn_bwd_dkdv reads Q/dO through its tensor-map parameters, 0: it ignores them),
//    fwd_tma_bn (> 0: attn_fwd reads Q / K / V through its tensor maps, boxes of fwd_BM / this many rows; 0: it
//    ignores them), fwd_persist (1: attn_fwd runs any number of (query tile, head) items per CTA, so the host launches
//    at most one CTA per SM; 0: exactly one CTA per item)]
#define ATTN_CONFIG_FIELDS 12
#define ATTN_CONFIG_ROW(DD, p)                                                                 \
    p[0] = DD;                                                                                 \
    p[1] = ATTN_FWD_C(DD)::BM_;                                                                               \
    p[2] = ATTN_FWD_C(DD)::THREADS;                                                 \
    p[3] = ATTN_FWD_C(DD)::SMEM;                                                    \
    p[4] = BwdSel<ATTN_BWD_CFG_##DD>::BN;                                                      \
    p[5] = BwdSel<ATTN_BWD_CFG_##DD>::THREADS;                                                 \
    p[6] = BwdSel<ATTN_BWD_CFG_##DD>::SMEM;                                                    \
    p[7] = BWD_BM;                                                                             \
    p[8] = PRE_THREADS;                                                                        \
    p[9] = BwdSel<ATTN_BWD_CFG_##DD>::WG ? 1 : 0;                                              \
    p[10] = ATTN_FWD_TMA_BN(DD);                                                               \
    p[11] = ATTN_FWD_PERSIST(DD);

extern "C" __global__ void attn_config(int* out) {
    if (threadIdx.x == 0 && blockIdx.x == 0) {
        ATTN_CONFIG_ROW(64, (out + 0))
        ATTN_CONFIG_ROW(128, (out + ATTN_CONFIG_FIELDS))
        ATTN_CONFIG_ROW(256, (out + 2 * ATTN_CONFIG_FIELDS))
    }
}
