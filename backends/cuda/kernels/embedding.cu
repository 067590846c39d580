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

// The same from a bf16 table (raw u16 bits), widened exactly to f32.
extern "C" __global__ void embedding_gather_bf16(float* out, const unsigned short* table,
                                                 const int* ids, long long T, long long H) {
    const long long n = T * H;
    for (long long i = gtid(); i < n; i += gstride()) {
        const long long t = i / H, c = i - t * H;
        out[i] = __uint_as_float(((unsigned int)table[(long long)ids[t] * H + c]) << 16);
    }
}
