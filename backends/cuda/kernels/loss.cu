// Fused linear cross-entropy, the per-row part: logits of a chunk of active rows are already
// in `logits (n, V)` (a cuBLASLt GEMM). One block per row computes max / argmax (ties: lowest
// index; NaN never wins), log-sum-exp (exp in f32, sums in f64), CE = lse - z[label], and the
// dlogits = grad_scale * w * (softmax - onehot).

struct ArgMax {
    float v;
    int i;
};

__device__ __forceinline__ ArgMax am_better(ArgMax a, ArgMax b) {
    // NaN compares false everywhere: a NaN candidate never replaces a number.
    if (b.v > a.v || (b.v == a.v && b.i < a.i) || (a.v != a.v && b.v == b.v)) return b;
    return a;
}

// Block-wide argmax of each thread's candidate; the result is returned to every thread.
// `sh` holds >= 32 elements; safe to call repeatedly with it (it synchronises before reuse).
__device__ ArgMax block_argmax_of(ArgMax best, ArgMax* sh) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        ArgMax other;
        other.v = __shfl_xor_sync(0xffffffffu, best.v, o);
        other.i = __shfl_xor_sync(0xffffffffu, best.i, o);
        best = am_better(best, other);
    }
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    __syncthreads();
    if (lane == 0) sh[wid] = best;
    __syncthreads();
    ArgMax r = sh[0];
    for (int k = 1; k < nw; ++k) r = am_better(r, sh[k]);
    if (r.i == 0x7fffffff) r.i = 0;  // an all-NaN row: index 0, like the reference
    return r;
}

// Block-wide argmax of a row.
__device__ ArgMax block_argmax(const float* z, int V, ArgMax* sh) {
    ArgMax best = {-DF_INF, 0x7fffffff};
    for (int j = threadIdx.x; j < V; j += blockDim.x) best = am_better(best, ArgMax{z[j], j});
    return block_argmax_of(best, sh);
}

// Pass (1) of a row, one logit at a time: the running argmax, and the sum of exp relative to
// the thread's running max (rescaled when the max grows). A NaN logit makes the sum NaN.
__device__ __forceinline__ void ce_take1(float zj, int j, ArgMax& best, float& m, double& s) {
    best = am_better(best, ArgMax{zj, j});
    if (zj > m) {
        s = (m == -DF_INF) ? 1.0 : s * exp((double)(m - zj)) + 1.0;
        m = zj;
    } else if (zj != -DF_INF) {
        s += (double)expf(zj - m);
    }
}

// The same for 4 consecutive logits at j: the max grows at most once, and their 4 exps are
// summed in f32 (each <= 1) before the f64 add, so the f64 and conversion work is per vector.
__device__ __forceinline__ void ce_take4(float4 v, int j, ArgMax& best, float& m, double& s) {
    const float z[4] = {v.x, v.y, v.z, v.w};
    float lm = -DF_INF;
    bool nan = false;
#pragma unroll
    for (int t = 0; t < 4; ++t) {
        best = am_better(best, ArgMax{z[t], j + t});
        if (z[t] > lm) lm = z[t];  // NaN compares false
        nan |= z[t] != z[t];
    }
    if (lm > m) {
        s = (m == -DF_INF) ? 0.0 : s * exp((double)(m - lm));
        m = lm;
    }
    if (m != -DF_INF) {
        float e = 0.f;
#pragma unroll
        for (int t = 0; t < 4; ++t) e += expf(z[t] - m);  // -inf adds 0, NaN makes it NaN
        s += (double)e;
    } else if (nan) {
        s = __longlong_as_double(0x7ff8000000000000ll);  // NaN
    }
}

// float4 loads in flight per thread and loop step: one row per block at 256 threads leaves
// each thread ~150 vectors of a 152K row; 4 of them in flight keeps the loads ahead of HBM.
#define CE_UNROLL 4

// f(v, j) for each of this thread's float4 vectors of the row (logits j .. j + 3), CE_UNROLL
// loads issued before any is used, in increasing j.
template <typename F>
__device__ __forceinline__ void ce_vectors(const float* z, int V4, F f) {
    const float4* z4 = reinterpret_cast<const float4*>(z);
    for (int base = threadIdx.x; base < V4; base += blockDim.x * CE_UNROLL) {
        float4 v[CE_UNROLL];
#pragma unroll
        for (int u = 0; u < CE_UNROLL; ++u) {
            const int j4 = base + u * blockDim.x;
            if (j4 < V4) v[u] = z4[j4];
        }
#pragma unroll
        for (int u = 0; u < CE_UNROLL; ++u) {
            const int j4 = base + u * blockDim.x;
            if (j4 < V4) f(v[u], 4 * j4);
        }
    }
}

