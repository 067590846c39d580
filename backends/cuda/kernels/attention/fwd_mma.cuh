// attention/fwd_mma.cuh: the mma.sync forward (devices without wgmma).
// Part of attention.cu (included there, in order; see its header comment).

// ------------------------------------------------------------------------------------------------
// Forward
// ------------------------------------------------------------------------------------------------
// BM query rows per CTA (NW warps, MW = BM/NW rows per warp = MT m16 tiles), BN keys per step.
template <int D, int BM, int BN, int NW, bool QREG>
struct FwdCfg {
    static constexpr int BM_ = BM;
    static constexpr int THREADS = NW * 32;
    static constexpr int MW = BM / NW;
    static constexpr int MT = MW / 16;
    static constexpr int LD = D + 8;  // padded smem row (elements): conflict-free ldmatrix
    static constexpr int NT = BN / 8;
    static constexpr int DT = D / 8;
    static constexpr int KS = D / 16;
    static constexpr int SQ = BM * LD;
    static constexpr int SKV = BN * LD;
    static constexpr int SMEM = (SQ + 4 * SKV) * 2 + BM * 16 + NW * 8 * 4 + 8 * 4;
    static_assert(MW % 16 == 0 && BN % 16 == 0 && D % 16 == 0, "tile shape");
};

