// AdamW (torch.optim.AdamW): decoupled decay, bias-corrected moments. Each element is updated
// in f64 and rounded once per state to f32, exactly like the reference backend. The bias
// corrections bc1 = 1 - b1^t, bc2 = 1 - b2^t and decay = 1 - lr*wd come from the host. The
// gradient is read as `g * gs` rounded to f32 (loss normalisation and clipping folded in).
// Vectorised: with p, m, v, g all 16-byte aligned a thread updates 4 elements per grid-stride
// step (one float4 load of each, one float4 store of p, m, v), the last n % 4 one per thread;
// otherwise all scalar. The same per-element f64 math either way. Launched with ceil(n / 4)
// threads.
__device__ __forceinline__ void adamw_one(float& p, float& m, float& v, float g, float gs,
                                          double lr, double b1, double b2, double eps,
                                          double decay, double bc1, double bc2) {
    const double gi = (double)(g * gs);
    const double mi = b1 * (double)m + (1.0 - b1) * gi;
    const double vi = b2 * (double)v + (1.0 - b2) * gi * gi;
    double pi = (double)p * decay;
    pi = pi - lr * (mi / bc1) / (sqrt(vi / bc2) + eps);
    m = (float)mi;
    v = (float)vi;
    p = (float)pi;
}

extern "C" __global__ void adamw_f32(float* p, float* m, float* v, const float* g, float gs,
                                     long long n, double lr, double b1, double b2, double eps,
                                     double decay, double bc1, double bc2) {
    long long done = 0;
    if (df_al16(p) && df_al16(m) && df_al16(v) && df_al16(g)) {
        const long long nv = n >> 2;
        float4* p4 = reinterpret_cast<float4*>(p);
        float4* m4 = reinterpret_cast<float4*>(m);
        float4* v4 = reinterpret_cast<float4*>(v);
        const float4* g4 = reinterpret_cast<const float4*>(g);
        for (long long i = gtid(); i < nv; i += gstride()) {
            DF_VEC_CHECK(p4 + i);
            DF_VEC_CHECK(m4 + i);
            DF_VEC_CHECK(v4 + i);
            DF_VEC_CHECK(g4 + i);
            float4 P = p4[i], M = m4[i], V = v4[i];
            const float4 G = g4[i];
            adamw_one(P.x, M.x, V.x, G.x, gs, lr, b1, b2, eps, decay, bc1, bc2);
            adamw_one(P.y, M.y, V.y, G.y, gs, lr, b1, b2, eps, decay, bc1, bc2);
            adamw_one(P.z, M.z, V.z, G.z, gs, lr, b1, b2, eps, decay, bc1, bc2);
            adamw_one(P.w, M.w, V.w, G.w, gs, lr, b1, b2, eps, decay, bc1, bc2);
            p4[i] = P;
            m4[i] = M;
            v4[i] = V;
        }
        done = nv << 2;
    }
    for (long long i = done + gtid(); i < n; i += gstride())
        adamw_one(p[i], m[i], v[i], g[i], gs, lr, b1, b2, eps, decay, bc1, bc2);
}
