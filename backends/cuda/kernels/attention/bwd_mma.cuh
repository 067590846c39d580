// attention/bwd_mma.cuh: the backward preprocess (D_i, dq_accum zeroing, mask summaries) and the mma.sync backward.
// Part of attention.cu (included there, in order; see its header comment).

// ------------------------------------------------------------------------------------------------
// Backward preprocess: D_i = rowsum(dO * O), zero dq_accum, per-64-row-tile mask summaries.
// ------------------------------------------------------------------------------------------------
#define BWD_BM 64
#define PRE_THREADS 256

template <int D>
__device__ __forceinline__ void attn_bwd_pre_impl(const bf16_t* __restrict__ o, const bf16_t* __restrict__ dout,
                                                  const int* __restrict__ fs, const int* __restrict__ fe,
                                                  const int* __restrict__ ss, const int* __restrict__ se,
                                                  float* __restrict__ Di, float* __restrict__ dq_accum,
                                                  int* __restrict__ summary, int Tq, int Hq) {
    // one block per (64-row query tile, head): one block per tile over all heads leaves the chip a block per SM
    // (memory-bound at a fraction of the bandwidth)
    __shared__ int sRed[8 * (PRE_THREADS / 32)];
    __shared__ int sSum[8];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int qt = blockIdx.x / Hq, h = blockIdx.x - qt * Hq;
    const int q0 = qt * BWD_BM;
    const int rows = min(BWD_BM, Tq - q0);
    constexpr int CH = D / 8;        // 16-byte chunks per (row, head); <= 32
    constexpr int PPW = 32 / CH;     // rows per warp step
    for (int r0 = warp * PPW; r0 < rows; r0 += (PRE_THREADS / 32) * PPW) {
        const int r = r0 + lane / CH;
        const bool ok = r < rows;
        const size_t p = (size_t)(q0 + r) * Hq + h;
        float acc = 0.f;
        if (ok) {
            uint4 a = *(const uint4*)(o + p * D + (lane % CH) * 8);
            uint4 b = *(const uint4*)(dout + p * D + (lane % CH) * 8);
            acc = bf_lo(a.x) * bf_lo(b.x) + bf_hi(a.x) * bf_hi(b.x) + bf_lo(a.y) * bf_lo(b.y) + bf_hi(a.y) * bf_hi(b.y) +
                  bf_lo(a.z) * bf_lo(b.z) + bf_hi(a.z) * bf_hi(b.z) + bf_lo(a.w) * bf_lo(b.w) + bf_hi(a.w) * bf_hi(b.w);
        }
#pragma unroll
        for (int off = CH / 2; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
        if (ok && (lane % CH) == 0) Di[p] = acc;
    }
    {  // this head's D columns of the tile's rows
        constexpr int C4 = D / 4;
        for (int i = tid; i < rows * C4; i += PRE_THREADS) {
            const int r = i / C4;
            ((float4*)(dq_accum + ((size_t)(q0 + r) * Hq + h) * D))[i - r * C4] = make_float4(0.f, 0.f, 0.f, 0.f);
        }
    }
    if (h != 0) return;  // (uniform over the block) the tile's mask summary, once
    int vals[8];
#pragma unroll
    for (int i = 0; i < 8; i++) vals[i] = ATTN_BIG;  // identity of min (threads without rows: no constraint)
    if (tid < BWD_BM) {
        int row = q0 + tid;
        bool valid = row < Tq;
        int4 iv = valid ? make_int4(fs[row], fe[row], ss[row], se[row]) : make_int4(0, 0, 0, 0);
        row_summary(valid, iv.x, iv.y, iv.z, iv.w, vals);
    }
    block_summary<PRE_THREADS / 32>(vals, sRed, sSum);
    if (tid < 8) summary[qt * 8 + tid] = sSum[tid];
}

// ------------------------------------------------------------------------------------------------
// Backward main: one CTA per (key tile of BN keys, kv head). Warp w owns 16 keys (slice w % KSL) and
// DW = D/DSPLIT columns of dK/dV; it computes S^T and dP^T for its keys against each visible query
// tile (64 rows) of each head of the group, accumulates dV += P^T dO and dK += dS^T Q in registers,
// and writes dS^T to smem; then the CTA computes dQ = dS K for the query tile (warp = 16 rows x
// DQW columns) and adds it to dq_accum with vector reductions.
// ------------------------------------------------------------------------------------------------
template <int D, int NW, int DSPLIT>
struct BwdCfg {
    static constexpr int THREADS = NW * 32;
    static constexpr int BM = BWD_BM;
    static constexpr int KSL = NW / DSPLIT;  // key slices of 16
    static constexpr int BN = KSL * 16;
    static constexpr int DW = D / DSPLIT;    // dK/dV columns per warp
    static constexpr int DQW = D / (NW / 4); // dQ columns per warp (4 row groups of 16)
    static constexpr int LD = D + 8;
    static constexpr int LDS = BM + 8;
    static constexpr int QC = BM / 16;       // query chunks
    static constexpr int LISTN = THREADS;
    static constexpr int SMEM = (2 * BN * LD + 4 * BM * LD + BN * LDS) * 2  // sK sV sQ[2] sdO[2] sdS
                                + 2 * BM * 4 * 2                            // sLse[2] sDi[2]
                                + 2 * BM * 16                               // sRow[2]
                                + KSL * 4 + LISTN * 4 + (NW + 1) * 4 + 16;
    static_assert(NW % 4 == 0 && BN <= 2 * BM, "bwd tile shape");
};

// One (query tile, head) step of the backward for one warp. FULL: every (row, key) pair of the
// tile pair is visible (no chunk skipping, no per-element checks).
template <bool FULL, int D, int NW, int DSPLIT>
__device__ __forceinline__ void attn_bwd_iter(float (&dka)[D / DSPLIT / 8][4], float (&dva)[D / DSPLIT / 8][4],
                                              u32 sKa, u32 sVa, u32 sQa, u32 sdOa, bf16_t* sdS, const float* lseS,
                                              const float* diS, const int4* rowiv, int* sVis,
                                              float* __restrict__ dq_accum, int q0, int h, int k0, int Tq, int Hq,
                                              float sl2) {
    using C = BwdCfg<D, NW, DSPLIT>;
    constexpr int BM = C::BM, LD = C::LD, LDS = C::LDS;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int ks = warp % C::KSL, dsi = warp / C::KSL;
    const int kw = ks * 16;                    // first local key of this warp
    const int rg = warp & 3, dsl = warp >> 2;  // dQ: row group, column slice
    const int a_row = lane & 15, a_col = (lane >> 4) * 8;
    const int b_row = (lane & 7) + ((lane >> 4) << 3), b_col = ((lane >> 3) & 1) * 8;
    const int t_row = (lane & 7) + (((lane >> 3) & 1) << 3), t_col = (lane >> 4) * 8;
    const u32 sdSa = smem_u32(sdS);

    // which 16-query chunks can see this warp's 16 keys?
    u32 qm = (1u << C::QC) - 1u;
    if (!FULL) {
        qm = 0;
        const int ka = k0 + kw, kb = ka + 16;
#pragma unroll
        for (int p = 0; p < C::QC / 2; p++) {
            const int4 iv = rowiv[32 * p + lane];
            const bool ov = overlaps(iv.x, iv.y, ka, kb) || overlaps(iv.z, iv.w, ka, kb);
            const u32 b = __ballot_sync(0xffffffffu, ov);
            if (b & 0xffffu) qm |= 1u << (2 * p);
            if (b >> 16) qm |= 1u << (2 * p + 1);
        }
        if (dsi == 0 && lane == 0) sVis[ks] = (int)qm;
    }

    if (qm != 0) {
        float sa[BM / 8][4], dp[BM / 8][4];
#pragma unroll
        for (int j = 0; j < BM / 8; j++)
#pragma unroll
            for (int x = 0; x < 4; x++) sa[j][x] = dp[j][x] = 0.f;
        // S^T = K_w Q^T, dP^T = V_w dO^T
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            u32 ak[4], av[4];
            ldsm_x4(sKa + 2 * ((kw + a_row) * LD + kk * 16 + a_col), ak[0], ak[1], ak[2], ak[3]);
            ldsm_x4(sVa + 2 * ((kw + a_row) * LD + kk * 16 + a_col), av[0], av[1], av[2], av[3]);
#pragma unroll
            for (int c = 0; c < C::QC; c++) {
                if (FULL || (qm & (1u << c))) {
                    u32 b0, b1, b2, b3;
                    ldsm_x4(sQa + 2 * ((c * 16 + b_row) * LD + kk * 16 + b_col), b0, b1, b2, b3);
                    mma16816(sa[2 * c], ak, b0, b1);
                    mma16816(sa[2 * c + 1], ak, b2, b3);
                    ldsm_x4(sdOa + 2 * ((c * 16 + b_row) * LD + kk * 16 + b_col), b0, b1, b2, b3);
                    mma16816(dp[2 * c], av, b0, b1);
                    mma16816(dp[2 * c + 1], av, b2, b3);
                }
            }
        }
        // P^T = exp(scale*S^T - lse), dS^T = P^T * (dP^T - Di)
#pragma unroll
        for (int j = 0; j < BM / 8; j++) {
            if (FULL || (qm & (1u << (j / 2)))) {
#pragma unroll
                for (int x = 0; x < 2; x++) {
                    const int qc = j * 8 + 2 * (lane & 3) + x;
                    const float nl = -lseS[qc] * ATTN_LOG2E;
                    const float di = diS[qc];
                    int4 iv = make_int4(0, 0, 0, 0);
                    if (!FULL) iv = rowiv[qc];
#pragma unroll
                    for (int i = 0; i < 2; i++) {
                        const int key = k0 + kw + (lane >> 2) + 8 * i;
                        const bool vis = FULL || in_iv(key, iv.x, iv.y) || in_iv(key, iv.z, iv.w);
                        const float p = vis ? ex2(fmaf(sa[j][2 * i + x], sl2, nl)) : 0.f;
                        sa[j][2 * i + x] = p;
                        dp[j][2 * i + x] = p * (dp[j][2 * i + x] - di);
                    }
                }
            }
        }
        // dV += P^T dO, dK += dS^T Q ; dS^T -> smem
#pragma unroll
        for (int c = 0; c < C::QC; c++) {
            if (FULL || (qm & (1u << c))) {
                u32 pa[4], da[4];
                pa[0] = pack_bf16(sa[2 * c][0], sa[2 * c][1]);
                pa[1] = pack_bf16(sa[2 * c][2], sa[2 * c][3]);
                pa[2] = pack_bf16(sa[2 * c + 1][0], sa[2 * c + 1][1]);
                pa[3] = pack_bf16(sa[2 * c + 1][2], sa[2 * c + 1][3]);
                da[0] = pack_bf16(dp[2 * c][0], dp[2 * c][1]);
                da[1] = pack_bf16(dp[2 * c][2], dp[2 * c][3]);
                da[2] = pack_bf16(dp[2 * c + 1][0], dp[2 * c + 1][1]);
                da[3] = pack_bf16(dp[2 * c + 1][2], dp[2 * c + 1][3]);
#pragma unroll
                for (int dpi = 0; dpi < C::DW / 16; dpi++) {
                    const int d = dsi * C::DW + dpi * 16;
                    u32 b0, b1, b2, b3;
                    ldsm_x4_t(sdOa + 2 * ((c * 16 + t_row) * LD + d + t_col), b0, b1, b2, b3);
                    mma16816(dva[2 * dpi], pa, b0, b1);
                    mma16816(dva[2 * dpi + 1], pa, b2, b3);
                    ldsm_x4_t(sQa + 2 * ((c * 16 + t_row) * LD + d + t_col), b0, b1, b2, b3);
                    mma16816(dka[2 * dpi], da, b0, b1);
                    mma16816(dka[2 * dpi + 1], da, b2, b3);
                }
                if (dsi == 0) {
                    const int r = kw + (lane >> 2), col = c * 16 + 2 * (lane & 3);
                    *(u32*)(sdS + r * LDS + col) = da[0];
                    *(u32*)(sdS + (r + 8) * LDS + col) = da[1];
                    *(u32*)(sdS + r * LDS + col + 8) = da[2];
                    *(u32*)(sdS + (r + 8) * LDS + col + 8) = da[3];
                }
            }
        }
    }
    __syncthreads();
    // dQ (this query tile, head h) += dS K over the visible key slices
    float dq[C::DQW / 8][4];
#pragma unroll
    for (int j = 0; j < C::DQW / 8; j++)
#pragma unroll
        for (int x = 0; x < 4; x++) dq[j][x] = 0.f;
    bool any = FULL;
#pragma unroll
    for (int kc = 0; kc < C::KSL; kc++) {
        if (FULL || (sVis[kc] & (1 << rg))) {
            any = true;
            u32 a[4];
            ldsm_x4_t(sdSa + 2 * ((kc * 16 + (lane & 7) + ((lane >> 4) << 3)) * LDS + rg * 16 + ((lane >> 3) & 1) * 8),
                      a[0], a[1], a[2], a[3]);
#pragma unroll
            for (int dpi = 0; dpi < C::DQW / 16; dpi++) {
                u32 b0, b1, b2, b3;
                ldsm_x4_t(sKa + 2 * ((kc * 16 + t_row) * LD + dsl * C::DQW + dpi * 16 + t_col), b0, b1, b2, b3);
                mma16816(dq[2 * dpi], a, b0, b1);
                mma16816(dq[2 * dpi + 1], a, b2, b3);
            }
        }
    }
    if (any) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int row = q0 + rg * 16 + (lane >> 2) + 8 * i;
            if (row < Tq) {
                float* dst = dq_accum + ((size_t)row * Hq + h) * D + dsl * C::DQW + 2 * (lane & 3);
#pragma unroll
                for (int j = 0; j < C::DQW / 8; j++) red_add_v2(dst + j * 8, dq[j][2 * i], dq[j][2 * i + 1]);
            }
        }
    }
}

