// attention/fwd_wgmma.cuh: wgmma / mbarrier / TMA primitives and the warp-specialised Hopper forward.
// Part of attention.cu (included there, in order; see its header comment).

// ------------------------------------------------------------------------------------------------
// Forward, Hopper path (compute_90a: NVRTC defines __CUDA_ARCH_FEAT_SM90_ALL): warpgroup MMA.
// Two consumer warpgroups per CTA (64 query rows each, BM = 128), BN keys per step. Q, K, V tiles
// live in shared memory in the canonical 128-byte-swizzled layout of wgmma (rows of 64 bf16 =
// 128 B, D/64 "panels" per tile, 8-row atoms of 1024 B, 16-byte chunk index XOR (row & 7)),
// filled by TMA (double-buffered K/V; the same swizzle as TMA's 128-byte mode). S = Q K^T: wgmma m64nBNk16, A and B
// from shared memory (both K-major). O += P V: wgmma m64nDk16 with P in registers (the f32 S
// accumulator layout is the bf16 A-fragment layout, as in mma.sync) and V from shared memory
// (MN-major: transposed B). Mask handling as in the mma.sync path (hulls, Full/Partial tiles);
// a warpgroup skips a Partial tile none of its 64 rows can see.
// ------------------------------------------------------------------------------------------------
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define ATTN_WGMMA 1
typedef unsigned long long u64;
// The wgmma.mma_async wrappers (wgmma_ss_*, wgmma_rs_*) are generated: attention/wgmma_gen.cuh, included just before.
static __device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
static __device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
static __device__ __forceinline__ void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
static __device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
template <int N>
static __device__ __forceinline__ void fence_regs(float* d) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(d[i])::"memory");
}
// Shared-memory matrix descriptor, 128-byte swizzle. lbo/sbo in bytes.
static __device__ __forceinline__ u64 gdesc(u32 addr, u32 lbo, u32 sbo) {
    return (u64)((addr & 0x3FFFF) >> 4) | ((u64)(lbo >> 4) << 16) | ((u64)(sbo >> 4) << 32) | (1ull << 62);
}
template <int N>
static __device__ __forceinline__ void wgmma_ss(float* d, u64 da, u64 db, int sc) {
    if constexpr (N == 64) wgmma_ss_n64(d, da, db, sc);
    else wgmma_ss_n128(d, da, db, sc);
}
template <int N>
static __device__ __forceinline__ void wgmma_rs(float* d, const u32* a, u64 db) {
    if constexpr (N == 64) wgmma_rs_n64(d, a, db);
    else if constexpr (N == 128) wgmma_rs_n128(d, a, db);
    else wgmma_rs_n256(d, a, db);
}

