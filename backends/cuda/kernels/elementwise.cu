// Memory and elementwise ops: fill, add, add_assign, scale, column concatenation, row
// gather/scatter, sum of squares (two-pass, f64), non-finite count (two-pass), and the
// f32 <-> bf16 conversions. The arithmetic kernels are templated on each pointer's element
// type (f32 or bf16, see common.cuh) and compute in f32 (sums of squares in f64).

extern "C" __global__ void fill_f32(float* x, long long n, float v) {
    for (long long i = gtid(); i < n; i += gstride()) x[i] = v;
}

extern "C" __global__ void fill_u16(unsigned short* x, long long n, unsigned int v) {
    for (long long i = gtid(); i < n; i += gstride()) x[i] = (unsigned short)v;
}

// The arithmetic kernels below are vectorised (vec.cuh): when every pointer is 16-byte aligned
// (every tensor base is), a thread handles 8 elements per grid-stride step with 16-byte loads
// and stores (bf16: one access per operand, f32: two) and the last n % 8 elements go one per
// thread; a misaligned pointer makes the whole call take the scalar loop. Same f32 operation
// and one rounding per element either way. The Rust side launches ceil(n / 8) threads
// (`grid_vec8`); any launch shape is correct.

// out = a + b, each of f32 or bf16 (add_<out><a><b>).
template <typename TO, typename TA, typename TB>
__device__ __forceinline__ void add_t(TO* out, const TA* a, const TB* b, long long n) {
    df_map2(out, a, b, n, [](float x, float y) { return x + y; });
}
#define DF_ADD(O, A, B)                                                                      \
    extern "C" __global__ void add_##O##A##B(DF_T_##O* out, const DF_T_##A* a,               \
                                             const DF_T_##B* b, long long n) {               \
        add_t(out, a, b, n);                                                                 \
    }
DF_INST8(DF_ADD)

// acc += x, acc keeps its type (add_assign_<acc><x>).
template <typename TA, typename TX>
__device__ __forceinline__ void add_assign_t(TA* acc, const TX* x, long long n) {
    df_map2(acc, acc, x, n, [](float s, float y) { return s + y; });
}
#define DF_ADD_ASSIGN(A, X)                                                                  \
    extern "C" __global__ void add_assign_##A##X(DF_T_##A* acc, const DF_T_##X* x,           \
                                                 long long n) {                              \
        add_assign_t(acc, x, n);                                                             \
    }
DF_INST4(DF_ADD_ASSIGN)

// x *= s in place (scale_<x>).
template <typename T>
__device__ __forceinline__ void scale_t(T* x, long long n, float s) {
    long long done = 0;
    if (df_al16(x)) {
        const long long nv = n >> 3;
        for (long long i = gtid(); i < nv; i += gstride()) {
            float v[8];
            df_ld8(x, 8 * i, v);
#pragma unroll
            for (int j = 0; j < 8; ++j) v[j] *= s;
            df_st8(x, 8 * i, v);
        }
        done = nv << 3;
    }
    for (long long i = done + gtid(); i < n; i += gstride()) df_st(x, i, df_ld(x, i) * s);
}
#define DF_SCALE(T) \
    extern "C" __global__ void scale_##T(DF_T_##T* x, long long n, float s) { scale_t(x, n, s); }
DF_INST2(DF_SCALE)

// out (rows, out_cols)[:, col_off .. col_off + cols] = src (rows, cols)
extern "C" __global__ void copy_cols_f32(float* out, const float* src, long long rows,
                                         long long cols, long long out_cols, long long col_off) {
    const long long n = rows * cols;
    for (long long i = gtid(); i < n; i += gstride()) {
        const long long r = i / cols, c = i - r * cols;
        out[r * out_cols + col_off + c] = src[i];
    }
}

// The same for 2-byte elements (bf16 storage; a pure copy, no conversion).
extern "C" __global__ void copy_cols_u16(unsigned short* out, const unsigned short* src,
                                         long long rows, long long cols, long long out_cols,
                                         long long col_off) {
    const long long n = rows * cols;
    for (long long i = gtid(); i < n; i += gstride()) {
        const long long r = i / cols, c = i - r * cols;
        out[r * out_cols + col_off + c] = src[i];
    }
}