// One key tile of the forward pass for one warp (FULL: every row sees every key of the tile).
template <bool FULL, int D, int BM, int BN, int NW, bool QREG>
__device__ __forceinline__ void attn_fwd_tile(float (&o)[FwdCfg<D, BM, BN, NW, QREG>::MT][D / 8][4],
                                              float (&m)[FwdCfg<D, BM, BN, NW, QREG>::MT][2],
                                              float (&l)[FwdCfg<D, BM, BN, NW, QREG>::MT][2],
                                              const u32 (&qf)[QREG ? FwdCfg<D, BM, BN, NW, QREG>::MT : 1]
                                                             [QREG ? D / 16 : 1][4],
                                              u32 sQa, u32 sKa, u32 sVa, const int4* sRow, int rw, int k0,
                                              float sl2) {
    using C = FwdCfg<D, BM, BN, NW, QREG>;
    const int lane = threadIdx.x & 31;
    const int a_row = lane & 15, a_col = (lane >> 4) * 8;                             // A (row-major)
    const int b_row = (lane & 7) + ((lane >> 4) << 3), b_col = ((lane >> 3) & 1) * 8;  // B from [n][k]
    const int t_row = (lane & 7) + (((lane >> 3) & 1) << 3), t_col = (lane >> 4) * 8;  // B from [k][n] (trans)
    // which 16-key chunks can any row of this warp see?
    u32 cm = (1u << (BN / 16)) - 1u;
    if (!FULL) {
        cm = 0;
#pragma unroll
        for (int mt = 0; mt < C::MT; mt++)
#pragma unroll
            for (int i = 0; i < 2; i++) {
                int4 iv = sRow[rw + mt * 16 + (lane >> 2) + 8 * i];
#pragma unroll
                for (int c = 0; c < BN / 16; c++) {
                    int ka = k0 + c * 16, kb = ka + 16;
                    if (overlaps(iv.x, iv.y, ka, kb) || overlaps(iv.z, iv.w, ka, kb)) cm |= 1u << c;
                }
            }
#pragma unroll
        for (int o2 = 1; o2 < 32; o2 <<= 1) cm |= __shfl_xor_sync(0xffffffffu, cm, o2);
    }
    if (cm != 0) {
        float s[C::MT][C::NT][4];
#pragma unroll
        for (int mt = 0; mt < C::MT; mt++)
#pragma unroll
            for (int nt = 0; nt < C::NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[mt][nt][e] = 0.f;
        // S = Q K^T
#pragma unroll
        for (int kk = 0; kk < C::KS; kk++) {
            u32 a[C::MT][4];
#pragma unroll
            for (int mt = 0; mt < C::MT; mt++) {
                if (QREG) {
#pragma unroll
                    for (int e = 0; e < 4; e++) a[mt][e] = qf[QREG ? mt : 0][QREG ? kk : 0][e];
                } else {
                    ldsm_x4(sQa + 2 * ((rw + mt * 16 + a_row) * C::LD + kk * 16 + a_col), a[mt][0], a[mt][1],
                            a[mt][2], a[mt][3]);
                }
            }
#pragma unroll
            for (int np = 0; np < C::NT / 2; np++) {
                if (cm & (1u << np)) {
                    u32 b0, b1, b2, b3;
                    ldsm_x4(sKa + 2 * ((np * 16 + b_row) * C::LD + kk * 16 + b_col), b0, b1, b2, b3);
#pragma unroll
                    for (int mt = 0; mt < C::MT; mt++) {
                        mma16816(s[mt][2 * np], a[mt], b0, b1);
                        mma16816(s[mt][2 * np + 1], a[mt], b2, b3);
                    }
                }
            }
        }
        // mask (partial tiles only)
        if (!FULL) {
#pragma unroll
            for (int mt = 0; mt < C::MT; mt++)
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    int4 iv = sRow[rw + mt * 16 + (lane >> 2) + 8 * i];
#pragma unroll
                    for (int nt = 0; nt < C::NT; nt++)
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                            int key = k0 + nt * 8 + 2 * (lane & 3) + e;
                            if (!(in_iv(key, iv.x, iv.y) || in_iv(key, iv.z, iv.w))) s[mt][nt][2 * i + e] = ATTN_NEG_INF;
                        }
                }
        }
        // online softmax
#pragma unroll
        for (int mt = 0; mt < C::MT; mt++)
#pragma unroll
            for (int i = 0; i < 2; i++) {
                float mx = m[mt][i];
#pragma unroll
                for (int nt = 0; nt < C::NT; nt++) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * i], s[mt][nt][2 * i + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float base = (mx == ATTN_NEG_INF) ? 0.f : mx * sl2;
                const float alpha = ex2(m[mt][i] * sl2 - base);
                m[mt][i] = mx;
                float rs = 0.f;
#pragma unroll
                for (int nt = 0; nt < C::NT; nt++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        float p = ex2(fmaf(s[mt][nt][2 * i + e], sl2, -base));
                        s[mt][nt][2 * i + e] = p;
                        rs += p;
                    }
                l[mt][i] = l[mt][i] * alpha + rs;
#pragma unroll
                for (int dt = 0; dt < C::DT; dt++) {
                    o[mt][dt][2 * i] *= alpha;
                    o[mt][dt][2 * i + 1] *= alpha;
                }
            }
        // O += P V
#pragma unroll
        for (int kc = 0; kc < BN / 16; kc++) {
            if (cm & (1u << kc)) {
                u32 pa[C::MT][4];
#pragma unroll
                for (int mt = 0; mt < C::MT; mt++) {
                    pa[mt][0] = pack_bf16(s[mt][2 * kc][0], s[mt][2 * kc][1]);
                    pa[mt][1] = pack_bf16(s[mt][2 * kc][2], s[mt][2 * kc][3]);
                    pa[mt][2] = pack_bf16(s[mt][2 * kc + 1][0], s[mt][2 * kc + 1][1]);
                    pa[mt][3] = pack_bf16(s[mt][2 * kc + 1][2], s[mt][2 * kc + 1][3]);
                }
#pragma unroll
                for (int dp = 0; dp < C::DT / 2; dp++) {
                    u32 b0, b1, b2, b3;
                    ldsm_x4_t(sVa + 2 * ((kc * 16 + t_row) * C::LD + dp * 16 + t_col), b0, b1, b2, b3);
#pragma unroll
                    for (int mt = 0; mt < C::MT; mt++) {
                        mma16816(o[mt][2 * dp], pa[mt], b0, b1);
                        mma16816(o[mt][2 * dp + 1], pa[mt], b2, b3);
                    }
                }
            }
        }
    }
}

