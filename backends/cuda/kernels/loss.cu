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

// Block-wide argmax; result returned to every thread.
__device__ ArgMax block_argmax(const float* z, int V, ArgMax* sh) {
    ArgMax best = {-DF_INF, 0x7fffffff};
    for (int j = threadIdx.x; j < V; j += blockDim.x) best = am_better(best, ArgMax{z[j], j});
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

extern "C" __global__ void ce_rows(float* logits, const int* labels, const float* weights,
                                   int V, float grad_scale, double* ce_out, int* correct_out) {
    __shared__ ArgMax sh_am[32];
    __shared__ double sh_d[32];
    const long long row = blockIdx.x;
    float* z = logits + row * (long long)V;
    const int label = labels[row];
    const ArgMax am = block_argmax(z, V, sh_am);
    const float mx = am.v;
    double sum = 0.0;
    for (int j = threadIdx.x; j < V; j += blockDim.x) sum += (double)expf(z[j] - mx);
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
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        const float p = expf(z[j] - lse_f);
        z[j] = gw * (p - (j == label ? 1.0f : 0.0f));
    }
}

// Greedy token per row of a logits chunk.
extern "C" __global__ void argmax_rows(const float* logits, int V, int* out) {
    __shared__ ArgMax sh_am[32];
    const long long row = blockIdx.x;
    const ArgMax am = block_argmax(logits + row * (long long)V, V, sh_am);
    if (threadIdx.x == 0) out[row] = am.i;
}