// out (n, cols) = x[rows[i], :]
extern "C" __global__ void gather_rows_f32(float* out, const float* x, const int* rows,
                                           long long n, long long cols) {
    const long long total = n * cols;
    for (long long i = gtid(); i < total; i += gstride()) {
        const long long r = i / cols, c = i - r * cols;
        out[i] = x[(long long)rows[r] * cols + c];
    }
}

// The same gather for 2-byte elements (bf16 rows; a pure copy).
extern "C" __global__ void gather_rows_u16(unsigned short* out, const unsigned short* x,
                                           const int* rows, long long n, long long cols) {
    const long long total = n * cols;
    for (long long i = gtid(); i < total; i += gstride()) {
        const long long r = i / cols, c = i - r * cols;
        out[i] = x[(long long)rows[r] * cols + c];
    }
}

// out[rows[i], :] = x (n, cols), x f32, out f32 or bf16 (scatter_rows_<out>).
template <typename TO>
__device__ __forceinline__ void scatter_rows_t(TO* out, const float* x, const int* rows,
                                               long long n, long long cols) {
    const long long total = n * cols;
    for (long long i = gtid(); i < total; i += gstride()) {
        const long long r = i / cols, c = i - r * cols;
        df_st(out, (long long)rows[r] * cols + c, x[i]);
    }
}
#define DF_SCATTER(O)                                                                        \
    extern "C" __global__ void scatter_rows_##O(DF_T_##O* out, const float* x, const int* rows, \
                                                long long n, long long cols) {               \
        scatter_rows_t(out, x, rows, n, cols);                                               \
    }
DF_INST2(DF_SCATTER)

// Pass 1 of sum(x^2): block b writes the f64 sum of its grid-stride share to partial[b]
// (sum_squares_partial_<x>).
template <typename T>
__device__ __forceinline__ void sum_squares_partial_t(const T* x, long long n, double* partial) {
    __shared__ double sh[32];
    double acc = 0.0;
    for (long long i = gtid(); i < n; i += gstride()) {
        const double v = (double)df_ld(x, i);
        acc += v * v;
    }
    acc = block_sum(acc, sh);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}
#define DF_SUMSQ(T)                                                                          \
    extern "C" __global__ void sum_squares_partial_##T(const DF_T_##T* x, long long n,        \
                                                       double* partial) {                    \
        sum_squares_partial_t(x, n, partial);                                                \
    }
DF_INST2(DF_SUMSQ)

// Pass 2: one block sums the partials in a fixed order.
extern "C" __global__ void sum_final_f64(const double* partial, int n, double* out) {
    __shared__ double sh[32];
    double acc = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) acc += partial[i];
    acc = block_sum(acc, sh);
    if (threadIdx.x == 0) out[0] = acc;
}

template <typename T>
__device__ __forceinline__ void nonfinite_partial_t(const T* x, long long n,
                                                    unsigned long long* partial) {
    __shared__ unsigned long long sh[32];
    unsigned long long acc = 0;
    for (long long i = gtid(); i < n; i += gstride()) acc += isfinite(df_ld(x, i)) ? 0 : 1;
    acc = block_sum(acc, sh);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}
#define DF_NONFINITE(T)                                                                      \
    extern "C" __global__ void nonfinite_partial_##T(const DF_T_##T* x, long long n,          \
                                                     unsigned long long* partial) {          \
        nonfinite_partial_t(x, n, partial);                                                  \
    }
DF_INST2(DF_NONFINITE)

extern "C" __global__ void sum_final_u64(const unsigned long long* partial, int n,
                                         unsigned long long* out) {
    __shared__ unsigned long long sh[32];
    unsigned long long acc = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) acc += partial[i];
    acc = block_sum(acc, sh);
    if (threadIdx.x == 0) out[0] = acc;
}

