// 16-byte vector access for the memory-bound kernels (prepended after common.cuh to every file
// of the kernel set, not to attention.cu; see kernels.rs). A "vector" is DF_VEC = 8 elements:
// one 16-byte access for bf16, two for f32, so a vector index i covers elements [8i, 8i + 8).
// Loads widen to f32 (exact for bf16), stores round once (df_bf16_bits: RNE, quiet NaN), so a
// vector path gives exactly the per-element results of the scalar df_ld / df_st path.
// Callers check alignment (df_al16 on every pointer; element offsets multiples of 8) and keep a
// scalar path for what is left over or misaligned.

#define DF_VEC 8

// A hook for the CPU emulator (lab/cuda/emu/ew_check.py checks every vector address);
// nothing on the device.
#ifndef DF_VEC_CHECK
#define DF_VEC_CHECK(p)
#endif

__device__ __forceinline__ bool df_al16(const void* p) {
    return (((unsigned long long)p) & 15ull) == 0;
}

// v[0..8) = p[i .. i + 8) as f32; p + i must be 16-byte aligned.
__device__ __forceinline__ void df_ld8(const float* p, long long i, float (&v)[8]) {
    DF_VEC_CHECK(p + i);
    const float4 a = *reinterpret_cast<const float4*>(p + i);
    const float4 b = *reinterpret_cast<const float4*>(p + i + 4);
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}
__device__ __forceinline__ void df_ld8(const df_bf16* p, long long i, float (&v)[8]) {
    DF_VEC_CHECK(p + i);
    const uint4 u = *reinterpret_cast<const uint4*>(p + i);
    v[0] = __uint_as_float(u.x << 16); v[1] = __uint_as_float(u.x & 0xffff0000u);
    v[2] = __uint_as_float(u.y << 16); v[3] = __uint_as_float(u.y & 0xffff0000u);
    v[4] = __uint_as_float(u.z << 16); v[5] = __uint_as_float(u.z & 0xffff0000u);
    v[6] = __uint_as_float(u.w << 16); v[7] = __uint_as_float(u.w & 0xffff0000u);
}

// p[i .. i + 8) = v (bf16: each rounded once, RNE); p + i must be 16-byte aligned.
__device__ __forceinline__ void df_st8(float* p, long long i, const float (&v)[8]) {
    DF_VEC_CHECK(p + i);
    *reinterpret_cast<float4*>(p + i) = make_float4(v[0], v[1], v[2], v[3]);
    *reinterpret_cast<float4*>(p + i + 4) = make_float4(v[4], v[5], v[6], v[7]);
}
__device__ __forceinline__ void df_st8(df_bf16* p, long long i, const float (&v)[8]) {
    DF_VEC_CHECK(p + i);
    uint4 u;
    u.x = df_bf16_bits(v[0]) | (df_bf16_bits(v[1]) << 16);
    u.y = df_bf16_bits(v[2]) | (df_bf16_bits(v[3]) << 16);
    u.z = df_bf16_bits(v[4]) | (df_bf16_bits(v[5]) << 16);
    u.w = df_bf16_bits(v[6]) | (df_bf16_bits(v[7]) << 16);
    *reinterpret_cast<uint4*>(p + i) = u;
}

// out[i] = f(a[i], b[i]) for i < n (f: float x float -> float), the shape of every binary
// elementwise kernel: when out, a and b are all 16-byte aligned a thread maps 8 elements per
// grid-stride step (vector path) and the last n % 8 go one per thread; a misaligned pointer
// makes the whole call scalar. Same f and one rounding per element either way. `out` may alias
// `a` (in-place ops: each element is read before it is written, by the same thread).
template <typename TO, typename TA, typename TB, typename F>
__device__ __forceinline__ void df_map2(TO* out, const TA* a, const TB* b, long long n, F f) {
    long long done = 0;
    if (df_al16(out) && df_al16(a) && df_al16(b)) {
        const long long nv = n >> 3;
        for (long long i = gtid(); i < nv; i += gstride()) {
            float x[8], y[8];
            df_ld8(a, 8 * i, x);
            df_ld8(b, 8 * i, y);
#pragma unroll
            for (int j = 0; j < 8; ++j) x[j] = f(x[j], y[j]);
            df_st8(out, 8 * i, x);
        }
        done = nv << 3;
    }
    for (long long i = done + gtid(); i < n; i += gstride()) df_st(out, i, f(df_ld(a, i), df_ld(b, i)));
}
