// Row gather from a frozen (V, H) table. Ids were validated on the host (id < V).
// Grid-stride over the (T, H) output. Table and output are f32 or bf16
// (embedding_gather_<out><table>, see common.cuh): a same-type gather is an exact copy, a
// bf16 table widens exactly, an f32 table into a bf16 output rounds once (RNE).
// Vectorised (vec.cuh) when H % 8 == 0 and both pointers are 16-byte aligned: a thread moves 8
// elements of one row per step with 16-byte accesses; otherwise one element per step. The
// Rust side launches ceil(T * H / 8) threads (`grid_vec8`).
template <typename TO, typename TT>
__device__ __forceinline__ void embedding_gather_t(TO* out, const TT* table, const int* ids,
                                                   long long T, long long H) {
    // Row of a flat index: 32-bit division when the count fits (64-bit division is a long
    // software sequence, comparable to the 16-byte move itself).
    const bool small = T * H < (1ll << 31);
    if ((H & 7) == 0 && df_al16(out) && df_al16(table)) {
        const long long hv = H >> 3, nv = T * hv;
        for (long long i = gtid(); i < nv; i += gstride()) {
            const long long t = small ? (long long)((unsigned)i / (unsigned)hv) : i / hv;
            const long long c = (i - t * hv) * 8;
            float v[8];
            df_ld8(table, (long long)ids[t] * H + c, v);
            df_st8(out, t * H + c, v);
        }
        return;
    }
    const long long n = T * H;
    for (long long i = gtid(); i < n; i += gstride()) {
        const long long t = small ? (long long)((unsigned)i / (unsigned)H) : i / H;
        const long long c = i - t * H;
        df_st(out, i, df_ld(table, (long long)ids[t] * H + c));
    }
}
#define DF_EMBED(O, W)                                                                       \
    extern "C" __global__ void embedding_gather_##O##W(DF_T_##O* out, const DF_T_##W* table,  \
                                                       const int* ids, long long T, long long H) { \
        embedding_gather_t(out, table, ids, T, H);                                           \
    }
DF_INST4(DF_EMBED)
