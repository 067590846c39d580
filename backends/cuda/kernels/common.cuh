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
