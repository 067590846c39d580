// AdamW (torch.optim.AdamW): decoupled decay, bias-corrected moments. Each element is updated
// in f64 and rounded once per state to f32, exactly like the reference backend. The bias
// corrections bc1 = 1 - b1^t, bc2 = 1 - b2^t and decay = 1 - lr*wd come from the host. The
// gradient is read as `g * gs` rounded to f32 (loss normalisation and clipping folded in).
extern "C" __global__ void adamw_f32(float* p, float* m, float* v, const float* g, float gs,
                                     long long n, double lr, double b1, double b2, double eps,
                                     double decay, double bc1, double bc2) {
    for (long long i = gtid(); i < n; i += gstride()) {
        const double gi = (double)(g[i] * gs);
        const double mi = b1 * (double)m[i] + (1.0 - b1) * gi;
        const double vi = b2 * (double)v[i] + (1.0 - b2) * gi * gi;
        double pi = (double)p[i] * decay;
        pi = pi - lr * (mi / bc1) / (sqrt(vi / bc2) + eps);
        m[i] = (float)mi;
        v[i] = (float)vi;
        p[i] = (float)pi;
    }
}
