// RMSNorm over the last dim, f32 accumulation. Activations (x, y, dy, dx) are f32 or bf16
// (templated, see common.cuh; suffix letters: outputs first); w, rstd, dw and the partials are
// f32.
//
// y and dx: a *group* of G threads per row. G <= 32 (a power of two): blockDim.x / G rows per
// block, sums by xor shuffles inside the group (short rows: the per-head QK-norm, C = 128, runs
// 4 lanes per row); G = blockDim.x > 32 (a warp multiple, <= 512): one row per block, block_sum. The
// host picks G from C alone (`norm_group` in norm.rs), so the summation order, hence every
// result, depends on the shape only. Vector path (vec.cuh) when C % 8 == 0, x / y / dy / dx / w
// are 16-byte aligned and the row fits in registers (C <= G * 8 * DF_NORM_NV): lane l holds
// the 8-element vectors l, l + G, ... of its row, so the row is read from memory once; else
// the scalar path (strided by G, re-reading the row for the second pass). The same f32 formula
// per element either way. dw is a deterministic two-pass column reduction (partials per row
// split, then summed in order).

#define DF_NORM_NV 4  // 8-element vectors per thread and row on the vector path

// Sum over the group of G lanes (see above), returned to every lane of the group. Every
// thread of the block must call it (G is uniform; inactive rows contribute 0).
__device__ __forceinline__ float group_sum(float v, int G, float* sh) {
    if (G <= 32) {
        for (int o = G >> 1; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        return v;
    }
    return block_sum(v, sh);
}

// (lane in the group, row) of this thread.
__device__ __forceinline__ void group_row(int G, int& lane, long long& row) {
    if (G <= 32) {
        lane = threadIdx.x & (G - 1);
        row = (long long)blockIdx.x * (blockDim.x / G) + threadIdx.x / G;
    } else {
        lane = threadIdx.x;
        row = blockIdx.x;
    }
}

// y (R, C) = x * rstd * w, rstd (R) = 1 / sqrt(mean(x^2) + eps)   (rms_norm_fwd_<y><x>)
template <typename TY, typename TX>
__device__ __forceinline__ void rms_norm_fwd_t(TY* y, float* rstd, const TX* x, const float* w,
                                               long long R, int C, float eps, int G) {
    __shared__ float sh[32];
    int lane;
    long long row;
    group_row(G, lane, row);
    const bool live = row < R;
    const TX* xr = x + (live ? row : 0) * C;
    TY* yr = y + (live ? row : 0) * C;
    float ss = 0.f;
    if ((C & 7) == 0 && C <= G * 8 * DF_NORM_NV && df_al16(x) && df_al16(y) && df_al16(w)) {
        float v[DF_NORM_NV][8];
#pragma unroll
        for (int k = 0; k < DF_NORM_NV; ++k) {
            const int c = (k * G + lane) * 8;
            if (live && c < C) {
                df_ld8(xr, c, v[k]);
#pragma unroll
                for (int j = 0; j < 8; ++j) ss += v[k][j] * v[k][j];
            }
        }
        ss = group_sum(ss, G, sh);
        const float r = 1.0f / sqrtf(ss / (float)C + eps);
#pragma unroll
        for (int k = 0; k < DF_NORM_NV; ++k) {
            const int c = (k * G + lane) * 8;
            if (live && c < C) {
                float wv[8];
                df_ld8(w, c, wv);
#pragma unroll
                for (int j = 0; j < 8; ++j) v[k][j] = v[k][j] * r * wv[j];
                df_st8(yr, c, v[k]);
            }
        }
        if (live && lane == 0) rstd[row] = r;
        return;
    }
    if (live)
        for (int c = lane; c < C; c += G) {
            const float v = df_ld(xr, c);
            ss += v * v;
        }
    ss = group_sum(ss, G, sh);
    const float r = 1.0f / sqrtf(ss / (float)C + eps);
    if (!live) return;
    for (int c = lane; c < C; c += G) df_st(yr, c, df_ld(xr, c) * r * w[c]);
    if (lane == 0) rstd[row] = r;
}
#define DF_RMS_FWD(Y, X)                                                                     \
    extern "C" __global__ void __launch_bounds__(512) rms_norm_fwd_##Y##X(DF_T_##Y* y, float* rstd, const DF_T_##X* x, \
                                                   const float* w, long long R, int C,       \
                                                   float eps, int G) {                       \
        rms_norm_fwd_t(y, rstd, x, w, R, C, eps, G);                                         \
    }
DF_INST4(DF_RMS_FWD)

