// RMSNorm over the last dim, f32 accumulation. One block per row for y and dx; dw is a
// deterministic two-pass column reduction (partials per row split, then summed in order).

// y (R, C) = x * rstd * w, rstd (R) = 1 / sqrt(mean(x^2) + eps)
extern "C" __global__ void rms_norm_fwd(float* y, float* rstd, const float* x, const float* w,
                                        int C, float eps) {
    __shared__ float sh[32];
    const long long row = blockIdx.x;
    const float* xr = x + row * C;
    float* yr = y + row * C;
    float ss = 0.f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) ss += xr[c] * xr[c];
    ss = block_sum(ss, sh);
    const float r = 1.0f / sqrtf(ss / (float)C + eps);
    for (int c = threadIdx.x; c < C; c += blockDim.x) yr[c] = xr[c] * r * w[c];
    if (threadIdx.x == 0) rstd[row] = r;
}

// dx = rstd * (dy * w - xhat * mean(dy * w * xhat)), xhat = x * rstd
extern "C" __global__ void rms_norm_bwd_dx(float* dx, const float* dy, const float* x,
                                           const float* w, const float* rstd, int C) {
    __shared__ float sh[32];
    const long long row = blockIdx.x;
    const float* xr = x + row * C;
    const float* gr = dy + row * C;
    float* dr = dx + row * C;
    const float r = rstd[row];
    float dot = 0.f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) dot += gr[c] * w[c] * xr[c];
    dot = block_sum(dot, sh) * r / (float)C;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        dr[c] = r * (gr[c] * w[c] - xr[c] * r * dot);
}

// Pass 1 of dw = sum_rows dy * x * rstd. Block (32, 8): 32 columns x 8 row lanes; grid
// (ceil(C/32), splits); split s covers rows [s*rps, min(R, (s+1)*rps)).
extern "C" __global__ void rms_norm_bwd_dw_partial(float* partial, const float* dy,
                                                   const float* x, const float* rstd,
                                                   long long R, int C, long long rps) {
    __shared__ float sh[8][33];
    const int c = blockIdx.x * 32 + threadIdx.x;
    const long long r0 = (long long)blockIdx.y * rps;
    const long long r1 = min(R, r0 + rps);
    float acc = 0.f;
    if (c < C)
        for (long long r = r0 + threadIdx.y; r < r1; r += 8)
            acc += dy[r * C + c] * x[r * C + c] * rstd[r];
    sh[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        float s = 0.f;
        for (int k = 0; k < 8; ++k) s += sh[k][threadIdx.x];
        partial[(long long)blockIdx.y * C + c] = s;
    }
}

// Pass 2: dw[c] = sum over splits, in order.
extern "C" __global__ void rms_norm_bwd_dw_final(float* dw, const float* partial, int splits,
                                                 int C) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float s = 0.f;
    for (int k = 0; k < splits; ++k) s += partial[(long long)k * C + c];
    dw[c] = s;
}
