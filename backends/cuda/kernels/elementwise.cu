// Memory and elementwise ops: fill, add, add_assign, scale, column concatenation, row
// gather/scatter, sum of squares (two-pass, f64), non-finite count (two-pass), and the
// f32 <-> bf16 conversions a bf16 activation path will use.

extern "C" __global__ void fill_f32(float* x, long long n, float v) {
    for (long long i = gtid(); i < n; i += gstride()) x[i] = v;
}

extern "C" __global__ void add_f32(float* out, const float* a, const float* b, long long n) {
    for (long long i = gtid(); i < n; i += gstride()) out[i] = a[i] + b[i];
}

extern "C" __global__ void add_assign_f32(float* acc, const float* x, long long n) {
    for (long long i = gtid(); i < n; i += gstride()) acc[i] += x[i];
}

extern "C" __global__ void scale_f32(float* x, long long n, float s) {
    for (long long i = gtid(); i < n; i += gstride()) x[i] *= s;
}

// out (rows, out_cols)[:, col_off .. col_off + cols] = src (rows, cols)
extern "C" __global__ void copy_cols_f32(float* out, const float* src, long long rows,
                                         long long cols, long long out_cols, long long col_off) {
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

// out[rows[i], :] = x (n, cols)
extern "C" __global__ void scatter_rows_f32(float* out, const float* x, const int* rows,
                                            long long n, long long cols) {
    const long long total = n * cols;
    for (long long i = gtid(); i < total; i += gstride()) {
        const long long r = i / cols, c = i - r * cols;
        out[(long long)rows[r] * cols + c] = x[i];
    }
}

// Pass 1 of sum(x^2): block b writes the f64 sum of its grid-stride share to partial[b].
extern "C" __global__ void sum_squares_partial(const float* x, long long n, double* partial) {
    __shared__ double sh[32];
    double acc = 0.0;
    for (long long i = gtid(); i < n; i += gstride()) {
        const double v = (double)x[i];
        acc += v * v;
    }
    acc = block_sum(acc, sh);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// Pass 2: one block sums the partials in a fixed order.
extern "C" __global__ void sum_final_f64(const double* partial, int n, double* out) {
    __shared__ double sh[32];
    double acc = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) acc += partial[i];
    acc = block_sum(acc, sh);
    if (threadIdx.x == 0) out[0] = acc;
}

extern "C" __global__ void nonfinite_partial(const float* x, long long n,
                                             unsigned long long* partial) {
    __shared__ unsigned long long sh[32];
    unsigned long long acc = 0;
    for (long long i = gtid(); i < n; i += gstride()) acc += isfinite(x[i]) ? 0 : 1;
    acc = block_sum(acc, sh);
    if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

extern "C" __global__ void sum_final_u64(const unsigned long long* partial, int n,
                                         unsigned long long* out) {
    __shared__ unsigned long long sh[32];
    unsigned long long acc = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) acc += partial[i];
    acc = block_sum(acc, sh);
    if (threadIdx.x == 0) out[0] = acc;
}

// f32 -> bf16 rounding to nearest even (NaN stays a quiet NaN), and the exact widening back.
// Bit operations on u16 storage: no header needed (NVRTC's built-in set varies by version).
extern "C" __global__ void f32_to_bf16(unsigned short* out, const float* x, long long n) {
    for (long long i = gtid(); i < n; i += gstride()) {
        const unsigned int u = __float_as_uint(x[i]);
        unsigned short r;
        if ((u & 0x7fffffffu) > 0x7f800000u) {
            r = (unsigned short)((u >> 16) | 0x0040u);  // quiet NaN, sign kept
        } else {
            r = (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
        }
        out[i] = r;
    }
}

extern "C" __global__ void bf16_to_f32(float* out, const unsigned short* x, long long n) {
    for (long long i = gtid(); i < n; i += gstride()) out[i] = __uint_as_float(((unsigned int)x[i]) << 16);
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
