// RMSNorm over the last dim, f32 accumulation. One block per row for y and dx; dw is a
// deterministic two-pass column reduction (partials per row split, then summed in order).
// Activations (x, y, dy, dx) are f32 or bf16 (templated, see common.cuh; suffix letters:
// outputs first); w, rstd, dw and the partials are f32.

// y (R, C) = x * rstd * w, rstd (R) = 1 / sqrt(mean(x^2) + eps)   (rms_norm_fwd_<y><x>)
template <typename TY, typename TX>
__device__ __forceinline__ void rms_norm_fwd_t(TY* y, float* rstd, const TX* x, const float* w,
                                               int C, float eps) {
    __shared__ float sh[32];
    const long long row = blockIdx.x;
    const TX* xr = x + row * C;
    TY* yr = y + row * C;
    float ss = 0.f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        const float v = df_ld(xr, c);
        ss += v * v;
    }
    ss = block_sum(ss, sh);
    const float r = 1.0f / sqrtf(ss / (float)C + eps);
    for (int c = threadIdx.x; c < C; c += blockDim.x) df_st(yr, c, df_ld(xr, c) * r * w[c]);
    if (threadIdx.x == 0) rstd[row] = r;
}
#define DF_RMS_FWD(Y, X)                                                                     \
    extern "C" __global__ void rms_norm_fwd_##Y##X(DF_T_##Y* y, float* rstd, const DF_T_##X* x, \
                                                   const float* w, int C, float eps) {       \
        rms_norm_fwd_t(y, rstd, x, w, C, eps);                                               \
    }
DF_INST4(DF_RMS_FWD)

// dx = rstd * (dy * w - xhat * mean(dy * w * xhat)), xhat = x * rstd   (rms_norm_bwd_dx_<dx><dy><x>)
template <typename TD, typename TG, typename TX>
__device__ __forceinline__ void rms_norm_bwd_dx_t(TD* dx, const TG* dy, const TX* x,
                                                  const float* w, const float* rstd, int C) {
    __shared__ float sh[32];
    const long long row = blockIdx.x;
    const TX* xr = x + row * C;
    const TG* gr = dy + row * C;
    TD* dr = dx + row * C;
    const float r = rstd[row];
    float dot = 0.f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) dot += df_ld(gr, c) * w[c] * df_ld(xr, c);
    dot = block_sum(dot, sh) * r / (float)C;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        df_st(dr, c, r * (df_ld(gr, c) * w[c] - df_ld(xr, c) * r * dot));
}
#define DF_RMS_DX(D, G, X)                                                                   \
    extern "C" __global__ void rms_norm_bwd_dx_##D##G##X(DF_T_##D* dx, const DF_T_##G* dy,     \
                                                         const DF_T_##X* x, const float* w,    \
                                                         const float* rstd, int C) {         \
        rms_norm_bwd_dx_t(dx, dy, x, w, rstd, C);                                            \
    }
DF_INST8(DF_RMS_DX)

// Pass 1 of dw = sum_rows dy * x * rstd. Block (32, 8): 32 columns x 8 row lanes; grid
// (ceil(C/32), splits); split s covers rows [s*rps, min(R, (s+1)*rps)).
// (rms_norm_bwd_dw_partial_<dy><x>)
template <typename TG, typename TX>
__device__ __forceinline__ void rms_norm_bwd_dw_partial_t(float* partial, const TG* dy,
                                                          const TX* x, const float* rstd,
                                                          long long R, int C, long long rps) {
    __shared__ float sh[8][33];
    const int c = blockIdx.x * 32 + threadIdx.x;
    const long long r0 = (long long)blockIdx.y * rps;
    const long long r1 = min(R, r0 + rps);
    float acc = 0.f;
    if (c < C)
        for (long long r = r0 + threadIdx.y; r < r1; r += 8)
            acc += df_ld(dy, r * C + c) * df_ld(x, r * C + c) * rstd[r];
    sh[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float s = 0.f;
        for (int k = 0; k < 8; ++k) s += sh[k][threadIdx.x];
        partial[(long long)blockIdx.y * C + c] = s;
    }
}
#define DF_RMS_DW(G, X)                                                                      \
    extern "C" __global__ void rms_norm_bwd_dw_partial_##G##X(                                \
        float* partial, const DF_T_##G* dy, const DF_T_##X* x, const float* rstd, long long R, \
        int C, long long rps) {                                                              \
        rms_norm_bwd_dw_partial_t(partial, dy, x, rstd, R, C, rps);                          \
    }
DF_INST4(DF_RMS_DW)

// Pass 2: dw[c] = sum over splits, in order.
extern "C" __global__ void rms_norm_bwd_dw_final(float* dw, const float* partial, int splits,
                                                 int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float s = 0.f;
    for (int k = 0; k < splits; ++k) s += partial[(long long)k * C + c];
    dw[c] = s;
}