template <int D, int BM, int BN, int NW, bool QREG>
__device__ __forceinline__ void attn_fwd_impl(const bf16_t* __restrict__ q, const bf16_t* __restrict__ k,
                                              const bf16_t* __restrict__ v, const int* __restrict__ fs,
                                              const int* __restrict__ fe, const int* __restrict__ ss,
                                              const int* __restrict__ se, bf16_t* __restrict__ out,
                                              float* __restrict__ lse, int Tq, int Tk, int Hq, int Hkv,
                                              float scale, int hgroup) {
    using C = FwdCfg<D, BM, BN, NW, QREG>;
    ATTN_DYN_SMEM;
    bf16_t* sQ = (bf16_t*)smem;
    bf16_t* sK = sQ + C::SQ;         // [2][BN][LD]
    bf16_t* sV = sK + 2 * C::SKV;    // [2][BN][LD]
    int4* sRow = (int4*)(sV + 2 * C::SKV);
    int* sRed = (int*)(sRow + BM);
    int* sSum = sRed + NW * 8;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int nqt = (Tq + BM - 1) / BM;
    int qt, h;
    fwd_tile_of(blockIdx.x, nqt, Hq, Hkv, hgroup, qt, h);
    const int hk = h / (Hq / Hkv);
    const int q0 = qt * BM;
    const size_t qstride = (size_t)Hq * D, kstride = (size_t)Hkv * D;
    const float sl2 = scale * ATTN_LOG2E;

    // ---- per-tile mask summary --------------------------------------------------------------
    tile_summary<NW, BM, C::THREADS>(tid, q0, Tq, fs, fe, ss, se, sRow, sRed, sSum);
    const int flo1 = sSum[2], fhi1 = sSum[3], flo2 = sSum[6], fhi2 = sSum[7];
    int a1, b1, a2, b2;  // key-tile index ranges [a, b)
    visited_key_tiles<BN>(sSum, a1, b1, a2, b2);
    const int n1 = max(b1 - a1, 0), n2 = max(b2 - a2, 0), n = n1 + n2;

    const int rw = warp * C::MW;  // first row of this warp inside the tile

    if (n == 0) {  // no visible key for any row: out 0, lse -inf
        for (int i = tid; i < BM * C::DT; i += C::THREADS) {
            int r = i / C::DT, c = i % C::DT;
            if (q0 + r < Tq) *(uint4*)(out + (size_t)(q0 + r) * qstride + (size_t)h * D + c * 8) = make_uint4(0, 0, 0, 0);
        }
        for (int r = tid; r < BM; r += C::THREADS)
            if (q0 + r < Tq) lse[(size_t)(q0 + r) * Hq + h] = ATTN_NEG_INF;
        return;
    }

    auto tile_of = [&](int t) { return t < n1 ? a1 + t : a2 + (t - n1); };
    // Loaders: thread tid always copies 16-byte column chunk lcol of rows lrow + j*RPT, so all
    // address arithmetic is one base pointer / smem offset plus compile-time steps.
    constexpr int RPT = C::THREADS / C::DT;  // rows per pass
    static_assert(C::THREADS % C::DT == 0 && BN % RPT == 0 && BM % RPT == 0, "loader shape");
    const int lrow = tid / C::DT, lcol = (tid % C::DT) * 8;
    const u32 sK0 = smem_u32(sK + lrow * C::LD + lcol), sV0 = smem_u32(sV + lrow * C::LD + lcol);
    const bf16_t* gk0 = k + (size_t)lrow * kstride + (size_t)hk * D + lcol;
    const bf16_t* gv0 = v + (size_t)lrow * kstride + (size_t)hk * D + lcol;
    const size_t kstep = (size_t)RPT * kstride;
    auto load_kv = [&](int kt, int st) {
        const int kr = kt * BN + lrow;
        const size_t off = (size_t)kt * BN * kstride;
#pragma unroll
        for (int j = 0; j < BN / RPT; j++) {
            const bool ok = kr + j * RPT < Tk;
            const size_t o2 = off + j * kstep;
            cp_async16(sK0 + 2 * (st * C::SKV + j * RPT * C::LD), ok ? gk0 + o2 : k, ok);
            cp_async16(sV0 + 2 * (st * C::SKV + j * RPT * C::LD), ok ? gv0 + o2 : v, ok);
        }
    };
    // Q tile
    {
        const u32 sQ0 = smem_u32(sQ + lrow * C::LD + lcol);
        const bf16_t* gq0 = q + (size_t)(q0 + lrow) * qstride + (size_t)h * D + lcol;
#pragma unroll
        for (int j = 0; j < BM / RPT; j++) {
            const bool ok = q0 + lrow + j * RPT < Tq;
            cp_async16(sQ0 + 2 * j * RPT * C::LD, ok ? gq0 + (size_t)j * RPT * qstride : q, ok);
        }
    }
    load_kv(tile_of(0), 0);
    cp_async_commit();

    float o[C::MT][C::DT][4];
    float m[C::MT][2], l[C::MT][2];
#pragma unroll
    for (int mt = 0; mt < C::MT; mt++) {
#pragma unroll
        for (int dt = 0; dt < C::DT; dt++)
#pragma unroll
            for (int e = 0; e < 4; e++) o[mt][dt][e] = 0.f;
        m[mt][0] = m[mt][1] = ATTN_NEG_INF;
        l[mt][0] = l[mt][1] = 0.f;
    }
    u32 qf[QREG ? C::MT : 1][QREG ? C::KS : 1][4];

    const u32 sQa = smem_u32(sQ);
    const int a_row = lane & 15, a_col = (lane >> 4) * 8;  // ldmatrix A-operand lane offsets

    for (int t = 0; t < n; t++) {
        if (t + 1 < n) {
            load_kv(tile_of(t + 1), (t + 1) & 1);
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const int st = t & 1;
        const int kt = tile_of(t);
        const int k0 = kt * BN;
        const bool full = (k0 >= flo1 && k0 + BN <= fhi1) || (k0 >= flo2 && k0 + BN <= fhi2);
        if (QREG && t == 0) {
#pragma unroll
            for (int mt = 0; mt < C::MT; mt++)
#pragma unroll
                for (int kk = 0; kk < C::KS; kk++)
                    ldsm_x4(sQa + 2 * ((rw + mt * 16 + a_row) * C::LD + kk * 16 + a_col), qf[mt][kk][0],
                            qf[mt][kk][1], qf[mt][kk][2], qf[mt][kk][3]);
        }
        const u32 sKa = smem_u32(sK + st * C::SKV), sVa = smem_u32(sV + st * C::SKV);
        if (full)
            attn_fwd_tile<true, D, BM, BN, NW, QREG>(o, m, l, qf, sQa, sKa, sVa, sRow, rw, k0, sl2);
        else
            attn_fwd_tile<false, D, BM, BN, NW, QREG>(o, m, l, qf, sQa, sKa, sVa, sRow, rw, k0, sl2);
        __syncthreads();
    }

    // ---- epilogue: normalise, write lse, stage O through smem for 16-byte stores -----------------
#pragma unroll
    for (int mt = 0; mt < C::MT; mt++)
#pragma unroll
        for (int i = 0; i < 2; i++) {
            float ls = l[mt][i];
            ls += __shfl_xor_sync(0xffffffffu, ls, 1);
            ls += __shfl_xor_sync(0xffffffffu, ls, 2);
            const float inv = ls != 0.f ? 1.f / ls : 0.f;  // NaN stays NaN (NaN policy)
            const int r = rw + mt * 16 + (lane >> 2) + 8 * i;
            if ((lane & 3) == 0 && q0 + r < Tq)
                lse[(size_t)(q0 + r) * Hq + h] = ls != 0.f ? (m[mt][i] * sl2 + __log2f(ls)) * ATTN_LN2 : ATTN_NEG_INF;
#pragma unroll
            for (int dt = 0; dt < C::DT; dt++) {
                *(u32*)(sQ + r * C::LD + dt * 8 + 2 * (lane & 3)) =
                    pack_bf16(attn_normalised(o[mt][dt][2 * i], inv, ls),
                              attn_normalised(o[mt][dt][2 * i + 1], inv, ls));
            }
        }
    __syncthreads();
    {
        bf16_t* go0 = out + (size_t)(q0 + lrow) * qstride + (size_t)h * D + lcol;
#pragma unroll
        for (int j = 0; j < BM / RPT; j++)
            if (q0 + lrow + j * RPT < Tq)
                *(uint4*)(go0 + (size_t)j * RPT * qstride) = *(const uint4*)(sQ + (lrow + j * RPT) * C::LD + lcol);
    }
}

