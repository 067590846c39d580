// attention/bwd_wgmma.cuh: the warp-specialised Hopper backward (head_dim 64 / 128).
// Part of attention.cu (included there, in order; see its header comment).

// ------------------------------------------------------------------------------------------------
// Backward on Hopper (the designs it replaced, and why: docs/kernel-lab-attention.md), its memory traffic on
// TMA: Q/dO tiles loaded by one thread, dQ tiles added into dq_accum by tensor reductions. FA3's structure: one
// CTA per (key tile of BN = 128 keys, kv head), K and V resident in shared memory (the forward's 128-byte-swizzled
// K-major panels), one step per listed (query tile of BM = 64 rows x group head). 384 threads in three
// roles; setmaxnreg: the producer warpgroup drops to 24 registers, the two consumers rise to 240
// (launch bound 168 x 384 = the register file).
//   warpgroups 0, 1 (consumers, 64 keys each), per step:
//     S^T  = K_wg Q^T, dP^T = V_wg dO^T   SS wgmma m64n64k16, one wait for both
//     P^T  = exp2(S^T*scale*log2e - lse*log2e) (masked), dS^T = P^T (dP^T - D_i), in registers
//                                          (bwd_ew: Full / partial instantiations, no branches)
//     dV  += P^T dO, dK += dS^T Q         RS wgmma m64nDk16 (P^T / dS^T as A fragments), left in flight
//     dS^T -> shared memory (bf16, swizzled), one named barrier (bar 1: the consumers only), then
//     dQ   = dS K                          (the dQ warpgroup first retires its dK/dV and releases the
//                                          step's Q/dO stage)
//                                          SS wgmma, both operands transposed: the whole dQ of step g
//                                          (two 64-column halves; one m64n128 sequence is C7512) by
//                                          warpgroup g & 1 while the other goes on to step g + 1; staged
//                                          as f32 in shared memory in TMA's 128-byte-swizzled boxes of
//                                          32 columns (conflict-free v2 stores), two tiles used
//                                          alternately; the one dS^T buffer is freed by an mbarrier
//                                          (ds_free) once the dQ wgmmas retired.
//     A warpgroup skips (S, dP, dK, dV) a partial step none of whose 64 rows sees any of its 64 keys.
//   warpgroup 2 (producer), per step, into a 2-stage ring:
//     warp 8, one thread: Q and dO as 2 x D/64 TMA boxes (cp.async.bulk.tensor, tensor maps tm_q / tm_do
//       built by the host; rows past Tq arrive as zeros) completing on the stage's "full" mbarrier
//       (expect_tx); one issuing thread, since cp.async from many threads spent most of its time computing
//       (spilled) addresses while the consumers waited for Q/dO;
//     warp 10: lse, D_i and the row intervals (cp.async, cp.async.mbarrier.arrive.noinc on the same
//       barrier); the consumers release a stage with one arrive per warp ("empty") after its dK/dV retired;
//     warp 11, the dQ writer: waits for a staged tile (dq_full), adds it into dq_accum with D/32 TMA tensor
//       reductions from one thread (tm_dq: rows past Tq left out; per-row bulk reductions would serialise
//       lane by lane, 64 per step), and frees the tile (dq_empty) once the reads are done.
// No CTA barrier inside the step loop (the query-tile list is built by all 384 threads with bar.sync 0
// per chunk of 384 query tiles). ptxas pipelines the wgmmas only if no non-wgmma instruction writes an
// accumulator while any wgmma is in flight and no wgmma is conditional inside a group (else it
// serialises every wgmma of the kernel: C7515): hence one wait for S^T and dP^T together, dQ without a
// zero fill (scale-d 0 first) over all 8 k-steps. ptxas: 168 registers (the launch bound; consumers
// 240), 8 spill bytes (d128), no C75xx (lab/cuda/sass_order.py: H W0 E H W0 W0 H W0 H W0 W0).
// d256 keeps the mma.sync backward (dK and dV accumulators alone would be 256 registers per thread).
// ------------------------------------------------------------------------------------------------
#define ATTN_BWD_REG_C 240
#define ATTN_BTR(c, t, e)
#define ATTN_BWD_REG_P 24
// Every CTA walks its query-tile list in order, so the CTAs resident together reduce into a few dq_accum rows at a
// time, which stay in L2 (a hashed start offset per list, against contention on those rows, measured slower:
// the lab's variant bwd_rot).
#define ATTN_BWD_ROT(kt, total) 0
template <int D>
struct WsBwdCfg {
    static constexpr int BN = 128, BM = BWD_BM, THREADS = 384, NCT = 256;  // NCT: consumer threads
    static constexpr int KV = BN * D * 2;   // bytes of the K (or V) tile
    static constexpr int QS = BM * D * 2;   // bytes of one Q (or dO) stage
    static constexpr int DS = BN * BM * 2;  // bytes of one dS^T buffer
    static constexpr int DQN = D == 64 ? 64 : D / 2;  // dQ columns per warpgroup
    // staged dQ tile: D/32 boxes of 64 rows x 32 f32 (128-byte rows, swizzled as TMA's 128-byte mode), one TMA
    // tensor reduction each (conflict-free v2 stores: the swizzle spreads a warp's 8 rows over the banks)
    static constexpr int DQLD = D * 4;  // bytes per staged dQ row
    static constexpr int NS = 2;                    // Q/dO stages (3 leave room for one dQ tile only: slower)
    static constexpr int NDQ = 2;                   // staged dQ tiles
    static constexpr int OFF_K = 0, OFF_V = KV, OFF_Q = 2 * KV, OFF_DO = OFF_Q + NS * QS, OFF_DS = OFF_DO + NS * QS;
    static constexpr int OFF_DQ = OFF_DS + DS;              // one dS^T buffer, then NDQ staged dQ tiles
    static constexpr int OFF_LSE = OFF_DQ + NDQ * BM * DQLD;  // [NS][BM] f32
    static constexpr int OFF_DI = OFF_LSE + NS * BM * 4;  // [NS][BM] f32
    static constexpr int OFF_ROW = OFF_DI + NS * BM * 4;  // [NS][BM] int4
    static constexpr int LISTN = THREADS;
    static constexpr int OFF_LIST = OFF_ROW + NS * BM * 16;
    static constexpr int OFF_CNT = OFF_LIST + LISTN * 4;  // [16] warp counts, [2][2] visibility, dQ flag, pin
    static constexpr int OFF_BAR = OFF_CNT + 32 * 4;      // mbarriers: full[2], empty[2], dq_full[2], dq_empty[2], ds_free
    static constexpr int SMEM = 1024 + OFF_BAR + (2 * NS + 5) * 8;
    static constexpr int LDE = D + 8;  // epilogue staging row (elements)
    static_assert(BN * LDE * 2 <= 2 * NS * QS, "epilogue staging fits in the Q/dO area");
    static_assert(BM == 64 && DQN == 64 && SMEM <= 232448, "tile shape");
};

