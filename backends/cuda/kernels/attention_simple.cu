// A simple, correct block-sparse attention for the CUDA backend (v1; the tuned bf16 kernel
// replaces it behind the same AttentionOps). f32 throughout.
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

__device__ __forceinline__ float dot_lanes(const float* qr, const float* kj, int D, int lane) {
    float d = 0.f;
#pragma unroll
    for (int t = 0; t < MAXT; ++t) {
        const int c = lane + 32 * t;
        if (c < D) d += qr[t] * kj[c];
    }
    return warp_sum(d);
}

extern "C" __global__ void attn_fwd(const float* q, const float* k, const float* v,
                                    const int* f0, const int* f1, const int* s0, const int* s1,
                                    float* out, float* lse, int Tq, int Hq, int Hkv, int D,
                                    float scale) {
    const long long w = gtid() >> 5;
    const int lane = threadIdx.x & 31;
    if (w >= (long long)Tq * Hq) return;  // uniform per warp
    const int i = (int)(w / Hq), h = (int)(w - (long long)i * Hq);
    const int kh = h / (Hq / Hkv);
    const float* qi = q + w * D;
    float qr[MAXT], acc[MAXT];
#pragma unroll
    for (int t = 0; t < MAXT; ++t) {
        const int c = lane + 32 * t;
        qr[t] = c < D ? qi[c] : 0.f;
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
                if (c < D) acc[t] = acc[t] * corr + p * v[kvo + c];
            }
            m = mn;
        }
    }
    float* o = out + w * D;
    const bool empty = !(l > 0.f);
#pragma unroll
    for (int t = 0; t < MAXT; ++t) {
        const int c = lane + 32 * t;
        if (c < D) o[c] = empty ? 0.f : acc[t] / l;
    }
    if (lane == 0) lse[w] = empty ? -DF_INF : m + logf(l);
}

// Dsum (Tq*Hq) = rowwise dO . O
extern "C" __global__ void attn_bwd_dsum(const float* out, const float* dout, float* dsum,
                                         long long rows, int D) {
    const long long w = gtid() >> 5;
    const int lane = threadIdx.x & 31;
    if (w >= rows) return;
    float d = 0.f;
    for (int c = lane; c < D; c += 32) d += dout[w * D + c] * out[w * D + c];
    d = warp_sum(d);
    if (lane == 0) dsum[w] = d;
}

extern "C" __global__ void attn_bwd_dq(const float* q, const float* k, const float* v,
                                       const float* dout, const float* lse, const float* dsum,
                                       const int* f0, const int* f1, const int* s0,
                                       const int* s1, float* dq, int Tq, int Hq, int Hkv, int D,
                                       float scale) {
    const long long w = gtid() >> 5;
    const int lane = threadIdx.x & 31;
    if (w >= (long long)Tq * Hq) return;
    const int i = (int)(w / Hq), h = (int)(w - (long long)i * Hq);
    const int kh = h / (Hq / Hkv);
    float qr[MAXT], dor[MAXT], acc[MAXT];
#pragma unroll
    for (int t = 0; t < MAXT; ++t) {
        const int c = lane + 32 * t;
        qr[t] = c < D ? q[w * D + c] : 0.f;
        dor[t] = c < D ? dout[w * D + c] : 0.f;
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
                if (c < D) acc[t] += ds * k[kvo + c];
            }
        }
    }
#pragma unroll
    for (int t = 0; t < MAXT; ++t) {
        const int c = lane + 32 * t;
        if (c < D) dq[w * D + c] = acc[t];
    }
}

extern "C" __global__ void attn_bwd_dkdv(const float* q, const float* k, const float* v,
                                         const float* dout, const float* lse,
                                         const float* dsum, const int* key_off,
                                         const int* run_start, const int* run_end, float* dk,
                                         float* dv, int Tk, int Hq, int Hkv, int D,
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
        kr[t] = c < D ? k[w * D + c] : 0.f;
        vr[t] = c < D ? v[w * D + c] : 0.f;
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
                        dka[t] += ds * q[qo + c];
                        dva[t] += p * dout[qo + c];
                    }
                }
            }
        }
    }
#pragma unroll
    for (int t = 0; t < MAXT; ++t) {
        const int c = lane + 32 * t;
        if (c < D) {
            dk[w * D + c] = dka[t];
            dv[w * D + c] = dva[t];
        }
    }
}
