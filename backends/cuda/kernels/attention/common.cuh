// attention/common.cuh: types, constants, PTX helpers (cp.async, ldmatrix, mma.sync) and the per-tile mask summary.
// Part of attention.cu (included there, in order; see its header comment).

typedef unsigned short bf16_t;
typedef unsigned int u32;
template <bool B>
struct BoolC {
    static constexpr bool value = B;
};

#define ATTN_NEG_INF (__int_as_float(0xff800000))
#define ATTN_LOG2E 1.4426950408889634f
#define ATTN_LN2 0.6931471805599453f
#define ATTN_BIG 0x3fffffff
// Grid order of both attention kernels: the CTAs' heads in groups of `group` heads (the host's choice: head_group in
// flash/mod.rs), the groups one after another, each walking its tiles in order with its heads interleaved; a group of
// all the heads is the global order. Returns the CTA's tile (in [0, ntiles)) and head. Small groups keep the data of a
// few heads hot in L2 (the backward's dq_accum rows and Q/dO), at the price of the later groups' heavy tiles
// starting later: worth it only with several waves of CTAs per group (groups of 1 everywhere lose to tail balance).
// An output element of a row whose softmax sum is `ls`, from its accumulator `o` and
// inv = 1 / ls: a row that sees no key (ls == 0) is exactly 0, even when its accumulator met a
// NaN value through a zero weight in the tile's P V product (NaN policy); a NaN ls stays NaN.
static __device__ __forceinline__ float attn_normalised(float o, float inv, float ls) {
    return ls != 0.f ? o * inv : 0.f;
}

static __device__ __forceinline__ void grouped_tile(int bid, int ntiles, int nheads, int group, int& tile, int& head) {
    const int hg = (group <= 0 || group > nheads) ? nheads : group;
    const int grp = bid / (ntiles * hg);
    const int gsz = min(hg, nheads - grp * hg);  // heads in this group (the last one may be short)
    const int r = bid - grp * (ntiles * hg);
    tile = r / gsz;
    head = grp * hg + (r - tile * gsz);
}
// The forward: one CTA per (query tile, query head), heavy (late) query tiles first; `hgroup` counts kv heads, so a
// group holds hgroup * (Hq / Hkv) query heads (neutral for the forward: kept so both kernels follow one rule).
static __device__ __forceinline__ void fwd_tile_of(int bid, int nqt, int Hq, int Hkv, int hgroup, int& qt, int& h) {
    int t;
    grouped_tile(bid, nqt, Hq, hgroup <= 0 ? 0 : hgroup * (Hq / Hkv), t, h);
    qt = nqt - 1 - t;
}
// The backward: one CTA per (key tile, kv head), early key tiles (seen by most queries) first.
static __device__ __forceinline__ void bwd_tile_of(int bid, int Tk, int BN, int Hkv, int hgroup, int& kt, int& hk) {
    grouped_tile(bid, (Tk + BN - 1) / BN, Hkv, hgroup, kt, hk);
}

// A CUtensorMap (128 bytes, 128-byte aligned as CUDA 13 declares it), encoded on the host by cuTensorMapEncodeTiled and passed
// by value as a `const __grid_constant__` kernel parameter (the TMA unit reads it from parameter space).
struct __align__(128) TmaDesc {
    unsigned long long w[16];
};

