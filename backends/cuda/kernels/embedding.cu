// Row gather from a frozen (V, H) table. Ids were validated on the host (id < V).
// Grid-stride over the (T, H) output. Table and output are f32 or bf16
// (embedding_gather_<out><table>, see common.cuh): a same-type gather is an exact copy, a
// bf16 table widens exactly, an f32 table into a bf16 output rounds once (RNE).
template <typename TO, typename TT>
__device__ __forceinline__ void embedding_gather_t(TO* out, const TT* table, const int* ids,
                                                   long long T, long long H) {
    const long long n = T * H;
    for (long long i = gtid(); i < n; i += gstride()) {
        const long long t = i / H, c = i - t * H;
        df_st(out, i, df_ld(table, (long long)ids[t] * H + c));
    }
}
#define DF_EMBED(O, W)                                                                       \
    extern "C" __global__ void embedding_gather_##O##W(DF_T_##O* out, const DF_T_##W* table,  \
                                                       const int* ids, long long T, long long H) { \
        embedding_gather_t(out, table, ids, T, H);                                           \
    }
DF_INST4(DF_EMBED)