// dx = rstd * (dy * w - xhat * mean(dy * w * xhat)), xhat = x * rstd   (rms_norm_bwd_dx_<dx><dy><x>)
template <typename TD, typename TG, typename TX>
__device__ __forceinline__ void rms_norm_bwd_dx_t(TD* dx, const TG* dy, const TX* x,
                                                  const float* w, const float* rstd,
                                                  long long R, int C, int G) {
    __shared__ float sh[32];
    int lane;
    long long row;
    group_row(G, lane, row);
    const bool live = row < R;
    const long long off = (live ? row : 0) * C;
    const TX* xr = x + off;
    const TG* gr = dy + off;
    TD* dr = dx + off;
    const float r = live ? rstd[row] : 0.f;
    float dot = 0.f;
    if ((C & 7) == 0 && C <= G * 8 * DF_NORM_NV && df_al16(dx) && df_al16(dy) && df_al16(x) &&
        df_al16(w)) {
        float gw[DF_NORM_NV][8], xv[DF_NORM_NV][8];  // dy * w, x
#pragma unroll
        for (int k = 0; k < DF_NORM_NV; ++k) {
            const int c = (k * G + lane) * 8;
            if (live && c < C) {
                float wv[8];
                df_ld8(gr, c, gw[k]);
                df_ld8(xr, c, xv[k]);
                df_ld8(w, c, wv);
#pragma unroll
                for (int j = 0; j < 8; ++j) {
                    gw[k][j] *= wv[j];
                    dot += gw[k][j] * xv[k][j];
                }
            }
        }
        dot = group_sum(dot, G, sh) * r / (float)C;
#pragma unroll
        for (int k = 0; k < DF_NORM_NV; ++k) {
            const int c = (k * G + lane) * 8;
            if (live && c < C) {
#pragma unroll
                for (int j = 0; j < 8; ++j) gw[k][j] = r * (gw[k][j] - xv[k][j] * r * dot);
                df_st8(dr, c, gw[k]);
            }
        }
        return;
    }
    if (live)
        for (int c = lane; c < C; c += G) dot += df_ld(gr, c) * w[c] * df_ld(xr, c);
    dot = group_sum(dot, G, sh) * r / (float)C;
    if (!live) return;
    for (int c = lane; c < C; c += G)
        df_st(dr, c, r * (df_ld(gr, c) * w[c] - df_ld(xr, c) * r * dot));
}
#define DF_RMS_DX(D, G, X)                                                                   \
    extern "C" __global__ void __launch_bounds__(512) rms_norm_bwd_dx_##D##G##X(DF_T_##D* dx, const DF_T_##G* dy,     \
                                                         const DF_T_##X* x, const float* w,    \
                                                         const float* rstd, long long R, int C, \
                                                         int G_) {                           \
        rms_norm_bwd_dx_t(dx, dy, x, w, rstd, R, C, G_);                                     \
    }
DF_INST8(DF_RMS_DX)

// Pass 1 of dw = sum_rows dy * x * rstd. Block (32, 8) covers 256 columns x 8 row lanes; grid
// (ceil(C/256), splits); split s covers rows [s*rps, min(R, (s+1)*rps)). Each thread sums 8
// columns: vectorised (columns c0 + 8*tx .. +8, 16-byte loads) when C % 8 == 0 and dy, x are
// 16-byte aligned, else columns c0 + tx + 32*j (coalesced scalar loads). Either way the sum of
// a column runs over rows r0 + ty, r0 + ty + 8, ... per row lane, then over the 8 lanes in
// order. (rms_norm_bwd_dw_partial_<dy><x>)
template <typename TG, typename TX>
__device__ __forceinline__ void rms_norm_bwd_dw_partial_t(float* partial, const TG* dy,
                                                          const TX* x, const float* rstd,
                                                          long long R, int C, long long rps) {
    __shared__ float sh[8][257];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int c0 = blockIdx.x * 256;
    const long long r0 = (long long)blockIdx.y * rps;
    const long long r1 = min(R, r0 + rps);
    float acc[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[j] = 0.f;
    if ((C & 7) == 0 && df_al16(dy) && df_al16(x)) {
        const int c = c0 + 8 * tx;
        if (c < C)
            for (long long r = r0 + ty; r < r1; r += 8) {
                float g[8], xv[8];
                df_ld8(dy, r * C + c, g);
                df_ld8(x, r * C + c, xv);
                const float rs = rstd[r];
#pragma unroll
                for (int j = 0; j < 8; ++j) acc[j] += g[j] * xv[j] * rs;
            }
#pragma unroll
        for (int j = 0; j < 8; ++j) sh[ty][8 * tx + j] = acc[j];
    } else {
        for (long long r = r0 + ty; r < r1; r += 8) {
            const float rs = rstd[r];
#pragma unroll
            for (int j = 0; j < 8; ++j) {
                const int c = c0 + tx + 32 * j;
                if (c < C) acc[j] += df_ld(dy, r * C + c) * df_ld(x, r * C + c) * rs;
            }
        }
#pragma unroll
        for (int j = 0; j < 8; ++j) sh[ty][tx + 32 * j] = acc[j];
    }
    __syncthreads();
    const int col = ty * 32 + tx;
    if (c0 + col < C) {
        float s = 0.f;
        for (int k = 0; k < 8; ++k) s += sh[k][col];
        partial[(long long)blockIdx.y * C + c0 + col] = s;
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