#ifdef ATTN_WGMMA
// mbarrier helpers: mbar_init / mbar_arrive / mbar_wait of fwd_wgmma.cuh.
static __device__ __forceinline__ void bwd_bar_all() { asm volatile("bar.sync 0;\n" ::: "memory"); }
static __device__ __forceinline__ void bwd_bar_cons() { asm volatile("bar.sync 1, 256;\n" ::: "memory"); }
static __device__ __forceinline__ void bwd_bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
static __device__ __forceinline__ void bwd_bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
static __device__ __forceinline__ void bwd_bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
// TMA: adds the 3-d box at `src` (shared memory) into the tensor map's f32 elements (bulk async-group)
static __device__ __forceinline__ void tma_red_add_3d(const TmaDesc* map, int c0, int c1, int c2, u32 src) {
    asm volatile("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2, %3}], [%4];\n" ::"l"(
                     (unsigned long long)map),
                 "r"(c0), "r"(c1), "r"(c2), "r"(src)
                 : "memory");
}

// P^T = exp2(S^T * scale * log2e - lse * log2e) (0 where masked), dS^T = P^T (dP^T - D_i), both packed to
// bf16 A fragments. F: every (key, query) pair of the step is visible. Branch-free, since the form
// `ok ? ex2(..) : 0` with short-circuit interval tests on a run-time `full` compiles to two branches, a
// BSSY/BSYNC pair and a dependent LDS per score (~600 instructions per thread and step).
template <bool F>
static __device__ __forceinline__ void bwd_ew(const float (&s)[32], float (&dp)[32], u32 (&pa)[4][4], u32 (&da)[4][4],
                                              const float* lS, const float* dI, const int4* rows, int kr, int lane,
                                              float sl2) {
    float nl[16], di[16];
#pragma unroll
    for (int nt = 0; nt < 8; nt++) {
        const float2 l2 = *(const float2*)(lS + nt * 8 + 2 * (lane & 3));
        const float2 d2 = *(const float2*)(dI + nt * 8 + 2 * (lane & 3));
        nl[2 * nt] = -l2.x * ATTN_LOG2E;
        nl[2 * nt + 1] = -l2.y * ATTN_LOG2E;
        di[2 * nt] = d2.x;
        di[2 * nt + 1] = d2.y;
    }
    float p[32];
#pragma unroll
    for (int nt = 0; nt < 8; nt++)
#pragma unroll
        for (int x = 0; x < 2; x++) {
            int4 iv = make_int4(0, 0, 0, 0);
            if constexpr (!F) iv = rows[nt * 8 + 2 * (lane & 3) + x];
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const int j = nt * 4 + 2 * i + x;
                const float e = ex2(fmaf(s[j], sl2, nl[2 * nt + x]));
                if constexpr (F) {
                    p[j] = e;
                } else {
                    const int key = kr + 8 * i;
                    const bool ok = ((key >= iv.x) & (key < iv.y)) | ((key >= iv.z) & (key < iv.w));
                    p[j] = __int_as_float(__float_as_int(e) & (ok ? -1 : 0));
                }
                dp[j] = p[j] * (dp[j] - di[2 * nt + x]);
            }
        }