// ------------------------------------------------------------------------------------------------
// Forward (warp-specialised, FA3's structure; persistent: a CTA per SM takes (query tile, head) items from a
// global counter in heavy-first order, the next item's summary, K/V and Q loaded while the current one
// finishes): 384 threads = 3 warpgroups. Warpgroup 0 is the producer: warps 1-3 compute
// each item's summary (row intervals, hulls) up to two items ahead, and one thread of warp 0 issues Q, K_t and
// V_t as TMA boxes (tensor maps tm_q / tm_k / tm_v from the host) into 2-stage K and V rings (V one tile behind
// K; the rings run on over the items), each stage completing on its "full" mbarrier
// (arrive.expect_tx, count 1); before refilling a stage it waits on that stage's "empty" mbarrier (one
// arrive per consumer warp, count 8). One issuing thread frees the other producer warps for the summaries
// (a 128-thread cp.async producer ran at the same speed). Warpgroups 1 and 2 are the
// consumers (64 query rows each): per key tile, FA3's intra-warpgroup overlap (S_t and PV_{t-1} as
// two wgmma groups, softmax of tile t between wait_group 1 and 0), with O rescaled between the two
// issues (the S_t GEMM hides it) so only the P pack follows wait_group 0, and FA3's inter-warpgroup
// ping-pong: a consumer issues its two groups only in its turn (bar.sync on its own named barrier,
// bar.arrive on the other's right after the issue), so one warpgroup's softmax runs under the other's
// GEMMs; no CTA-wide barrier inside the loop. setmaxnreg: producer REG_P, consumers REG_C.
// Two ptxas pitfalls, both checked in the SASS (lab/cuda/sass_order.py): (1) the paths (tile visible
// or not to this warpgroup x P pending or not) each drain their own wgmma groups, since a merge of
// accumulator registers while a wgmma is in flight serialises every wgmma of the kernel
// (C7514/C7515); (2) a shared store of a value that depends on every exponential (the "pin") keeps
// ptxas from hoisting wait_group 0 above the softmax. The forwards this one replaced, and why:
// docs/kernel-lab-attention.md.
// ------------------------------------------------------------------------------------------------
static __device__ __forceinline__ void mbar_init(u32 a, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(a), "r"(count) : "memory");
}
static __device__ __forceinline__ void mbar_arrive(u32 a) {
    asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(a) : "memory");
}
// arrive by the threads with pred != 0 only (no branch: the caller may have wgmmas in flight)
static __device__ __forceinline__ void mbar_arrive_if(u32 a, int pred) {
    asm volatile("{\n.reg .pred p;\n.reg .b64 st;\nsetp.ne.b32 p, %1, 0;\n@p mbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(a),
                 "r"(pred)
                 : "memory");
}
static __device__ __forceinline__ void mbar_wait(u32 a, u32 parity) {
    u32 done;
    do {
        asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(a), "r"(parity)
                     : "memory");
    } while (!done);
}
// TMA: one 3-d box (columns, head, rows) of the tensor map into shared memory, completing `bytes` on mbarrier `bar`
static __device__ __forceinline__ void tma_load_3d(u32 dst, const TmaDesc* map, int c0, int c1, int c2, u32 bar) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
        "l"((unsigned long long)map), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
        : "memory");
}
static __device__ __forceinline__ void mbar_arrive_tx(u32 bar, u32 bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
static __device__ __forceinline__ void named_sync(int id, int n) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
static __device__ __forceinline__ void named_arrive(int id, int n) { asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }

#define ATTN_TR(c, t, e)
#define ATTN_TR_ITEM(j)
#define ATTN_FTR(c, t, e)
#define ATTN_CTR(e, n)
#define ATTN_FWD_REG_P 40
#define ATTN_FWD_REG_C 232
template <int D, int BN>
struct WsCfg {
    static constexpr int BM_ = 128, BN_ = BN;
    static constexpr int BM = 128;
    static constexpr int THREADS = 384;  // producer warpgroup + 2 consumer warpgroups
    static constexpr int NWARP = THREADS / 32;
    static constexpr int LDO = D + 8;  // epilogue staging row (elements)
    // Persistent: a CTA runs items (query tile, head) one after another, the next item's summary, K/V
    // and Q loaded while this one finishes; items are taken from a global counter in fwd_tile_of's heavy-first
    // order (a static round-robin left the causal CTAs 30% apart: fwd_tile_of's groups of heads). Needs the epilogue's O staging apart from Q and K (D <= 128); for D 256
    // (no room) the host launches one CTA per item and O is staged over Q.
    static constexpr bool PERSIST = D <= 128;
    static constexpr int SQ = BM * D * 2;   // bytes
    static constexpr int SKV = BN * D * 2;  // bytes, one K (or V) stage
    static constexpr int OFF_K = SQ, OFF_V = SQ + 2 * SKV;
    static constexpr int OFF_O = PERSIST ? SQ + 4 * SKV : 0;  // epilogue staging, BM rows of LDO
    static constexpr int OFF_ROW = SQ + 4 * SKV + (PERSIST ? BM * LDO * 2 : 0);  // [2 items][BM] row intervals
    static constexpr int OFF_RED = OFF_ROW + 2 * BM * 16;    // tile-summary scratch, 8 ints per warp
    static constexpr int OFF_SUM = OFF_RED + NWARP * 8 * 4;  // [2 items][8] tile summaries
    static constexpr int OFF_ITEM = OFF_SUM + 16 * 4;        // [2 items] item index (>= items: no more)
    static constexpr int OFF_PIN = OFF_ITEM + 4 * 4;         // 32 dead floats (the pin stores)
    // 13 mbarriers: K full[2], K empty[2], V full[2], V empty[2], summary ready[2], summary free[2] (the consumers and
    // the loader: a buffer is refilled only once both have read it, so no phase of "ready" runs ahead of a waiter), Q free
    static constexpr int OFF_BAR = OFF_PIN + 32 * 4;
    static constexpr int SMEM = 1024 + OFF_BAR + 13 * 8;
    static constexpr int REG_P = ATTN_FWD_REG_P, REG_C = ATTN_FWD_REG_C;
    static_assert(OFF_O + BM * LDO * 2 <= OFF_ROW, "epilogue staging fits");
    static_assert(OFF_BAR % 8 == 0, "mbarrier alignment");
    static_assert(D % 64 == 0 && BN % 64 == 0, "tile shape");
    static_assert(128 * REG_P + 256 * REG_C <= 65536, "register file");
};

// The summary of query tile [q0, q0 + BM) (tile_summary's, for the forward's producer warps 1-3: 96 threads on named
// barrier 5 while warp 0 issues loads). t: 0..95. Rows to sRow[0..BM), the summary to out[0..8).
template <int BM>
static __device__ __forceinline__ void ws_tile_summary(int t, int q0, int Tq, const int* __restrict__ fs,
                                                       const int* __restrict__ fe, const int* __restrict__ ss,
                                                       const int* __restrict__ se, int4* sRow, int* red, int* out) {
    int v[8];
#pragma unroll
    for (int i = 0; i < 8; i++) v[i] = ATTN_BIG;
    for (int r = t; r < BM; r += 96) {
        const int row = q0 + r;
        const bool valid = row < Tq;
        const int4 iv = valid ? make_int4(fs[row], fe[row], ss[row], se[row]) : make_int4(0, 0, 0, 0);
        sRow[r] = iv;
        int x[8];
        row_summary(valid, iv.x, iv.y, iv.z, iv.w, x);
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = min(v[i], x[i]);
    }
#pragma unroll
    for (int i = 0; i < 8; i++) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) v[i] = min(v[i], __shfl_xor_sync(0xffffffffu, v[i], o));
    }
    if ((t & 31) == 0) {
#pragma unroll
        for (int i = 0; i < 8; i++) red[(t >> 5) * 8 + i] = v[i];
    }
    named_sync(5, 96);
    if (t < 8) {
        const int m = min(red[t], min(red[8 + t], red[16 + t]));
        out[t] = (t == 1 || t == 2 || t == 5 || t == 6) ? -m : m;
    }
    named_sync(5, 96);
}