// Two passes over the row: (1) per thread the argmax and the sum of exp relative to its
// running max, block-combined into the row max M and sum exp(z - M) (f64); (2) the dlogits
// grad_scale * w * (softmax - onehot), written to `dl`: with `dl_bf16` a separate bf16 matrix
// with row stride V (the dX GEMM's operand, no conversion pass), else f32 over the logits
// themselves (each element read and then written by the same thread). Vector path (float4
// loads) when V % 4 == 0 and the pointers are 16- (logits) and 8-byte (bf16 dl) aligned.
extern "C" __global__ void __launch_bounds__(256) ce_rows(float* logits, void* dl, int dl_bf16,
                                                         const int* labels, const float* weights,
                                                         int V, float grad_scale, double* ce_out,
                                                         int* correct_out) {
    __shared__ ArgMax sh_am[32];
    __shared__ double sh_d[32];
    const long long row = blockIdx.x;
    const float* z = logits + row * (long long)V;
    const int label = labels[row];
    const bool vec = (V & 3) == 0 && (((unsigned long long)logits) & 15ull) == 0 &&
                     (((unsigned long long)dl) & 7ull) == 0;
    const int V4 = V >> 2;
    ArgMax best = {-DF_INF, 0x7fffffff};
    float m = -DF_INF;  // this thread's running max (of non-NaN values)
    double s = 0.0;     // sum of exp(z - m) over this thread's elements
    if (vec) {
        ce_vectors(z, V4, [&](float4 v, int j) { ce_take4(v, j, best, m, s); });
    } else {
        for (int j = threadIdx.x; j < V; j += blockDim.x) ce_take1(z[j], j, best, m, s);
    }
    const ArgMax am = block_argmax_of(best, sh_am);
    const float mx = am.v;
    // Rescale to the row max; a thread that saw only -inf (or nothing) adds 0.
    double sum = (m == -DF_INF) ? (s != s ? s : 0.0) : s * exp((double)(m - mx));
    sum = block_sum(sum, sh_d);
    const double lse = (double)mx + log(sum);
    const float zl = z[label];  // read before an in-place pass (2) overwrites the row
    __syncthreads();
    if (threadIdx.x == 0) {
        ce_out[row] = lse - (double)zl;
        correct_out[row] = (am.i == label) ? 1 : 0;
    }
    const float gw = grad_scale * weights[row];
    const float lse_f = (float)lse;
    float* df = reinterpret_cast<float*>(dl) + row * (long long)V;
    df_bf16* db = reinterpret_cast<df_bf16*>(dl) + row * (long long)V;
    if (vec) {
        ce_vectors(z, V4, [&](float4 v, int j) {
            float g[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int t = 0; t < 4; ++t)
                g[t] = gw * (expf(g[t] - lse_f) - (j + t == label ? 1.0f : 0.0f));
            if (dl_bf16) {
                uint2 b;
                b.x = df_bf16_bits(g[0]) | (df_bf16_bits(g[1]) << 16);
                b.y = df_bf16_bits(g[2]) | (df_bf16_bits(g[3]) << 16);
                *reinterpret_cast<uint2*>(db + j) = b;
            } else {
                *reinterpret_cast<float4*>(df + j) = make_float4(g[0], g[1], g[2], g[3]);
            }
        });
    } else {
        for (int j = threadIdx.x; j < V; j += blockDim.x) {
            const float g = gw * (expf(z[j] - lse_f) - (j == label ? 1.0f : 0.0f));
            if (dl_bf16) df_st(db, j, g);
            else df[j] = g;
        }
    }
}

// Greedy token per row of a logits chunk.
extern "C" __global__ void argmax_rows(const float* logits, int V, int* out) {
    __shared__ ArgMax sh_am[32];
    const long long row = blockIdx.x;
    const ArgMax am = block_argmax(logits + row * (long long)V, V, sh_am);
    if (threadIdx.x == 0) out[row] = am.i;
}