#pragma unroll
    for (int kc = 0; kc < 4; kc++) {
        pa[kc][0] = pack_bf16(p[(2 * kc) * 4 + 0], p[(2 * kc) * 4 + 1]);
        pa[kc][1] = pack_bf16(p[(2 * kc) * 4 + 2], p[(2 * kc) * 4 + 3]);
        pa[kc][2] = pack_bf16(p[(2 * kc + 1) * 4 + 0], p[(2 * kc + 1) * 4 + 1]);
        pa[kc][3] = pack_bf16(p[(2 * kc + 1) * 4 + 2], p[(2 * kc + 1) * 4 + 3]);
        da[kc][0] = pack_bf16(dp[(2 * kc) * 4 + 0], dp[(2 * kc) * 4 + 1]);
        da[kc][1] = pack_bf16(dp[(2 * kc) * 4 + 2], dp[(2 * kc) * 4 + 3]);
        da[kc][2] = pack_bf16(dp[(2 * kc + 1) * 4 + 0], dp[(2 * kc + 1) * 4 + 1]);
        da[kc][3] = pack_bf16(dp[(2 * kc + 1) * 4 + 2], dp[(2 * kc + 1) * 4 + 3]);
    }
}

template <int D>
__device__ __forceinline__ void attn_bwd_ws_impl(
    const bf16_t* __restrict__ k, const bf16_t* __restrict__ v, const float* __restrict__ lse,
    const float* __restrict__ Di, const int* __restrict__ summary, const int* __restrict__ fs,
    const int* __restrict__ fe, const int* __restrict__ ss, const int* __restrict__ se, bf16_t* __restrict__ dk,
    bf16_t* __restrict__ dv, int Tq, int Tk, int Hq, int Hkv, float scale, int hgroup, const TmaDesc* tm_q,
    const TmaDesc* tm_do, const TmaDesc* tm_dq) {  // q, dout and dq_accum only through their tensor maps
    using C = WsBwdCfg<D>;
    constexpr int BM = C::BM, BN = C::BN;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const u32 raw_a = smem_u32(smem_raw);
    const u32 pad = ((raw_a + 1023u) & ~1023u) - raw_a;
    unsigned char* sb = smem_raw + pad;  // 1024-byte aligned base
    const u32 sba = raw_a + pad;
    float* sLse = (float*)(sb + C::OFF_LSE);
    float* sDi = (float*)(sb + C::OFF_DI);
    int4* sRow = (int4*)(sb + C::OFF_ROW);
    int* sList = (int*)(sb + C::OFF_LIST);
    int* sCnt = (int*)(sb + C::OFF_CNT);
    int* sWv = sCnt + 16;   // [NS buffers][2 warpgroups]
    int* sDqf = sCnt + 24;  // [NDQ] dQ of the staged step present (written by thread 0)
    constexpr int NS = C::NS, NDQ = C::NDQ;
    // mbarriers: full[2], empty[2], dq_full[2], dq_empty[2], ds_free
    const u32 barF = sba + C::OFF_BAR, barE = barF + 8 * NS, barQF = barE + 8 * NS, barQE = barQF + 16, barDS = barQE + 16;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2, wq = warp & 3;
    const int G = Hq / Hkv;
    int kt, hk;
    bwd_tile_of(blockIdx.x, Tk, BN, Hkv, hgroup, kt, hk);
    const int k0 = kt * BN;
    const int k1 = min(k0 + BN, Tk);
    const int nqt = (Tq + BM - 1) / BM;
    const size_t kstride = (size_t)Hkv * D;
    ATTN_CTR(0, 0);

    if (tid == 0) {
#pragma unroll
        for (int i = 0; i < NS; i++) {
            mbar_init(barF + 8 * i, 33);  // the TMA thread + the lse/D_i/rows warp
            mbar_init(barE + 8 * i, 8);
        }
        mbar_init(barQF, 128);
        mbar_init(barQE, 1);
        mbar_init(barQF + 8, 128);
        mbar_init(barQE + 8, 1);
        mbar_init(barDS, C::NCT);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    // list of the query tiles of chunk [base, base + LISTN) that can see key tile [k0, k1) (all threads)
    auto build_list = [&](int base) -> int {
        int entry = -1;
        const int qt = base + tid;
        if (qt < nqt) {
            const int4 s0 = *(const int4*)(summary + qt * 8);
            const int4 s1 = *(const int4*)(summary + qt * 8 + 4);
            bool vis = overlaps(s0.x, s0.y, k0, k1) || overlaps(s1.x, s1.y, k0, k1);
            bool full = (k0 >= s0.z && k0 + BN <= s0.w) || (k0 >= s1.z && k0 + BN <= s1.w);
            if (vis) entry = qt | (full ? 0 : 0x40000000);
        }
        const u32 bal = __ballot_sync(0xffffffffu, entry >= 0);
        if (lane == 0) sCnt[warp] = __popc(bal);
        bwd_bar_all();
        int off = 0, tot = 0;
#pragma unroll
        for (int w = 0; w < C::THREADS / 32; w++) {
            int c = sCnt[w];
            off += (w < warp) ? c : 0;
            tot += c;
        }
        if (entry >= 0) sList[off + __popc(bal & ((1u << lane) - 1u))] = entry;
        bwd_bar_all();
        return tot;
    };
    int rot = 0, total = 1;
    auto list_at = [&](int it) {
        int li = it / G + rot;
        if (li >= total) li -= total;
        return sList[li];
    };

    if (wg == 2) {
        // ================================ producer warpgroup ================================
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(ATTN_BWD_REG_P));
        int g0 = 0;
        for (int base = 0; base < nqt; base += C::LISTN) {
            total = build_list(base);
            const int nit = total * G;
            if (nit == 0) continue;
            rot = ATTN_BWD_ROT(kt, total);
            if (wq == 0) {  // Q and dO of each step: 2 x D/64 TMA boxes (64 columns x 64 rows) from one thread
                if (lane == 0)
                    for (int it = 0; it < nit; it++) {
                        const int g = g0 + it, st = g % NS;
                        if (g >= NS) mbar_wait(barE + 8 * st, ((g / NS) - 1) & 1);
                        const int li = it / G;
                        const int q0 = (list_at(it) & 0x3fffffff) * BM;
                        const int h = hk * G + (it - li * G);
                        const u32 bar = barF + 8 * st;
                        mbar_arrive_tx(bar, 2 * C::QS);  // rows past Tq are zero-filled and count
#pragma unroll
                        for (int p = 0; p < D / 64; p++) {
                            tma_load_3d(sba + C::OFF_Q + st * C::QS + p * (BM * 128), tm_q, p * 64, h, q0, bar);
                            tma_load_3d(sba + C::OFF_DO + st * C::QS + p * (BM * 128), tm_do, p * 64, h, q0, bar);
                        }
                    }
                __syncwarp();
            } else if (wq == 2) {  // lse, D_i and the row intervals of each step (cp.async, arriving on the same barrier)
                for (int it = 0; it < nit; it++) {
                    const int g = g0 + it, st = g % NS;
                    if (g >= NS) mbar_wait(barE + 8 * st, ((g / NS) - 1) & 1);
                    const int li = it / G;
                    const int e = list_at(it);
                    const int q0 = (e & 0x3fffffff) * BM;
                    const int h = hk * G + (it - li * G);
#pragma unroll
                    for (int j = 0; j < 2; j++) {
                        const int r = lane + 32 * j, row = q0 + r;
                        const bool ok = row < Tq;
                        const size_t rr = ok ? (size_t)row : 0;
                        int* dRow = (int*)(sRow + st * BM + r);
                        cp_async4(smem_u32(sLse + st * BM + r), lse + rr * Hq + h, ok);
                        cp_async4(smem_u32(sDi + st * BM + r), Di + rr * Hq + h, ok);
                        cp_async4(smem_u32(dRow + 0), fs + rr, ok);
                        cp_async4(smem_u32(dRow + 1), fe + rr, ok);
                        cp_async4(smem_u32(dRow + 2), ss + rr, ok);
                        cp_async4(smem_u32(dRow + 3), se + rr, ok);
                    }
                    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(barF + 8 * st) : "memory");
                }
            } else if (wq == 3) {
                // dQ writer
                for (int it = 0; it < nit; it++) {
                    const int g = g0 + it;
                  {
                    const int w = g % NDQ;  // staged tile of step g, and its phase
                    mbar_wait(barQF + 8 * w, (g / NDQ) & 1);
                    if (*(volatile int*)(sDqf + w)) {
                        const int li = it / G;
                        const int e = list_at(it);
                        const int q0 = (e & 0x3fffffff) * BM;
                        const int h = hk * G + (it - li * G);
                        if (lane == 0) {  // rows past Tq: TMA leaves them out
#pragma unroll
                            for (int b = 0; b < D / 32; b++)
                                tma_red_add_3d(tm_dq, b * 32, h, q0, sba + C::OFF_DQ + w * (BM * C::DQLD) + b * (BM * 128));
                            bwd_bulk_commit();
                            bwd_bulk_wait_read();
                        }
                    }
                    __syncwarp();
                    if (lane == 0) mbar_arrive(barQE + 8 * w);
                  }
                }
            }
            g0 += nit;
        }
        if (wq == 3) bwd_bulk_wait_all();
    } else {
        // ================================ consumer warpgroups ================================
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(ATTN_BWD_REG_C));
        const float sl2 = scale * ATTN_LOG2E;
        constexpr int DT = D / 8;
        constexpr int RPT = C::NCT / DT;  // rows per loader pass
        static_assert(C::NCT % DT == 0 && RPT % 8 == 0 && BN % RPT == 0, "loader shape");
        const int lrow = tid / DT, lc = tid % DT;
        const u32 swz = (u32)((((lc & 7) ^ (lrow & 7)) << 4) + lrow * 128);
        {  // K, V tile (panels of 64 columns x BN rows)
            const u32 dK = sba + C::OFF_K + (lc >> 3) * (BN * 128) + swz;
            const u32 dV = sba + C::OFF_V + (lc >> 3) * (BN * 128) + swz;
            const bf16_t* gk0 = k + (size_t)(k0 + lrow) * kstride + (size_t)hk * D + lc * 8;
            const bf16_t* gv0 = v + (size_t)(k0 + lrow) * kstride + (size_t)hk * D + lc * 8;
#pragma unroll
            for (int j = 0; j < BN / RPT; j++) {
                const bool ok = k0 + lrow + j * RPT < Tk;
                const size_t o = (size_t)j * RPT * kstride;
                cp_async16(dK + j * RPT * 128, ok ? gk0 + o : k, ok);
                cp_async16(dV + j * RPT * 128, ok ? gv0 + o : v, ok);
            }
        }
        cp_async_commit();

        float dka[D / 2], dva[D / 2];