// ------------------------------------------------------------------------------------------------
// PTX helpers (lab/cuda/emu/emu_rt.h provides CPU versions of exactly these for the lab's CPU
// emulator, whose copy of this file leaves them out: lab/cuda/variants.patch)
// ------------------------------------------------------------------------------------------------
#define ATTN_DYN_SMEM extern __shared__ __align__(16) unsigned char smem[]
static __device__ __forceinline__ u32 smem_u32(const void* p) {
    return (u32)__cvta_generic_to_shared(p);
}
static __device__ __forceinline__ void cp_async16(u32 dst, const void* src, bool pred) {
    int n = pred ? 16 : 0;  // src-size 0: nothing read, 16 zero bytes written
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
static __device__ __forceinline__ void cp_async4(u32 dst, const void* src, bool pred) {
    int n = pred ? 4 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
static __device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
static __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

static __device__ __forceinline__ void ldsm_x4(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
static __device__ __forceinline__ void ldsm_x4_t(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
// c += a * b, m16n8k16, a row-major (4 regs), b col-major (2 regs), f32 accumulators.
static __device__ __forceinline__ void mma16816(float* c, const u32* a, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// Two floats -> bf16x2 (lo in the low half, i.e. the lower column index).
static __device__ __forceinline__ u32 pack_bf16(float lo, float hi) {
    u32 r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
static __device__ __forceinline__ float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}
static __device__ __forceinline__ void red_add_v2(float* p, float a, float b) {
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(p), "f"(a), "f"(b) : "memory");
}
static __device__ __forceinline__ float bf_lo(u32 v) { return __uint_as_float(v << 16); }
static __device__ __forceinline__ float bf_hi(u32 v) { return __uint_as_float(v & 0xffff0000u); }
static __device__ __forceinline__ bool in_iv(int k, int s, int e) { return k >= s && k < e; }
static __device__ __forceinline__ bool overlaps(int s, int e, int a, int b) { return max(s, a) < min(e, b); }

// Per-row contribution to the tile summary, all as "min" reductions:
// [lo1, -hi1, -flo1, fhi1, lo2, -hi2, -flo2, fhi2]
static __device__ __forceinline__ void row_summary(bool valid, int s1, int e1, int s2, int e2, int* v) {
    bool n1 = valid && s1 < e1, n2 = valid && s2 < e2;
    v[0] = n1 ? s1 : ATTN_BIG;
    v[1] = n1 ? -e1 : ATTN_BIG;
    v[2] = n1 ? -s1 : ATTN_BIG;   // -(max start)  (an empty row forces an empty intersection)
    v[3] = n1 ? e1 : -ATTN_BIG;   // min end
    v[4] = n2 ? s2 : ATTN_BIG;
    v[5] = n2 ? -e2 : ATTN_BIG;
    v[6] = n2 ? -s2 : ATTN_BIG;
    v[7] = n2 ? e2 : -ATTN_BIG;
}
// Block-wide min of 8 ints per thread; result (un-negated: lo1,hi1,flo1,fhi1,lo2,hi2,flo2,fhi2)
// lands in out[0..8) in shared memory. red must hold 8*NW ints. Contains __syncthreads.
template <int NW>
static __device__ __forceinline__ void block_summary(int* v, int* red, int* out) {
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
#pragma unroll
    for (int i = 0; i < 8; i++) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v[i] = min(v[i], __shfl_xor_sync(0xffffffffu, v[i], o));
    }
    if (lane == 0) {
#pragma unroll
        for (int i = 0; i < 8; i++) red[w * 8 + i] = v[i];
    }
    __syncthreads();
    if (threadIdx.x < 8) {
        int m = red[threadIdx.x];
        for (int j = 1; j < NW; j++) m = min(m, red[j * 8 + threadIdx.x]);
        int i = threadIdx.x;
        out[i] = (i == 1 || i == 2 || i == 5 || i == 6) ? -m : m;
    }
    __syncthreads();
}

// The summary of the query tile [q0, q0 + BM) (rows past Tq count as empty rows), computed by
// all NT threads of the block (NW warps): each row's intervals go to sRow[0..BM), the tile's
// summary to out[0..8) (block_summary). Contains __syncthreads.
template <int NW, int BM, int NT>
static __device__ __forceinline__ void tile_summary(int tid, int q0, int Tq, const int* __restrict__ fs,
                                                    const int* __restrict__ fe, const int* __restrict__ ss,
                                                    const int* __restrict__ se, int4* sRow, int* red, int* out) {
    int vals[8];
#pragma unroll
    for (int i = 0; i < 8; i++) vals[i] = ATTN_BIG;  // identity of min (threads without rows: no constraint)
    for (int r = tid; r < BM; r += NT) {
        int row = q0 + r;
        bool valid = row < Tq;
        int4 iv = valid ? make_int4(fs[row], fe[row], ss[row], se[row]) : make_int4(0, 0, 0, 0);
        sRow[r] = iv;
        int t[8];
        row_summary(valid, iv.x, iv.y, iv.z, iv.w, t);
#pragma unroll
        for (int i = 0; i < 8; i++) vals[i] = min(vals[i], t[i]);
    }
    block_summary<NW>(vals, red, out);
}

// The key tiles (BN keys each) a query tile with summary s visits, as at most two index ranges
// [a1, b1), [a2, b2) in increasing order: the two hulls' tiles, merged when they overlap; an
// empty first hull hands its place to the second.
template <int BN>
static __device__ __forceinline__ void visited_key_tiles(const int* s, int& a1, int& b1, int& a2, int& b2) {
    const int lo1 = s[0], hi1 = s[1], lo2 = s[4], hi2 = s[5];
    a1 = b1 = a2 = b2 = 0;
    if (lo1 < hi1) { a1 = lo1 / BN; b1 = (hi1 + BN - 1) / BN; }
    if (lo2 < hi2) { a2 = lo2 / BN; b2 = (hi2 + BN - 1) / BN; }
    if (a1 >= b1) { a1 = a2; b1 = b2; a2 = b2 = 0; }
    else if (a2 < b2) {
        if (a2 < b1 && a1 < b2) { a1 = min(a1, a2); b1 = max(b1, b2); a2 = b2 = 0; }
        else if (a2 < a1) { int t = a1; a1 = a2; a2 = t; t = b1; b1 = b2; b2 = t; }
    }
}
