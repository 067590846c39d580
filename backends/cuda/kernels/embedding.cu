// Row gather from a frozen (V, H) table. Ids were validated on the host (id < V).
// Grid-stride over the (T, H) output.
extern "C" __global__ void embedding_gather(float* out, const float* table, const int* ids,
                                            long long T, long long H) {
    const long long n = T * H;
    for (long long i = gtid(); i < n; i += gstride()) {
        const long long t = i / H, c = i - t * H;
        out[i] = table[(long long)ids[t] * H + c];
    }
}