#pragma unroll
        for (int i = 0; i < D / 2; i++) dka[i] = dva[i] = 0.f;

        const u64 dKa = gdesc(sba + C::OFF_K + wg * 64 * 128, 16, 1024);  // A: this warpgroup's keys, K-major
        const u64 dVa = gdesc(sba + C::OFF_V + wg * 64 * 128, 16, 1024);
        const u64 dQb = gdesc(sba + C::OFF_Q, 16, 1024);                  // B: Q rows (N = queries), K-major
        const u64 dOb = gdesc(sba + C::OFF_DO, 16, 1024);
        const u64 dQt = gdesc(sba + C::OFF_Q, BM * 128, 1024);            // B: Q (K = queries, N = D), MN-major
        const u64 dOt = gdesc(sba + C::OFF_DO, BM * 128, 1024);
        const u64 dSa = gdesc(sba + C::OFF_DS, BN * 128, 1024);           // A: dS^T (M = queries), MN-major
        const u64 dKt0 = gdesc(sba + C::OFF_K, BN * 128, 1024);  // ALTQ: B = K, D columns from 0

        int g0 = 0;
        bool first = true;
        for (int base = 0; base < nqt; base += C::LISTN) {
            total = build_list(base);
            const int nit = total * G;
            if (nit == 0) continue;
            rot = ATTN_BWD_ROT(kt, total);
            if (first) {  // K, V landed (this thread's copies), visible to both proxies of all consumers
                cp_async_wait<0>();
                fence_proxy_async();
                bwd_bar_cons();
                first = false;
                ATTN_CTR(1, 0);
            }
            for (int it = 0; it < nit; it++) {
                const int g = g0 + it, st = g % NS;
                ATTN_BTR(wg, g, 0);
                mbar_wait(barF + 8 * st, (g / NS) & 1);
                ATTN_BTR(wg, g, 1);
                if (g == 0) ATTN_CTR(2, 0);
                const bool full = !(list_at(it) & 0x40000000);  // (the producer and writer place the tile)
                const float* lS = sLse + st * BM;
                const float* dI = sDi + st * BM;
                const int4* rows = sRow + st * BM;
                unsigned char* sDS = sb + C::OFF_DS;
                const int kw0 = k0 + wg * 64;  // first key of this warpgroup
                bool vis = true;
                if (!full) {
                    const int4 x = rows[lane], y = rows[lane + 32];
                    const int kb = kw0 + 64;
                    vis = __any_sync(0xffffffffu, overlaps(x.x, x.y, kw0, kb) || overlaps(x.z, x.w, kw0, kb) ||
                                                      overlaps(y.x, y.y, kw0, kb) || overlaps(y.z, y.w, kw0, kb));
                }
                if (wq == 0 && lane == 0) sWv[st * 2 + wg] = vis ? 1 : 0;
                u32 pa[4][4], da[4][4];
                // this warpgroup's 64 rows of dS^T (bf16, 128-byte swizzled; zeros when it sees none of the step's
                // queries), for the async proxy (the dQ wgmmas)
                auto store_ds = [&](bool zeros) {
#pragma unroll
                    for (int nt = 0; nt < BM / 8; nt++)
#pragma unroll
                        for (int i = 0; i < 2; i++) {
                            const int r = wg * 64 + wq * 16 + (lane >> 2) + 8 * i;
                            *(u32*)(sDS + r * 128 + ((nt ^ (r & 7)) << 4) + 4 * (lane & 3)) =
                                zeros ? 0u : da[nt >> 1][(nt & 1) * 2 + i];
                        }
                    fence_proxy_async();
                };
                if (vis) {
                    float s[BM / 2], dp[BM / 2];
                    const u64 qo = (u64)((st * C::QS) >> 4);
                    wg_fence();
#pragma unroll
                    for (int kk = 0; kk < D / 16; kk++) {
                        const u64 oa = (u64)(((kk >> 2) * BN * 128 + (kk & 3) * 32) >> 4);
                        const u64 ob = (u64)(((kk >> 2) * BM * 128 + (kk & 3) * 32) >> 4);
                        wgmma_ss<64>(s, dKa + oa, dQb + qo + ob, kk > 0 ? 1 : 0);
                    }
#pragma unroll
                    for (int kk = 0; kk < D / 16; kk++) {
                        const u64 oa = (u64)(((kk >> 2) * BN * 128 + (kk & 3) * 32) >> 4);
                        const u64 ob = (u64)(((kk >> 2) * BM * 128 + (kk & 3) * 32) >> 4);
                        wgmma_ss<64>(dp, dVa + oa, dOb + qo + ob, kk > 0 ? 1 : 0);
                    }
                    wg_commit();
                    ATTN_BTR(wg, g, 2);
                    const int kr = kw0 + wq * 16 + (lane >> 2);  // key of this thread's rows (i = 0; +8 for i = 1)
                    static_assert(BM == 64, "bwd_ew shape");
                    wg_wait<0>();
                    fence_regs<BM / 2>(s);
                    fence_regs<BM / 2>(dp);
                    ATTN_BTR(wg, g, 3);
                    if (full) bwd_ew<true>(s, dp, pa, da, lS, dI, rows, kr, lane, sl2);
                    else bwd_ew<false>(s, dp, pa, da, lS, dI, rows, kr, lane, sl2);
                    // dV += P^T dO, dK += dS^T Q: in flight across the dS^T store, the barrier and the dQ issue
                    wg_fence();
#pragma unroll
                    for (int kc = 0; kc < BM / 16; kc++) wgmma_rs<D>(dva, pa[kc], dOt + qo + (u64)((kc * 16 * 128) >> 4));
#pragma unroll
                    for (int kc = 0; kc < BM / 16; kc++) wgmma_rs<D>(dka, da[kc], dQt + qo + (u64)((kc * 16 * 128) >> 4));
                    wg_commit();
                    ATTN_BTR(wg, g, 4);
                    if (g > 0) mbar_wait(barDS, (g - 1) & 1);  // dQ of step g-1 has read dS^T
                    ATTN_BTR(wg, g, 5);
                    store_ds(false);
                } else {  // zeros for this warpgroup's dS^T rows (the other warpgroup's dQ k-steps read them)
                    if (g > 0) mbar_wait(barDS, (g - 1) & 1);
                    store_ds(true);
                }
                bwd_bar_cons();  // dS^T of both warpgroups and their visibility flags are in shared memory
                ATTN_BTR(wg, g, 6);
                if (wg == (g & 1)) {
                    const int vq = sWv[st * 2] | sWv[st * 2 + 1];
                    auto release = [&]() {  // dK/dV of this step retired: the Q/dO stage goes back to the producer
                        __syncwarp();
                        if (lane == 0) mbar_arrive(barE + 8 * st);
                    };
                    wg_wait<0>();  // dK/dV of this step retire: the stage is free before the dQ
                    release();
                    ATTN_BTR(wg, g, 9);
                    const int w = g % NDQ;     // staged dQ tile of this step
                    auto wait_free = [&]() {  // the writer has read what step g - 2 staged there
                        if (g >= NDQ) mbar_wait(barQE + 8 * w, ((g / NDQ) - 1) & 1);
                    };
                    if (vq) {
#pragma unroll
                        for (int hh = 0; hh < D / 64; hh++) {  // 64-column halves (a 64-register dQ: C7512)
                            float dq[32];
                            wg_fence();
#pragma unroll
                            for (int kc = 0; kc < BN / 16; kc++) {
                                const u64 o = (u64)((kc * 16 * 128) >> 4);
                                wgmma_ss_tt_n64(dq, dSa + o, dKt0 + (u64)((hh * BN * 128 + kc * 16 * 128) >> 4),
                                                kc > 0 ? 1 : 0);
                            }
                            wg_commit();
                            wg_wait<0>();  // (also retires dK/dV)
                            fence_regs<32>(dq);
                            if (hh == D / 64 - 1) mbar_arrive(barDS);  // dS^T read by all halves
                            if (hh == 0) ATTN_BTR(wg, g, 10);
                            if (hh == 0) wait_free();
                            if (hh == 0) ATTN_BTR(wg, g, 11);
#pragma unroll
                            for (int i = 0; i < 2; i++) {
                                const int r = wq * 16 + (lane >> 2) + 8 * i;
                                // column hh*64 + nt*8 + 2*(lane&3): box hh*2 + nt/4, 16-byte chunk (nt%4)*2 + (lane&3)/2
                                // XOR row%8, byte (lane&1)*8 in it
                                unsigned char* dst = sb + C::OFF_DQ + w * (BM * C::DQLD) + hh * 2 * (BM * 128) + r * 128 +
                                                     (lane & 1) * 8;
#pragma unroll
                                for (int nt = 0; nt < 8; nt++)
                                    *(float2*)(dst + (nt >> 2) * (BM * 128) +
                                               ((((nt & 3) * 2 + ((lane & 3) >> 1)) ^ (r & 7)) << 4)) =
                                        make_float2(dq[nt * 4 + 2 * i], dq[nt * 4 + 2 * i + 1]);
                            }
                        }
                        fence_proxy_async();  // read by the bulk-copy (async) proxy
                    } else {
                        mbar_arrive(barDS);
                        wait_free();
                    }
                    if (wq == 0 && lane == 0) *(volatile int*)(sDqf + w) = vq;
                    mbar_arrive(barQF + 8 * w);
                    ATTN_BTR(wg, g, 7);
                } else {
                    mbar_arrive(barDS);
                    ATTN_BTR(wg, g, 7);
                }
                if (wg != (g & 1)) {  // (the dQ warpgroup released its stage before the dQ)
                    wg_wait<0>();  // dK/dV of this step retire before the stage is released
                    __syncwarp();
                    if (lane == 0) mbar_arrive(barE + 8 * st);
                }
                ATTN_BTR(wg, g, 8);
            }
            g0 += nit;
        }
        cp_async_wait<0>();
        wg_wait<0>();
        fence_regs<D / 2>(dka);
        fence_regs<D / 2>(dva);
        bwd_bar_cons();
        ATTN_CTR(3, 0);

        // ---- epilogue: dK (scaled) and dV through shared memory (padded rows in the Q/dO area) ----------
        // (the producer has nothing in flight into Q/dO: every stage it filled was consumed above)
        bf16_t* sE = (bf16_t*)(sb + C::OFF_Q);
