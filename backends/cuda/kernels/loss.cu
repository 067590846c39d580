// Fused linear cross-entropy, the per-row part: logits of a chunk of active rows are already
// in `logits (n, V)` (a cuBLASLt GEMM). One block per row computes max / argmax (ties: lowest
// index; NaN never wins), log-sum-exp (exp in f32, sums in f64), CE = lse - z[label], and
// overwrites the row with dlogits = grad_scale * w * (softmax - onehot).

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

// Two passes over the row instead of three: (1) online, per thread, the argmax and the sum of
// exp relative to the thread's running max (rescaled when the max grows), then block-combined
// into the row max M and sum exp(z - M) (f64); (2) the dlogits. With `out_bf16` the dlogits
// are written as bf16 into the first half of the row's own bytes (element j at byte 2j of the
// row, so the chunk is a bf16 matrix with row stride 2V), which the dX GEMM reads in place:
// no f32 write and no separate conversion pass. Within an iteration of pass (2) every thread
// reads its element before any writes (barrier); a bf16 write at j overwrites f32 element
// j / 2, which this or an earlier iteration has already read.
extern "C" __global__ void ce_rows(float* logits, const int* labels, const float* weights,
                                   int V, float grad_scale, int out_bf16, double* ce_out,
                                   int* correct_out) {
    __shared__ ArgMax sh_am[32];
    __shared__ double sh_d[32];
    const long long row = blockIdx.x;
    float* z = logits + row * (long long)V;
    const int label = labels[row];
    ArgMax best = {-DF_INF, 0x7fffffff};
    float m = -DF_INF;  // this thread's running max (of non-NaN values)
    double s = 0.0;     // sum of exp(z - m) over this thread's elements
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        const float zj = z[j];
        best = am_better(best, ArgMax{zj, j});
        if (zj > m) {
            s = (m == -DF_INF) ? 1.0 : s * exp((double)(m - zj)) + 1.0;
            m = zj;
        } else if (zj != -DF_INF) {
            s += (double)expf(zj - m);  // a NaN logit makes the sum (hence the loss) NaN
        }
    }
    const ArgMax am = block_argmax_of(best, sh_am);
    const float mx = am.v;
    // Rescale to the row max; a thread that saw only -inf (or nothing) adds 0.
    double sum = (m == -DF_INF) ? (s != s ? s : 0.0) : s * exp((double)(m - mx));
    sum = block_sum(sum, sh_d);
    const double lse = (double)mx + log(sum);
    const float zl = z[label];  // read before the row is overwritten below
    __syncthreads();
    if (threadIdx.x == 0) {
        ce_out[row] = lse - (double)zl;
        correct_out[row] = (am.i == label) ? 1 : 0;
    }
    const float gw = grad_scale * weights[row];
    const float lse_f = (float)lse;
    if (out_bf16) {
        df_bf16* zb = reinterpret_cast<df_bf16*>(z);
        for (int base = 0; base < V; base += blockDim.x) {
            const int j = base + threadIdx.x;
            const float zj = j < V ? z[j] : 0.0f;
            __syncthreads();
            if (j < V) {
                const float p = expf(zj - lse_f);
                df_st(zb, j, gw * (p - (j == label ? 1.0f : 0.0f)));
            }
        }
    } else {
        for (int j = threadIdx.x; j < V; j += blockDim.x) {
            const float p = expf(z[j] - lse_f);
            z[j] = gw * (p - (j == label ? 1.0f : 0.0f));
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