// One item of the persistent forward: query tile qt of head h, visiting n key tiles, [a1, a1 + n1) then a2, a2 + 1, ...
struct FwdItem {
    int qt, h, a1, n1, a2, n;
    __device__ __forceinline__ int tile(int t) const { return t < n1 ? a1 + t : a2 + (t - n1); }
};

template <int D, int BN>
__device__ __forceinline__ void attn_fwd_ws_impl(const int* __restrict__ fs,  // q, k, v: through tm_q / tm_k / tm_v
                                                 const int* __restrict__ fe, const int* __restrict__ ss,
                                                 const int* __restrict__ se, bf16_t* __restrict__ out,
                                                 float* __restrict__ lse, int* __restrict__ work, int Tq, int Tk,
                                                 int Hq, int Hkv,
                                                 float scale, int hgroup, const TmaDesc* tm_q, const TmaDesc* tm_k,
                                                 const TmaDesc* tm_v) {
    using C = WsCfg<D, BN>;
    constexpr int BM = C::BM;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const u32 raw_a = smem_u32(smem_raw);
    const u32 pad = ((raw_a + 1023u) & ~1023u) - raw_a;
    unsigned char* sb = smem_raw + pad;  // 1024-byte aligned base
    const u32 sba = raw_a + pad;
    int4* sRowB = (int4*)(sb + C::OFF_ROW);  // [item parity][BM]
    int* sRed = (int*)(sb + C::OFF_RED);
    int* sSumB = (int*)(sb + C::OFF_SUM);  // [item parity][8]
    volatile int* sItem = (volatile int*)(sb + C::OFF_ITEM);  // [item parity]
    const u32 bKf = sba + C::OFF_BAR, bKe = bKf + 16, bVf = bKf + 32, bVe = bKf + 48;  // stage s: +8*s
    const u32 bSr = bKf + 64, bSf = bKf + 80, bQf = bKf + 96;  // summary ready / free (item parity: +8*p), Q free

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wg = warp >> 2;
    const int nqt = (Tq + BM - 1) / BM;
    const int total = nqt * Hq;  // items (query tile, head)
    const size_t qstride = (size_t)Hq * D;
    constexpr int DT = D / 8;  // 16-byte chunks per row

    // The CTA's j-th item, for the loader and the consumers, once the summary warps published it; false: no more.
    auto take_item = [&](int j, FwdItem& it) -> bool {
        mbar_wait(bSr + 8 * (j & 1), (j >> 1) & 1);
        const int item = sItem[j & 1];
        if (item >= total) return false;
        fwd_tile_of(item, nqt, Hq, Hkv, hgroup, it.qt, it.h);
        int a1, b1, a2, b2;  // key-tile index ranges [a, b)
        visited_key_tiles<BN>(sSumB + 8 * (j & 1), a1, b1, a2, b2);
        it.a1 = a1;
        it.a2 = a2;
        it.n1 = max(b1 - a1, 0);
        it.n = it.n1 + max(b2 - a2, 0);
        return true;
    };

    if (tid == 0) {
#pragma unroll
        for (int s = 0; s < 2; s++) {
            mbar_init(bKf + 8 * s, 1);  // the TMA thread's arrive.expect_tx
            mbar_init(bVf + 8 * s, 1);
            mbar_init(bKe + 8 * s, 8);  // one arrive per consumer warp
            mbar_init(bVe + 8 * s, 8);
            mbar_init(bSr + 8 * s, 1);  // the summary warps' first thread
            mbar_init(bSf + 8 * s, 9);  // one arrive per consumer warp + the loader
        }
        mbar_init(bQf, 8);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (wg == 0) {
        // ================================ producer ================================
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(C::REG_P));
        if (warp == 0) {
            // One thread issues every copy as TMA boxes (64 columns x 1 head x BM or BN rows, 128-byte swizzle: the
            // panels the wgmma descriptors read; rows past Tq / Tk arrive as zeros), each stage completing on its
            // full mbarrier (expect_tx). Per item: K_0 (+ Q, once the consumers are done with the previous item's
            // Q), K_1, V_0, K_2, V_1, ..., V_{n-1}: S_{t+1} can start before V_t has landed. The K/V rings run on
            // over the items (u: the CTA's tile count).
            if (lane == 0) {
                // one tile of D/64 boxes (64 columns x `rows` rows from row0 of `head`) into dst, completing on bar
                auto load_tile = [&](u32 dst, int rows, const TmaDesc* map, int head, int row0, u32 bar) {
#pragma unroll
                    for (int p = 0; p < D / 64; p++) tma_load_3d(dst + p * (rows * 128), map, p * 64, head, row0, bar);
                };
                // the CTA's w-th K (or V) tile, key tile kt, into its ring (smem offset `ring`, mbarriers full / empty)
                // once the consumers are done with the stage's previous tile; `also`: more bytes the stage's full
                // barrier is to expect (Q). tr: the trace row, ev: its first event (three: wait, waited, issued).
                auto load_kv = [&](u32 ring, u32 full, u32 empty, const TmaDesc* map, int hk, int w, int kt, u32 also,
                                   int tr, int ev) {
                    const int s = w & 1;
                    ATTN_FTR(2, tr, ev);
                    if (w >= 2) mbar_wait(empty + 8 * s, ((w >> 1) - 1) & 1);
                    ATTN_FTR(2, tr, ev + 1);
                    mbar_arrive_tx(full + 8 * s, C::SKV + also);
                    load_tile(sba + ring + s * C::SKV, BN, map, hk, kt * BN, full + 8 * s);
                    ATTN_FTR(2, tr, ev + 2);
                };
                int u = 0, m = 0;  // K/V tiles and non-empty items so far
                for (int j = 0;; j++) {
                    FwdItem it;
                    if (!take_item(j, it)) break;
                    mbar_arrive(bSf + 8 * (j & 1));  // (the loader's last read of the summary)
                    if (it.n == 0) continue;
                    ATTN_TR_ITEM(j);
                    const int hk = it.h / (Hq / Hkv);
                    // K_0, then Q (on K_0's full barrier) once both consumers are done with the last item's Q
                    load_kv(C::OFF_K, bKf, bKe, tm_k, hk, u, it.tile(0), C::SQ, 0, 0);
                    if (m > 0) mbar_wait(bQf, (m - 1) & 1);
                    load_tile(sba, BM, tm_q, it.h, it.qt * BM, bKf + 8 * (u & 1));
                    for (int t = 0; t < it.n; t++) {
                        if (t + 1 < it.n) load_kv(C::OFF_K, bKf, bKe, tm_k, hk, u + t + 1, it.tile(t + 1), 0, t + 1, 0);
                        load_kv(C::OFF_V, bVf, bVe, tm_v, hk, u + t, it.tile(t), 0, t + 1, 3);
                    }
                    u += it.n;
                    m++;
                }
            }
        } else {
            // warps 1-3: take the CTA's next item (the first: blockIdx.x; then gridDim.x + the counter's next), and
            // its summary (row intervals, hulls) into the item parity's buffers, up to two items ahead of the
            // consumers; an item index >= items tells the loader and the consumers to stop.
            for (int j = 0;; j++) {
                if (j >= 2) mbar_wait(bSf + 8 * (j & 1), ((j >> 1) - 1) & 1);  // consumers done with item j - 2
                if (tid == 32) sItem[j & 1] = j == 0 ? (int)blockIdx.x : (int)gridDim.x + atomicAdd(work, 1);
                named_sync(5, 96);
                const int item = sItem[j & 1];
                if (item >= total) {
                    if (tid == 32) mbar_arrive(bSr + 8 * (j & 1));
                    break;
                }
                int qt, h;
                fwd_tile_of(item, nqt, Hq, Hkv, hgroup, qt, h);
                ws_tile_summary<BM>(tid - 32, qt * BM, Tq, fs, fe, ss, se, sRowB + BM * (j & 1), sRed,
                                    sSumB + 8 * (j & 1));
                if (tid == 32) mbar_arrive(bSr + 8 * (j & 1));  // (after the named barrier: every write is done)
            }
        }
    } else {
        // ================================ consumers ================================
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(C::REG_C));
        const int c = wg - 1;                  // rows [64c, 64c + 64) of the tile
        const int rw = c * 64 + (warp & 3) * 16;  // this warp's first row
        const float sl2 = scale * ATTN_LOG2E;
        const int lead = lane == 0;
        const u64 dscQ = gdesc(sba + c * 64 * 128, 16, 1024);
        const u64 dscK = gdesc(sba + C::OFF_K, 16, 1024);
        const u64 dscV = gdesc(sba + C::OFF_V, BN * 128, 1024);
        const int my_turn = 2 + c, other_turn = 3 - c;  // named barriers 2, 3 (256 threads each)
        int u = 0;  // K/V tiles so far (the rings' position)
        for (int j = 0;; j++) {
            FwdItem it;
            if (!take_item(j, it)) break;
            const int h = it.h, q0 = it.qt * BM, n = it.n;
            const int* sSum = sSumB + 8 * (j & 1);
            const int4* sRow = sRowB + BM * (j & 1);
            const int flo1 = sSum[2], fhi1 = sSum[3], flo2 = sSum[6], fhi2 = sSum[7];
            auto arrive_warps = [&](u32 bar) {  // one arrive per consumer warp, after all its lanes
                __syncwarp();
                mbar_arrive_if(bar, lead);
            };
            if (n == 0) {  // no visible key: zeros and lse = -inf
                arrive_warps(bSf + 8 * (j & 1));
                for (int i = tid - 128; i < BM * DT; i += 256) {
                    const int r = i / DT, cc = i % DT;
                    if (q0 + r < Tq)
                        *(uint4*)(out + (size_t)(q0 + r) * qstride + (size_t)h * D + cc * 8) = make_uint4(0, 0, 0, 0);
                }
                for (int r = tid - 128; r < BM; r += 256)
                    if (q0 + r < Tq) lse[(size_t)(q0 + r) * Hq + h] = ATTN_NEG_INF;
                continue;
            }
            ATTN_TR_ITEM(j);
            float o[D / 2];
            float s[BN / 2];
            u32 pa[BN / 16][4];
            float m[2], l[2], alpha[2];
#pragma unroll
            for (int i = 0; i < D / 2; i++) o[i] = 0.f;
            m[0] = m[1] = ATTN_NEG_INF;
            l[0] = l[1] = 0.f;
            alpha[0] = alpha[1] = 1.f;

            auto issue_s = [&](int st) {
                const u64 kst = (u64)((st * C::SKV) >> 4);
                wg_fence();
#pragma unroll
                for (int kk = 0; kk < D / 16; kk++) {
                    const u64 offq = (u64)(((kk >> 2) * BM * 128 + (kk & 3) * 32) >> 4);
                    const u64 offk = (u64)(((kk >> 2) * BN * 128 + (kk & 3) * 32) >> 4);
                    wgmma_ss<BN>(s, dscQ + offq, dscK + kst + offk, kk > 0 ? 1 : 0);
                }
                wg_commit();
            };
            auto issue_pv = [&](int st) {
                const u64 vst = (u64)((st * C::SKV) >> 4);
                fence_regs<D / 2>(o);
                wg_fence();
#pragma unroll
                for (int kc = 0; kc < BN / 16; kc++) wgmma_rs<D>(o, pa[kc], dscV + vst + (u64)((kc * 16 * 128) >> 4));
                wg_commit();
            };
            auto tile_vis = [&](int k0, bool full) -> bool {
                if (full) return true;
                const int4 x = sRow[c * 64 + lane], y = sRow[c * 64 + 32 + lane];
                const int kb = k0 + BN;
                return __any_sync(0xffffffffu, overlaps(x.x, x.y, k0, kb) || overlaps(x.z, x.w, k0, kb) ||
                                                   overlaps(y.x, y.y, k0, kb) || overlaps(y.z, y.w, k0, kb)) != 0;
            };
            // mask + online softmax of s (tile at key k0): s becomes P (unnormalised), m/l updated,
            // alpha = the factor O must be rescaled by before P V is added.
            int tr_t = 0;  // the tile index for the lab's clock trace inside the softmax (unused here)
            (void)tr_t;
            auto softmax = [&](int k0, bool full) {
                if (!full) {
#pragma unroll
                    for (int i = 0; i < 2; i++) {
                        const int4 iv = sRow[rw + (lane >> 2) + 8 * i];
#pragma unroll
                        for (int nt = 0; nt < BN / 8; nt++)
#pragma unroll
                            for (int e = 0; e < 2; e++) {
                                const int key = k0 + nt * 8 + 2 * (lane & 3) + e;
                                if (!(in_iv(key, iv.x, iv.y) || in_iv(key, iv.z, iv.w))) s[nt * 4 + 2 * i + e] = ATTN_NEG_INF;
                            }
                    }
                }
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    float mx = m[i];
#pragma unroll
                    for (int nt = 0; nt < BN / 8; nt++) mx = fmaxf(mx, fmaxf(s[nt * 4 + 2 * i], s[nt * 4 + 2 * i + 1]));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                    const float base = (mx == ATTN_NEG_INF) ? 0.f : mx * sl2;
                    alpha[i] = ex2(m[i] * sl2 - base);
                    m[i] = mx;
                    float rs = 0.f;
#pragma unroll
                    for (int nt = 0; nt < BN / 8; nt++)
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                            const float p = ex2(fmaf(s[nt * 4 + 2 * i + e], sl2, -base));
                            s[nt * 4 + 2 * i + e] = p;
                            rs += p;
                        }
                    l[i] = l[i] * alpha[i] + rs;
                    if (i == 0) ATTN_FTR(c, tr_t, 5);
                }
            };
            auto rescale = [&]() {
#pragma unroll
                for (int dt = 0; dt < D / 8; dt++) {
                    o[dt * 4 + 0] *= alpha[0];
                    o[dt * 4 + 1] *= alpha[0];
                    o[dt * 4 + 2] *= alpha[1];
                    o[dt * 4 + 3] *= alpha[1];
                }
            };
            auto pack = [&]() {
#pragma unroll
                for (int kc = 0; kc < BN / 16; kc++) {
                    pa[kc][0] = pack_bf16(s[(2 * kc) * 4 + 0], s[(2 * kc) * 4 + 1]);
                    pa[kc][1] = pack_bf16(s[(2 * kc) * 4 + 2], s[(2 * kc) * 4 + 3]);
                    pa[kc][2] = pack_bf16(s[(2 * kc + 1) * 4 + 0], s[(2 * kc + 1) * 4 + 1]);
                    pa[kc][3] = pack_bf16(s[(2 * kc + 1) * 4 + 2], s[(2 * kc + 1) * 4 + 3]);
                }
            };
            // Each item's turns balance (per barrier, n + 1 syncs by one consumer and n + 1 arrives by the other), and
            // a consumer reaches the next item's first arrive only after the other's last sync of this one completed.
            if (c == 1) named_arrive(2, 256);               // consumer 0 takes the first turn
            bool pend = false;  // P of the previous tile sits in pa (and its alpha in alpha), PV not yet issued
            for (int t = 0; t < n; t++) {
                const int k0 = it.tile(t) * BN;
                const bool full = (k0 >= flo1 && k0 + BN <= fhi1) || (k0 >= flo2 && k0 + BN <= fhi2);
                const bool vis = tile_vis(k0, full);
                const int w = u + t, sk = w & 1, sv = (w - 1) & 1;
                ATTN_FTR(c, t, 0);
                mbar_wait(bKf + 8 * sk, (w >> 1) & 1);                     // K_t (and, for t = 0, Q)
                if (t > 0) mbar_wait(bVf + 8 * sv, ((w - 1) >> 1) & 1);  // V_{t-1}
                ATTN_FTR(c, t, 1);
                named_sync(my_turn, 256);
                ATTN_FTR(c, t, 2);
                // Each path drains its own wgmma groups before the paths join (ptxas: no accumulator
                // phi merges while a wgmma is in flight).
                if (vis && pend) {
                    issue_s(sk);
                    rescale();  // O (PV_{t-2} complete) *= alpha_{t-1}, under the S_t GEMM
                    issue_pv(sv);
                    named_arrive(other_turn, 256);
                    ATTN_FTR(c, t, 3);
                    wg_wait<1>();
                    ATTN_FTR(c, t, 4);
                    mbar_arrive_if(bKe + 8 * sk, lead);  // K_t read
                    fence_regs<BN / 2>(s);
                    softmax(k0, full);
                    ATTN_FTR(c, t, 6);
                    // the pin: keeps ptxas from hoisting wait_group 0 above the softmax (pitfall 2 above)
                    asm volatile("st.shared.f32 [%0], %1;\n" ::"r"(sba + C::OFF_PIN + 4 * lane), "f"(l[0] + l[1]) : "memory");
                    wg_wait<0>();
                    ATTN_FTR(c, t, 7);
                    mbar_arrive_if(bVe + 8 * sv, lead);  // V_{t-1} read
                    fence_regs<D / 2>(o);
                    pack();
                    ATTN_FTR(c, t, 8);
                } else if (vis) {
                    issue_s(sk);
                    named_arrive(other_turn, 256);
                    wg_wait<0>();
                    mbar_arrive_if(bKe + 8 * sk, lead);
                    if (t > 0) mbar_arrive_if(bVe + 8 * sv, lead);
                    fence_regs<BN / 2>(s);
                    softmax(k0, full);
                    pack();
                } else if (pend) {
                    rescale();
                    issue_pv(sv);
                    named_arrive(other_turn, 256);
                    mbar_arrive_if(bKe + 8 * sk, lead);
                    wg_wait<0>();
                    mbar_arrive_if(bVe + 8 * sv, lead);
                    fence_regs<D / 2>(o);
                } else {
                    named_arrive(other_turn, 256);
                    mbar_arrive_if(bKe + 8 * sk, lead);
                    if (t > 0) mbar_arrive_if(bVe + 8 * sv, lead);
                }
                pend = vis;
            }
            {
                const int w = u + n - 1;
                mbar_wait(bVf + 8 * (w & 1), (w >> 1) & 1);  // V_{n-1}
                named_sync(my_turn, 256);
                if (pend) {
                    rescale();
                    issue_pv(w & 1);
                    if (c == 0) named_arrive(other_turn, 256);  // consumer 1's last turn
                    wg_wait<0>();
                    fence_regs<D / 2>(o);
                } else {
                    if (c == 0) named_arrive(other_turn, 256);
                }
                mbar_arrive_if(bVe + 8 * (w & 1), lead);  // V_{n-1} read (the ring runs on into the next item)
            }
            u += n;
            // Q, the item's summary buffers: read for the last time (every wgmma retired)
            arrive_warps(bSf + 8 * (j & 1));
            if constexpr (C::PERSIST) {
                mbar_arrive_if(bQf, lead);
            } else {
                named_sync(4, 256);  // O is staged over Q: both consumers done with it (one item per CTA)
            }

            // ---- epilogue: normalise, write lse, stage O through smem (padded rows) for 16-byte stores ----
            // (PERSIST: the other consumer's stores of the previous item's O were done before its turns of this one)
            bf16_t* sO = (bf16_t*)(sb + C::OFF_O);
