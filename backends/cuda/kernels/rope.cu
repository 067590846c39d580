// Rotary embedding, HF "rotate half" layout. One block per token: the block first builds the
// token's (cos, sin) table in shared memory with the angle p * theta^(-2i/D) evaluated in
// f64 and rounded to f32 (as the reference does: an f32 angle would be off by ~1e-3 rad at
// position 8192), then rotates every head. `sign` = -1 gives the backward (transpose).
// x and y are f32 or bf16 (rope_rotate_<y><x>, see common.cuh); the rotation is f32.
// Vectorised (vec.cuh) when D/2 % 8 == 0 and x, y are 16-byte aligned: a thread rotates 8
// pairs (i, i + D/2) of one head per step, 16-byte loads of both halves and of the table;
// otherwise one pair per step. The same f32 formula either way.

__device__ __forceinline__ void rope_pair(float x1, float x2, float c, float s, float& y1,
                                          float& y2) {
    y1 = x1 * c - x2 * s;
    y2 = x2 * c + x1 * s;
}

template <typename TY, typename TX>
__device__ __forceinline__ void rope_rotate_t(TY* y, const TX* x, const int* pos, int heads,
                                              int D, double theta, float sign) {
    extern __shared__ float tab[];  // cos [D/2] then sin [D/2]
    const int half = D / 2;
    const long long t = blockIdx.x;
    const double p = (double)pos[t];
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const double inv = pow(theta, -((double)(2 * i)) / (double)D);
        double s, c;
        sincos(p * inv, &s, &c);
        tab[i] = (float)c;
        tab[half + i] = (float)s;
    }
    __syncthreads();
    const long long base = t * (long long)heads * D;
    if ((half & 7) == 0 && df_al16(x) && df_al16(y)) {
        // D is a multiple of 16 here, so every head's halves start 16-byte aligned; the
        // table (dynamic shared memory, 16-byte aligned) too: half * 4 bytes is a multiple of 32.
        const int hv = half >> 3, n = heads * hv;
        for (int k = threadIdx.x; k < n; k += blockDim.x) {
            const int h = k / hv, i = (k - h * hv) * 8;
            const long long o = base + (long long)h * D + i;
            float x1[8], x2[8];
            df_ld8(x, o, x1);
            df_ld8(x, o + half, x2);
            const float4 c0 = *reinterpret_cast<const float4*>(tab + i);
            const float4 c1 = *reinterpret_cast<const float4*>(tab + i + 4);
            const float4 s0 = *reinterpret_cast<const float4*>(tab + half + i);
            const float4 s1 = *reinterpret_cast<const float4*>(tab + half + i + 4);
            const float cs[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
            const float sn[8] = {s0.x, s0.y, s0.z, s0.w, s1.x, s1.y, s1.z, s1.w};
            float y1[8], y2[8];
#pragma unroll
            for (int j = 0; j < 8; ++j) rope_pair(x1[j], x2[j], cs[j], sign * sn[j], y1[j], y2[j]);
            df_st8(y, o, y1);
            df_st8(y, o + half, y2);
        }
        return;
    }
    const int n = heads * half;
    for (int k = threadIdx.x; k < n; k += blockDim.x) {
        const int h = k / half, i = k - h * half;
        const long long o = base + (long long)h * D;
        float y1, y2;
        rope_pair(df_ld(x, o + i), df_ld(x, o + i + half), tab[i], sign * tab[half + i], y1, y2);
        df_st(y, o + i, y1);
        df_st(y, o + i + half, y2);
    }
}
#define DF_ROPE(Y, X)                                                                        \
    extern "C" __global__ void rope_rotate_##Y##X(DF_T_##Y* y, const DF_T_##X* x, const int* pos, \
                                                  int heads, int D, double theta, float sign) { \
        rope_rotate_t(y, x, pos, heads, D, theta, sign);                                     \
    }
DF_INST4(DF_ROPE)