// f32 -> bf16 rounding to nearest even (NaN stays a quiet NaN, sign kept), and the exact
// widening back. Bit operations on u16 storage: no header needed (NVRTC's built-in set varies
// by version). Memory-bound, so vectorised: when both pointers are 16-byte aligned (every
// tensor base is; a GEMM operand view at an odd offset may not be), each thread moves 8
// elements per step (two 16-byte f32 loads + one 16-byte bf16 store, or the reverse) and the
// last n % 8 elements go one per thread; otherwise one element per thread. Grid-stride, so any
// launch shape is correct (the Rust side launches ceil(n / 8) threads). (16 elements per
// thread for bf16 -> f32 measured slower on the H200: 2230 vs 3237 GB/s.)
__device__ __forceinline__ unsigned int bf16_rne_bits(float f) { return df_bf16_bits(f); }
// Two bf16 in one word, element `lo` first (little-endian).
__device__ __forceinline__ unsigned int bf16_pack2(float lo, float hi) {
    return bf16_rne_bits(lo) | (bf16_rne_bits(hi) << 16);
}

extern "C" __global__ void f32_to_bf16(unsigned short* out, const float* x, long long n) {
    const bool vec = ((((unsigned long long)out) | ((unsigned long long)x)) & 15ull) == 0;
    long long done = 0;
    if (vec) {
        const long long nv = n >> 3;
        const float4* x4 = reinterpret_cast<const float4*>(x);
        uint4* o4 = reinterpret_cast<uint4*>(out);
        for (long long i = gtid(); i < nv; i += gstride()) {
            const float4 a = x4[2 * i], b = x4[2 * i + 1];
            uint4 r;
            r.x = bf16_pack2(a.x, a.y);
            r.y = bf16_pack2(a.z, a.w);
            r.z = bf16_pack2(b.x, b.y);
            r.w = bf16_pack2(b.z, b.w);
            o4[i] = r;
        }
        done = nv << 3;
    }
    for (long long i = done + gtid(); i < n; i += gstride())
        out[i] = (unsigned short)bf16_rne_bits(x[i]);
}

extern "C" __global__ void bf16_to_f32(float* out, const unsigned short* x, long long n) {
    const bool vec = ((((unsigned long long)out) | ((unsigned long long)x)) & 15ull) == 0;
    long long done = 0;
    if (vec) {
        const long long nv = n >> 3;
        const uint4* x4 = reinterpret_cast<const uint4*>(x);
        float4* o4 = reinterpret_cast<float4*>(out);
        for (long long i = gtid(); i < nv; i += gstride()) {
            const uint4 v = x4[i];
            o4[2 * i] = make_float4(__uint_as_float(v.x << 16), __uint_as_float(v.x & 0xffff0000u),
                                    __uint_as_float(v.y << 16), __uint_as_float(v.y & 0xffff0000u));
            o4[2 * i + 1] = make_float4(__uint_as_float(v.z << 16), __uint_as_float(v.z & 0xffff0000u),
                                        __uint_as_float(v.w << 16), __uint_as_float(v.w & 0xffff0000u));
        }
        done = nv << 3;
    }
    for (long long i = done + gtid(); i < n; i += gstride())
        out[i] = __uint_as_float(((unsigned int)x[i]) << 16);
}

// The same counter-based N(0, std^2) stream as dflash_core::ops::memory::normal_host
// (splitmix64 + Box-Muller in f64), one thread per pair, so weights for benchmarks are
// generated on the device, never uploaded, and match the host generator.
__device__ __forceinline__ unsigned long long splitmix64_dev(unsigned long long x) {
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}
extern "C" __global__ void random_normal_f32(float* out, long long n, float std_, unsigned long long seed) {
    const unsigned long long golden = 0x9E3779B97F4A7C15ull;
    const unsigned long long key = splitmix64_dev(seed + golden);
    const double scale = 1.0 / 9007199254740992.0; // 2^-53
    const long long pairs = (n + 1) / 2;
    for (long long p = gtid(); p < pairs; p += gstride()) {
        unsigned long long c0 = 2ull * (unsigned long long)p, c1 = c0 + 1ull;
        unsigned long long b0 = splitmix64_dev(key + (c0 + 1ull) * golden) >> 11;
        unsigned long long b1 = splitmix64_dev(key + (c1 + 1ull) * golden) >> 11;
        double u1 = (double)(b0 + 1ull) * scale;
        double u2 = (double)b1 * scale;
        double r = sqrt(-2.0 * log(u1));
        double s, c;
        sincos(2.0 * 3.141592653589793 * u2, &s, &c);
        out[2 * p] = (float)(r * c * (double)std_);
        if (2 * p + 1 < n) out[2 * p + 1] = (float)(r * s * (double)std_);
    }
}
