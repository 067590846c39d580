// Rotary embedding, HF "rotate half" layout. One block per token: the block first builds the
// token's (cos, sin) table in shared memory with the angle p * theta^(-2i/D) evaluated in
// f64 and rounded to f32 (as the reference does: an f32 angle would be off by ~1e-3 rad at
// position 8192), then rotates every head. `sign` = -1 gives the backward (transpose).
// x and y are f32 or bf16 (rope_rotate_<y><x>, see common.cuh); the rotation is f32.
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
    const int n = heads * half;
    for (int k = threadIdx.x; k < n; k += blockDim.x) {
        const int h = k / half, i = k - h * half;
        const long long o = base + (long long)h * D;
        const float c = tab[i], s = sign * tab[half + i];
        const float x1 = df_ld(x, o + i), x2 = df_ld(x, o + i + half);
        df_st(y, o + i, x1 * c - x2 * s);
        df_st(y, o + i + half, x2 * c + x1 * s);
    }
}
#define DF_ROPE(Y, X)                                                                        \
    extern "C" __global__ void rope_rotate_##Y##X(DF_T_##Y* y, const DF_T_##X* x, const int* pos, \
                                                  int heads, int D, double theta, float sign) { \
        rope_rotate_t(y, x, pos, heads, D, theta, sign);                                     \
    }
DF_INST4(DF_ROPE)
