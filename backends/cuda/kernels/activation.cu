// SwiGLU: h = silu(g) * u, silu(g) = g * sigmoid(g). f32 math with IEEE expf (no fast math).
// Activations are f32 or bf16 (see common.cuh): swiglu_fwd_<h><g,u>, swiglu_bwd_<dg,du><dh,g,u>
// (the inputs of one call share a type; the Rust side widens a mixed call's bf16 inputs).
// Vectorised (vec.cuh): with every pointer 16-byte aligned a thread handles 8 elements per
// grid-stride step (16-byte accesses), the last n % 8 one per thread; otherwise all scalar.
// Same per-element formula either way. Launched with ceil(n / 8) threads (`grid_vec8`).

__device__ __forceinline__ float sigmoidf_(float g) { return 1.0f / (1.0f + expf(-g)); }

__device__ __forceinline__ float swiglu_h(float g, float u) { return g * sigmoidf_(g) * u; }

template <typename TO, typename TI>
__device__ __forceinline__ void swiglu_fwd_t(TO* h, const TI* g, const TI* u, long long n) {
    df_map2(h, g, u, n, swiglu_h);
}
#define DF_SWIGLU_FWD(O, I)                                                                  \
    extern "C" __global__ void swiglu_fwd_##O##I(DF_T_##O* h, const DF_T_##I* g,              \
                                                 const DF_T_##I* u, long long n) {           \
        swiglu_fwd_t(h, g, u, n);                                                            \
    }
DF_INST4(DF_SWIGLU_FWD)

// d_up = dh * silu(g), d_gate = dh * up * s * (1 + g * (1 - s)), s = sigmoid(g)
__device__ __forceinline__ void swiglu_d(float d, float g, float u, float& dg, float& du) {
    const float s = sigmoidf_(g);
    du = d * g * s;
    dg = d * u * s * (1.0f + g * (1.0f - s));
}

template <typename TO, typename TI>
__device__ __forceinline__ void swiglu_bwd_t(TO* dg, TO* du, const TI* dh, const TI* g,
                                             const TI* u, long long n) {
    long long done = 0;
    if (df_al16(dg) && df_al16(du) && df_al16(dh) && df_al16(g) && df_al16(u)) {
        const long long nv = n >> 3;
        for (long long i = gtid(); i < nv; i += gstride()) {
            float dv[8], gv[8], uv[8];
            df_ld8(dh, 8 * i, dv);
            df_ld8(g, 8 * i, gv);
            df_ld8(u, 8 * i, uv);
#pragma unroll
            for (int j = 0; j < 8; ++j) swiglu_d(dv[j], gv[j], uv[j], gv[j], uv[j]);
            df_st8(du, 8 * i, uv);
            df_st8(dg, 8 * i, gv);
        }
        done = nv << 3;
    }
    for (long long i = done + gtid(); i < n; i += gstride()) {
        float a, b;
        swiglu_d(df_ld(dh, i), df_ld(g, i), df_ld(u, i), a, b);
        df_st(du, i, b);
        df_st(dg, i, a);
    }
}
#define DF_SWIGLU_BWD(O, I)                                                                  \
    extern "C" __global__ void swiglu_bwd_##O##I(DF_T_##O* dg, DF_T_##O* du, const DF_T_##I* dh, \
                                                 const DF_T_##I* g, const DF_T_##I* u,       \
                                                 long long n) {                              \
        swiglu_bwd_t(dg, du, dh, g, u, n);                                                   \
    }
DF_INST4(DF_SWIGLU_BWD)
