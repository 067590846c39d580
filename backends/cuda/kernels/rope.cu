// Rotary embedding, HF "rotate half" layout. One block per token: the block first builds the
// token's (cos, sin) table in shared memory with the angle p * theta^(-2i/D) evaluated in
// f64 and rounded to f32 (as the reference does: an f32 angle would be off by ~1e-3 rad at
// position 8192), then rotates every head. `sign` = -1 gives the backward (transpose).
extern "C" __global__ void rope_rotate(float* y, const float* x, const int* pos, int heads, int D,
                                       double theta, float sign) {
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
        const float x1 = x[o + i], x2 = x[o + i + half];
        y[o + i] = x1 * c - x2 * s;
        y[o + i + half] = x2 * c + x1 * s;
    }
}
