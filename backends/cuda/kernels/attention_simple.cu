// A simple, correct block-sparse attention for the CUDA backend (v1; the tuned bf16 kernel
// replaces it behind the same AttentionOps). f32 math throughout; q/k/v/out/dout and
// out/dq/dk/dv are f32 or bf16 (templated, see common.cuh): attn_fwd_<out><in>,
// attn_bwd_dsum_<in>, attn_bwd_dq_<dq><in>, attn_bwd_dkdv_<dk,dv><in>, where the inputs of
// one call share a type (the Rust side widens a mixed call's bf16 inputs). lse and Dsum f32.
//
// Layouts: q (Tq, Hq, D), k/v (Tk, Hkv, D), out (Tq, Hq, D), lse (Tq, Hq); query head h uses
// kv head h / (Hq / Hkv). The mask is per query row at most two key intervals
// [f0, f1) and [s0, s1) (four i32 arrays of length Tq).
//
// Forward: one warp per (query row, head), walking the row's intervals with an online
// softmax; lane l holds elements l, l+32, ... of the head (D <= 32 * MAXT = 256).
// Backward, atomics-free and deterministic:
//   attn_bwd_dsum: Dsum (Tq, Hq) = dO . O
//   attn_bwd_dq:   one warp per (query row, head) walks its intervals (like the forward)
//   attn_bwd_dkdv: one warp per (key row, kv head) walks the query rows that see that key,
//                  given as runs of consecutive rows in a CSR built on the host
//                  (key_off (Tk + 1), run_start / run_end), and the group's query heads.

#define MAXT 8

template <typename T>
__device__ __forceinline__ float dot_lanes(const float* qr, const T* kj, int D, int lane) {
    float d = 0.f;
#pragma unroll
    for (int t = 0; t < MAXT; ++t) {
        const int c = lane + 32 * t;
        if (c < D) d += qr[t] * df_ld(kj, c);
    }
    return warp_sum(d);
}

template <typename TO, typename TI>
__device__ __forceinline__ void attn_fwd_t(const TI* q, const TI* k, const TI* v,
                                           const int* f0, const int* f1, const int* s0,
                                           const int* s1, TO* out, float* lse, int Tq, int Hq,
                                           int Hkv, int D, float scale) {
    const long long w = gtid() >> 5;
    const int lane = threadIdx.x & 31;
    if (w >= (long long)Tq * Hq) return;  // uniform per warp
    const int i = (int)(w / Hq), h = (int)(w - (long long)i * Hq);
    const int kh = h / (Hq / Hkv);
    const TI* qi = q + w * D;
    float qr[MAXT], acc[MAXT];
#pragma unroll
    for (int t = 0; t < MAXT; ++t) {
        const int c = lane + 32 * t;
        qr[t] = c < D ? df_ld(qi, c) : 0.f;
        acc[t] = 0.f;
    }
    float m = -DF_INF, l = 0.f;
    for (int iv = 0; iv < 2; ++iv) {
        const int st = iv ? s0[i] : f0[i], en = iv ? s1[i] : f1[i];
        for (int j = st; j < en; ++j) {
            const long long kvo = ((long long)j * Hkv + kh) * D;
            const float s = dot_lanes(qr, k + kvo, D, lane) * scale;
            const float mn = fmaxf(m, s);
            const float corr = expf(m - mn);  // 0 on the first key (m = -inf)
            const float p = expf(s - mn);
            l = l * corr + p;
#pragma unroll
            for (int t = 0; t < MAXT; ++t) {
                const int c = lane + 32 * t;
                if (c < D) acc[t] = acc[t] * corr + p * df_ld(v, kvo + c);
            }
            m = mn;
        }
    }
    TO* o = out + w * D;
    // Only a row that sees no key has l == 0 (the first key adds exp(0) = 1); a NaN score
    // makes l NaN, and NaN must come out (the NaN policy), not the empty row's 0.
    const bool empty = l == 0.f;
#pragma unroll
    for (int t = 0; t < MAXT; ++t) {
        const int c = lane + 32 * t;
        if (c < D) df_st(o, c, empty ? 0.f : acc[t] / l);
    }
    if (lane == 0) lse[w] = empty ? -DF_INF : m + logf(l);
}
#define DF_ATTN_FWD(O, I)                                                                    \
    extern "C" __global__ void attn_fwd_##O##I(                                               \
        const DF_T_##I* q, const DF_T_##I* k, const DF_T_##I* v, const int* f0, const int* f1, \
        const int* s0, const int* s1, DF_T_##O* out, float* lse, int Tq, int Hq, int Hkv,     \
        int D, float scale) {                                                                \
        attn_fwd_t(q, k, v, f0, f1, s0, s1, out, lse, Tq, Hq, Hkv, D, scale);                \
    }
DF_INST4(DF_ATTN_FWD)

// Dsum (Tq*Hq) = rowwise dO . O
template <typename TI>
__device__ __forceinline__ void attn_bwd_dsum_t(const TI* out, const TI* dout, float* dsum,
                                                long long rows, int D) {
    const long long w = gtid() >> 5;
    const int lane = threadIdx.x & 31;
    if (w >= rows) return;
    float d = 0.f;
    for (int c = lane; c < D; c += 32) d += df_ld(dout, w * D + c) * df_ld(out, w * D + c);
    d = warp_sum(d);
    if (lane == 0) dsum[w] = d;
}
#define DF_ATTN_DSUM(I)                                                                      \
    extern "C" __global__ void attn_bwd_dsum_##I(const DF_T_##I* out, const DF_T_##I* dout,   \
                                                 float* dsum, long long rows, int D) {       \
        attn_bwd_dsum_t(out, dout, dsum, rows, D);                                           \
    }
