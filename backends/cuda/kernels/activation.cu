// SwiGLU: h = silu(g) * u, silu(g) = g * sigmoid(g). f32 math with IEEE expf (no fast math).
// Activations are f32 or bf16 (see common.cuh): swiglu_fwd_<h><g,u>, swiglu_bwd_<dg,du><dh,g,u>
// (the inputs of one call share a type; the Rust side widens a mixed call's bf16 inputs).

__device__ __forceinline__ float sigmoidf_(float g) { return 1.0f / (1.0f + expf(-g)); }

template <typename TO, typename TI>
__device__ __forceinline__ void swiglu_fwd_t(TO* h, const TI* g, const TI* u, long long n) {
    for (long long i = gtid(); i < n; i += gstride()) {
        const float gi = df_ld(g, i);
        df_st(h, i, gi * sigmoidf_(gi) * df_ld(u, i));
    }
}
#define DF_SWIGLU_FWD(O, I)                                                                  \
    extern "C" __global__ void swiglu_fwd_##O##I(DF_T_##O* h, const DF_T_##I* g,              \
                                                 const DF_T_##I* u, long long n) {           \
        swiglu_fwd_t(h, g, u, n);                                                            \
    }
DF_INST4(DF_SWIGLU_FWD)

// d_up = dh * silu(g), d_gate = dh * up * s * (1 + g * (1 - s)), s = sigmoid(g)
template <typename TO, typename TI>
__device__ __forceinline__ void swiglu_bwd_t(TO* dg, TO* du, const TI* dh, const TI* g,
                                             const TI* u, long long n) {
    for (long long i = gtid(); i < n; i += gstride()) {
        const float gi = df_ld(g, i), d = df_ld(dh, i), s = sigmoidf_(gi);
        df_st(du, i, d * gi * s);
        df_st(dg, i, d * df_ld(u, i) * s * (1.0f + gi * (1.0f - s)));
    }
}
#define DF_SWIGLU_BWD(O, I)                                                                  \
    extern "C" __global__ void swiglu_bwd_##O##I(DF_T_##O* dg, DF_T_##O* du, const DF_T_##I* dh, \
                                                 const DF_T_##I* g, const DF_T_##I* u,       \
                                                 long long n) {                              \
        swiglu_bwd_t(dg, du, dh, g, u, n);                                                   \
    }
DF_INST4(DF_SWIGLU_BWD)
