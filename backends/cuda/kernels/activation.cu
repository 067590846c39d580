// SwiGLU: h = silu(g) * u, silu(g) = g * sigmoid(g). f32 with IEEE expf (no fast math).

__device__ __forceinline__ float sigmoidf_(float g) { return 1.0f / (1.0f + expf(-g)); }

extern "C" __global__ void swiglu_fwd(float* h, const float* g, const float* u, long long n) {
    for (long long i = gtid(); i < n; i += gstride()) {
        const float gi = g[i];
        h[i] = gi * sigmoidf_(gi) * u[i];
    }
}

// d_up = dh * silu(g), d_gate = dh * up * s * (1 + g * (1 - s)), s = sigmoid(g)
extern "C" __global__ void swiglu_bwd(float* dg, float* du, const float* dh, const float* g,
                                      const float* u, long long n) {
    for (long long i = gtid(); i < n; i += gstride()) {
        const float gi = g[i], d = dh[i], s = sigmoidf_(gi);
        du[i] = d * gi * s;
        dg[i] = d * u[i] * s * (1.0f + gi * (1.0f - s));
    }
}