#pragma unroll
        for (int pass = 0; pass < 2; pass++) {
            bf16_t* dst = pass == 0 ? dk : dv;
            const float f = pass == 0 ? scale : 1.f;
#pragma unroll
            for (int i = 0; i < 2; i++) {
                const int r = wg * 64 + wq * 16 + (lane >> 2) + 8 * i;
#pragma unroll
                for (int nt = 0; nt < D / 8; nt++) {
                    const float a0 = pass == 0 ? dka[nt * 4 + 2 * i] : dva[nt * 4 + 2 * i];
                    const float a1 = pass == 0 ? dka[nt * 4 + 2 * i + 1] : dva[nt * 4 + 2 * i + 1];
                    *(u32*)(sE + r * C::LDE + nt * 8 + 2 * (lane & 3)) = pack_bf16(a0 * f, a1 * f);
                }
            }
            bwd_bar_cons();
            bf16_t* g0p = dst + (size_t)(k0 + lrow) * kstride + (size_t)hk * D + lc * 8;
#pragma unroll
            for (int j = 0; j < BN / RPT; j++)
                if (k0 + lrow + j * RPT < Tk)
                    *(uint4*)(g0p + (size_t)j * RPT * kstride) = *(const uint4*)(sE + (lrow + j * RPT) * C::LDE + lc * 8);
            bwd_bar_cons();
        }
        ATTN_CTR(4, g0);
    }
}
#else
template <int D>
__device__ __forceinline__ void attn_bwd_ws_impl(const bf16_t*, const bf16_t*, const float*, const float*, const int*,
                                                 const int*, const int*, const int*, const int*, bf16_t*, bf16_t*, int,
                                                 int, int, int, float, int, const TmaDesc*, const TmaDesc*,
                                                 const TmaDesc*) {}
#endif  // ATTN_WGMMA