template <int D, int NW, int DSPLIT>
__device__ __forceinline__ void attn_bwd_dkdv_impl(
    const bf16_t* __restrict__ q, const bf16_t* __restrict__ k, const bf16_t* __restrict__ v,
    const bf16_t* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ Di,
    const int* __restrict__ summary, const int* __restrict__ fs, const int* __restrict__ fe,
    const int* __restrict__ ss, const int* __restrict__ se, float* __restrict__ dq_accum, bf16_t* __restrict__ dk,
    bf16_t* __restrict__ dv, int Tq, int Tk, int Hq, int Hkv, float scale, int hgroup) {
    using C = BwdCfg<D, NW, DSPLIT>;
    constexpr int BM = C::BM, BN = C::BN, LD = C::LD, LDS = C::LDS;
    ATTN_DYN_SMEM;
    bf16_t* sK = (bf16_t*)smem;
    bf16_t* sV = sK + BN * LD;
    bf16_t* sQ = sV + BN * LD;       // [2][BM][LD]
    bf16_t* sdO = sQ + 2 * BM * LD;  // [2][BM][LD]
    bf16_t* sdS = sdO + 2 * BM * LD; // [BN][LDS]  (dS^T: key-major)
    float* sLse = (float*)(sdS + BN * LDS);  // [2][BM]
    float* sDi = sLse + 2 * BM;               // [2][BM]
    int4* sRow = (int4*)(sDi + 2 * BM);       // [2][BM]
    int* sVis = (int*)(sRow + 2 * BM);        // [KSL]
    int* sList = sVis + C::KSL;               // [LISTN]
    int* sCnt = sList + C::LISTN;             // [NW+1]

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int G = Hq / Hkv;
    const int bid = blockIdx.x;
    int kt, hk;
    bwd_tile_of(bid, Tk, BN, Hkv, hgroup, kt, hk);
    const int k0 = kt * BN;
    const int k1 = min(k0 + BN, Tk);
    const int nqt = (Tq + BM - 1) / BM;
    const size_t qstride = (size_t)Hq * D, kstride = (size_t)Hkv * D;
    const float sl2 = scale * ATTN_LOG2E;
    constexpr int DT = D / 8;
    constexpr int RPT = C::THREADS / DT;  // rows per loader pass
    static_assert(C::THREADS % DT == 0 && BM % RPT == 0 && BN % RPT == 0 && C::THREADS >= 3 * BM, "loader shape");
    const int lrow = tid / DT, lcol = (tid % DT) * 8;

    // K, V tile
    {
        const bf16_t* gk0 = k + (size_t)(k0 + lrow) * kstride + (size_t)hk * D + lcol;
        const bf16_t* gv0 = v + (size_t)(k0 + lrow) * kstride + (size_t)hk * D + lcol;
        const u32 sK0 = smem_u32(sK + lrow * LD + lcol), sV0 = smem_u32(sV + lrow * LD + lcol);
#pragma unroll
        for (int j = 0; j < BN / RPT; j++) {
            const bool ok = k0 + lrow + j * RPT < Tk;
            const size_t o = (size_t)j * RPT * kstride;
            cp_async16(sK0 + 2 * j * RPT * LD, ok ? gk0 + o : k, ok);
            cp_async16(sV0 + 2 * j * RPT * LD, ok ? gv0 + o : v, ok);
        }
    }
    cp_async_commit();

    float dka[C::DW / 8][4], dva[C::DW / 8][4];
#pragma unroll
    for (int j = 0; j < C::DW / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) dka[j][e] = dva[j][e] = 0.f;

    const u32 sKa = smem_u32(sK), sVa = smem_u32(sV);
    const u32 sQ0 = smem_u32(sQ + lrow * LD + lcol), sdO0 = smem_u32(sdO + lrow * LD + lcol);
    const size_t qstep = (size_t)RPT * qstride;

    // Each key tile walks its query-tile list from a different starting point, so that CTAs running
    // at the same time add into different dq_accum rows (fewer colliding atomics).
    int rot = 0, total = 1;
    auto list_at = [&](int it) {
        int li = it / G + rot;
        if (li >= total) li -= total;
        return sList[li];
    };
    auto load_stage = [&](int it, int st) {
        const int li = it / G;
        const int e = list_at(it);
        const int q0 = (e & 0x3fffffff) * BM;
        const int h = hk * G + (it - li * G);
        const size_t base = (size_t)(q0 + lrow) * qstride + (size_t)h * D + lcol;
#pragma unroll
        for (int j = 0; j < BM / RPT; j++) {
            const bool ok = q0 + lrow + j * RPT < Tq;
            const size_t o = base + j * qstep;
            cp_async16(sQ0 + 2 * (st * BM * LD + j * RPT * LD), ok ? q + o : q, ok);
            cp_async16(sdO0 + 2 * (st * BM * LD + j * RPT * LD), ok ? dout + o : dout, ok);
        }
        // per-row lse, Di and mask intervals: warp-uniform roles
        if (tid < 3 * BM) {
            const int r = tid % BM, role = tid / BM;
            const int row = q0 + r;
            const bool ok = row < Tq;
            const size_t rr = ok ? (size_t)row : 0;
            int* dRow = (int*)(sRow + st * BM + r);
            if (role == 0) {
                cp_async4(smem_u32(sLse + st * BM + r), lse + rr * Hq + h, ok);
                cp_async4(smem_u32(sDi + st * BM + r), Di + rr * Hq + h, ok);
            } else if (role == 1) {
                cp_async4(smem_u32(dRow + 0), fs + rr, ok);
                cp_async4(smem_u32(dRow + 1), fe + rr, ok);
            } else {
                cp_async4(smem_u32(dRow + 2), ss + rr, ok);
                cp_async4(smem_u32(dRow + 3), se + rr, ok);
            }
        }
    };

    for (int base = 0; base < nqt; base += C::LISTN) {
        // ---- list the query tiles of this chunk that can see key tile [k0, k1) ----
        int entry = -1;
        {
            const int qt = base + tid;
            if (qt < nqt) {
                const int4 s0 = *(const int4*)(summary + qt * 8);
                const int4 s1 = *(const int4*)(summary + qt * 8 + 4);
                bool vis = overlaps(s0.x, s0.y, k0, k1) || overlaps(s1.x, s1.y, k0, k1);
                bool full = (k0 >= s0.z && k0 + BN <= s0.w) || (k0 >= s1.z && k0 + BN <= s1.w);
                if (vis) entry = qt | (full ? 0 : 0x40000000);
            }
        }
        const u32 bal = __ballot_sync(0xffffffffu, entry >= 0);
        if (lane == 0) sCnt[warp] = __popc(bal);
        __syncthreads();
        int off = 0;
        total = 0;
        for (int w = 0; w < NW; w++) {
            int c = sCnt[w];
            off += (w < warp) ? c : 0;
            total += c;
        }
        if (entry >= 0) sList[off + __popc(bal & ((1u << lane) - 1u))] = entry;
        __syncthreads();
        const int nit = total * G;
        if (nit == 0) continue;
        rot = (int)(((unsigned)kt * 2654435761u) % (unsigned)total);

        load_stage(0, 0);
        cp_async_commit();
        for (int it = 0; it < nit; it++) {
            if (it + 1 < nit) {
                load_stage(it + 1, (it + 1) & 1);
                cp_async_commit();
                cp_async_wait<1>();
            } else {
                cp_async_wait<0>();
            }
            __syncthreads();
            const int st = it & 1;
            const int li = it / G;
            const int e = list_at(it);
            const int q0 = (e & 0x3fffffff) * BM;
            const int h = hk * G + (it - li * G);
            const u32 sQa = smem_u32(sQ + st * BM * LD), sdOa = smem_u32(sdO + st * BM * LD);
            if (e & 0x40000000)
                attn_bwd_iter<false, D, NW, DSPLIT>(dka, dva, sKa, sVa, sQa, sdOa, sdS, sLse + st * BM, sDi + st * BM,
                                                    sRow + st * BM, sVis, dq_accum, q0, h, k0, Tq, Hq, sl2);
            else
                attn_bwd_iter<true, D, NW, DSPLIT>(dka, dva, sKa, sVa, sQa, sdOa, sdS, sLse + st * BM, sDi + st * BM,
                                                   sRow + st * BM, sVis, dq_accum, q0, h, k0, Tq, Hq, sl2);
        }
        __syncthreads();
    }
    cp_async_wait<0>();
    __syncthreads();

    // ---- epilogue: dK (scaled) and dV through smem (sQ area holds 2*BM >= BN rows) --------------
    const int ks = warp % C::KSL, dsi = warp / C::KSL;
    const int kw = ks * 16;
#pragma unroll
    for (int pass = 0; pass < 2; pass++) {
        bf16_t* dst = pass == 0 ? dk : dv;
#pragma unroll
        for (int j = 0; j < C::DW / 8; j++) {
            const float* a = pass == 0 ? dka[j] : dva[j];
            const float f = pass == 0 ? scale : 1.f;
            const int r = kw + (lane >> 2), col = dsi * C::DW + j * 8 + 2 * (lane & 3);
            *(u32*)(sQ + r * LD + col) = pack_bf16(a[0] * f, a[1] * f);
            *(u32*)(sQ + (r + 8) * LD + col) = pack_bf16(a[2] * f, a[3] * f);
        }
        __syncthreads();
        bf16_t* g0 = dst + (size_t)(k0 + lrow) * kstride + (size_t)hk * D + lcol;
#pragma unroll
        for (int j = 0; j < BN / RPT; j++)
            if (k0 + lrow + j * RPT < Tk)
                *(uint4*)(g0 + (size_t)j * RPT * kstride) = *(const uint4*)(sQ + (lrow + j * RPT) * LD + lcol);
        __syncthreads();
    }
}