#pragma unroll
            for (int i = 0; i < 2; i++) {
                float ls = l[i];
                ls += __shfl_xor_sync(0xffffffffu, ls, 1);
                ls += __shfl_xor_sync(0xffffffffu, ls, 2);
                const float inv = ls != 0.f ? 1.f / ls : 0.f;  // NaN stays NaN (NaN policy)
                const int r = rw + (lane >> 2) + 8 * i;
                if ((lane & 3) == 0 && q0 + r < Tq)
                    lse[(size_t)(q0 + r) * Hq + h] = ls != 0.f ? (m[i] * sl2 + __log2f(ls)) * ATTN_LN2 : ATTN_NEG_INF;
#pragma unroll
                for (int dt = 0; dt < D / 8; dt++)
                    *(u32*)(sO + r * C::LDO + dt * 8 + 2 * (lane & 3)) =
                        pack_bf16(attn_normalised(o[dt * 4 + 2 * i], inv, ls),
                                  attn_normalised(o[dt * 4 + 2 * i + 1], inv, ls));
            }
            named_sync(4, 256);
            {
                constexpr int RPC = 256 / DT;  // rows per pass of the 256 consumer threads
                const int ct = tid - 128, lrow = ct / DT, lc = ct % DT;
                bf16_t* go0 = out + (size_t)(q0 + lrow) * qstride + (size_t)h * D + lc * 8;
#pragma unroll
                for (int jj = 0; jj < BM / RPC; jj++)
                    if (q0 + lrow + jj * RPC < Tq)
                        *(uint4*)(go0 + (size_t)jj * RPC * qstride) = *(const uint4*)(sO + (lrow + jj * RPC) * C::LDO + lc * 8);
            }
        }
    }
}

#endif  // ATTN_WGMMA