DF_INST2(DF_ATTN_DSUM)

template <typename TO, typename TI>
__device__ __forceinline__ void attn_bwd_dq_t(const TI* q, const TI* k, const TI* v,
                                              const TI* dout, const float* lse,
                                              const float* dsum, const int* f0, const int* f1,
                                              const int* s0, const int* s1, TO* dq, int Tq,
                                              int Hq, int Hkv, int D, float scale) {
    const long long w = gtid() >> 5;
    const int lane = threadIdx.x & 31;
    if (w >= (long long)Tq * Hq) return;
    const int i = (int)(w / Hq), h = (int)(w - (long long)i * Hq);
    const int kh = h / (Hq / Hkv);
    float qr[MAXT], dor[MAXT], acc[MAXT];
#pragma unroll
    for (int t = 0; t < MAXT; ++t) {
        const int c = lane + 32 * t;
        qr[t] = c < D ? df_ld(q, w * D + c) : 0.f;
        dor[t] = c < D ? df_ld(dout, w * D + c) : 0.f;
        acc[t] = 0.f;
    }
    const float L = lse[w], Di = dsum[w];
    for (int iv = 0; iv < 2; ++iv) {
        const int st = iv ? s0[i] : f0[i], en = iv ? s1[i] : f1[i];
        for (int j = st; j < en; ++j) {
            const long long kvo = ((long long)j * Hkv + kh) * D;
            const float s = dot_lanes(qr, k + kvo, D, lane) * scale;
            const float p = expf(s - L);
            const float dp = dot_lanes(dor, v + kvo, D, lane);
            const float ds = p * (dp - Di) * scale;
#pragma unroll
            for (int t = 0; t < MAXT; ++t) {
                const int c = lane + 32 * t;
                if (c < D) acc[t] += ds * df_ld(k, kvo + c);
            }
        }
    }
#pragma unroll
    for (int t = 0; t < MAXT; ++t) {
        const int c = lane + 32 * t;
        if (c < D) df_st(dq, w * D + c, acc[t]);
    }
}
#define DF_ATTN_DQ(O, I)                                                                     \
    extern "C" __global__ void attn_bwd_dq_##O##I(                                            \
        const DF_T_##I* q, const DF_T_##I* k, const DF_T_##I* v, const DF_T_##I* dout,        \
        const float* lse, const float* dsum, const int* f0, const int* f1, const int* s0,     \
        const int* s1, DF_T_##O* dq, int Tq, int Hq, int Hkv, int D, float scale) {           \
        attn_bwd_dq_t(q, k, v, dout, lse, dsum, f0, f1, s0, s1, dq, Tq, Hq, Hkv, D, scale);  \
    }
DF_INST4(DF_ATTN_DQ)

template <typename TO, typename TI>
__device__ __forceinline__ void attn_bwd_dkdv_t(const TI* q, const TI* k, const TI* v,
                                                const TI* dout, const float* lse,
                                                const float* dsum, const int* key_off,
                                                const int* run_start, const int* run_end,
                                                TO* dk, TO* dv, int Tk, int Hq, int Hkv, int D,
                                                float scale) {
    const long long w = gtid() >> 5;
    const int lane = threadIdx.x & 31;
    if (w >= (long long)Tk * Hkv) return;
    const int j = (int)(w / Hkv), kh = (int)(w - (long long)j * Hkv);
    const int group = Hq / Hkv;
    float kr[MAXT], vr[MAXT], dka[MAXT], dva[MAXT];
#pragma unroll
    for (int t = 0; t < MAXT; ++t) {
        const int c = lane + 32 * t;
        kr[t] = c < D ? df_ld(k, w * D + c) : 0.f;
        vr[t] = c < D ? df_ld(v, w * D + c) : 0.f;
        dka[t] = 0.f;
        dva[t] = 0.f;
    }
    for (int r = key_off[j]; r < key_off[j + 1]; ++r) {
        for (int i = run_start[r]; i < run_end[r]; ++i) {
            for (int h = kh * group; h < (kh + 1) * group; ++h) {
                const long long qo = ((long long)i * Hq + h) * D;
                const float s = dot_lanes(kr, q + qo, D, lane) * scale;
                const float p = expf(s - lse[(long long)i * Hq + h]);
                const float dp = dot_lanes(vr, dout + qo, D, lane);
                const float ds = p * (dp - dsum[(long long)i * Hq + h]) * scale;
#pragma unroll
                for (int t = 0; t < MAXT; ++t) {
                    const int c = lane + 32 * t;
                    if (c < D) {
                        dka[t] += ds * df_ld(q, qo + c);
                        dva[t] += p * df_ld(dout, qo + c);
                    }
                }
            }
        }
    }
#pragma unroll
    for (int t = 0; t < MAXT; ++t) {
        const int c = lane + 32 * t;
        if (c < D) {
            df_st(dk, w * D + c, dka[t]);
            df_st(dv, w * D + c, dva[t]);
        }
    }
}
#define DF_ATTN_DKDV(O, I)                                                                   \
    extern "C" __global__ void attn_bwd_dkdv_##O##I(                                          \
        const DF_T_##I* q, const DF_T_##I* k, const DF_T_##I* v, const DF_T_##I* dout,        \
        const float* lse, const float* dsum, const int* key_off, const int* run_start,        \
        const int* run_end, DF_T_##O* dk, DF_T_##O* dv, int Tk, int Hq, int Hkv, int D,       \
        float scale) {                                                                       \
        attn_bwd_dkdv_t(q, k, v, dout, lse, dsum, key_off, run_start, run_end, dk, dv, Tk, Hq, \
                        Hkv, D, scale);                                                      \
    }
DF_INST4(DF_ATTN_DKDV)
