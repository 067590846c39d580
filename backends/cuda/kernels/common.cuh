// Prepended by the Rust side to every kernel file of this backend before NVRTC compiles it
// (NVRTC has no file system; a `#line` directive after this prelude keeps log line numbers
// pointing into the right file). Only NVRTC's built-in headers may be used.
//
// Conventions: element counts are `long long`; blocks are whole warps (blockDim.x a multiple
// of 32, at most 1024) so full-mask shuffles are valid; reductions combine in a fixed order,
// so results do not depend on scheduling (bit-deterministic run to run).

#define DF_INF __int_as_float(0x7f800000)

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the whole block, returned to every thread. `sh` holds >= 32 elements. Safe to
// call repeatedly with the same buffer (it synchronises before reuse).
template <typename T>
__device__ __forceinline__ T block_sum(T v, T* sh) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    T r = 0;
    for (int i = 0; i < nw; ++i) r += sh[i];  // same order in every thread: a broadcast
    return r;
}

__device__ __forceinline__ float block_max(float v, float* sh) {
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    float r = -DF_INF;
    for (int i = 0; i < nw; ++i) r = fmaxf(r, sh[i]);
    return r;
}

__device__ __forceinline__ long long gtid() {
    return (long long)blockIdx.x * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ long long gstride() {
    return (long long)gridDim.x * blockDim.x;
}

// ---- Activation storage types (f32, or bf16 as raw u16 bits) ----
// Kernels are templated on the element type of each activation pointer: `df_ld` loads an
// element as f32 (bf16 widening is exact), `df_st` stores an f32 result (bf16: rounded once,
// to nearest even; NaN stays a quiet NaN with its sign). All math is f32 in between. The
// extern "C" instantiations are named with one letter per templated pointer, `f` (f32) or `b`
// (bf16), outputs first, e.g. `add_bff` = bf16 out, f32 a, f32 b (`DF_INST*` below enumerate
// them in the order the Rust side indexes: f = 0, b = 1, first letter most significant).
typedef unsigned short df_bf16;

__device__ __forceinline__ unsigned int df_bf16_bits(float f) {
    const unsigned int u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (u >> 16) | 0x0040u;  // quiet NaN
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}
__device__ __forceinline__ float df_ld(const float* p, long long i) { return p[i]; }
__device__ __forceinline__ float df_ld(const df_bf16* p, long long i) {
    return __uint_as_float(((unsigned int)p[i]) << 16);
}
__device__ __forceinline__ void df_st(float* p, long long i, float v) { p[i] = v; }
__device__ __forceinline__ void df_st(df_bf16* p, long long i, float v) {
    p[i] = (df_bf16)df_bf16_bits(v);
}

#define DF_T_f float
#define DF_T_b df_bf16
#define DF_INST2(M) M(f) M(b)
#define DF_INST4(M) M(f, f) M(f, b) M(b, f) M(b, b)
#define DF_INST8(M) \
    M(f, f, f) M(f, f, b) M(f, b, f) M(f, b, b) M(b, f, f) M(b, f, b) M(b, b, f) M(b, b, b)
