// CPU emulator checks of the memory-bound kernels (kernel lab only). Built by ew_check.py, which
// concatenates ew_rt.h, common.cuh, vec.cuh and the kernel files into ew_src.h first.
//
// Each kernel runs with the launch the Rust side uses, on buffers with NaN guard zones on both
// sides (a stray read shows up as NaN, a stray write as a changed guard), outputs poisoned, for
// every dtype instantiation, and (a) 16-byte-aligned pointers (vector path + scalar tail),
// (b) pointers one element off (the scalar fallback), (c) a small grid (grid-stride loops).
// Elementwise results must be bit-identical to a host evaluation of the same f32 formula
// (rounded once); RMSNorm (whose sums run in another order per path) within tolerance of an f64
// reference, and vector vs scalar path within the same.
#include "ew_src.h"

#include <string>
#include <type_traits>

static int g_fail = 0, g_checks = 0;
static std::mt19937_64 g_rng(12345);

template <class T>
constexpr bool is_bf() { return std::is_same<T, df_bf16>::value; }
static inline float bf_round(float v) { return __uint_as_float(df_bf16_bits(v) << 16); }
template <class T>
static inline float rnd_as(float v) { return is_bf<T>() ? bf_round(v) : v; }
template <class T>
static const char* dn() { return is_bf<T>() ? "b" : "f"; }

static const size_t GUARD = 64;  // elements on each side

// n elements of T at a chosen misalignment (0: 64-byte aligned, k: k elements past it),
// with NaN guards.
template <class T>
struct Buf {
    std::vector<T> mem;
    size_t n, off;
    T* base;
    Buf(size_t n_, size_t mis = 0) : n(n_) {
        mem.resize(n + 2 * GUARD + 64);
        uintptr_t a = (uintptr_t)mem.data();
        size_t skip = ((64 - (a & 63)) & 63) / sizeof(T);
        off = skip + GUARD + mis;
        base = mem.data();
        T nanv;
        if (is_bf<T>()) { uint16_t q = 0x7fc0; memcpy(&nanv, &q, sizeof(T)); }
        else { float f = NAN; memcpy(&nanv, &f, sizeof(T)); }
        for (auto& x : mem) x = nanv;
    }
    T* p() { return base + off; }
    float get(size_t i) const {
        if (is_bf<T>()) { uint16_t u; memcpy(&u, &base[off + i], 2); return __uint_as_float((unsigned)u << 16); }
        float f; memcpy(&f, &base[off + i], 4); return f;
    }
    void set(size_t i, float v) {
        if (is_bf<T>()) { uint16_t u = (uint16_t)df_bf16_bits(v); memcpy(&base[off + i], &u, 2); }
        else memcpy(&base[off + i], &v, 4);
    }
    bool guards_ok() const {
        for (size_t i = 0; i < mem.size(); i++) {
            if (i >= off && i < off + n) continue;
            if (is_bf<T>()) { uint16_t u; memcpy(&u, &mem[i], 2); if (u != 0x7fc0) return false; }
            else { uint32_t u; memcpy(&u, &mem[i], 4); if ((u & 0x7fffffff) <= 0x7f800000) return false; }
        }
        return true;
    }
    void poison() { for (size_t i = 0; i < n; i++) set(i, NAN); }
};

template <class T>
static void fill_rand(Buf<T>& b, float scale) {
    std::normal_distribution<float> d(0.f, scale);
    for (size_t i = 0; i < b.n; i++) b.set(i, d(g_rng));
}

static void fail(const std::string& what) {
    if (g_fail < 60) fprintf(stderr, "FAIL %s\n", what.c_str());
    g_fail++;
}

// Bit-exact check of out against want (host floats already rounded to the output type).
template <class T>
static void check_exact(const std::string& tag, const Buf<T>& out, const std::vector<float>& want) {
    g_checks++;
    if (!out.guards_ok()) { fail(tag + ": guard zone written"); return; }
    for (size_t i = 0; i < want.size(); i++) {
        float g = out.get(i);
        uint32_t a = __float_as_uint(g), b = __float_as_uint(want[i]);
        if (a != b && !(g != g && want[i] != want[i])) {
            char m[256];
            snprintf(m, sizeof m, "%s: element %zu of %zu: got %.9g want %.9g", tag.c_str(), i, want.size(), g, want[i]);
            fail(m);
            return;
        }
    }
}

// Tolerance check: |got - want| <= rtol * |want| + atol (+ one bf16 rounding when bf16 out).
template <class T>
static void check_tol(const std::string& tag, const Buf<T>& out, const std::vector<double>& want, double rtol,
                      double atol) {
    g_checks++;
    if (!out.guards_ok()) { fail(tag + ": guard zone written"); return; }
    double worst = 0;
    for (size_t i = 0; i < want.size(); i++) {
        double g = out.get(i), w = want[i];
        double tol = rtol * fabs(w) + atol + (is_bf<T>() ? fabs(w) * (1.0 / 256) : 0.0);
        double e = fabs(g - w);
        if (!(e <= tol)) {
            char m[256];
            snprintf(m, sizeof m, "%s: element %zu of %zu: got %.9g want %.9g", tag.c_str(), i, want.size(), g, w);
            fail(m);
            return;
        }
        worst = std::max(worst, e / tol);
    }
}

static EwDim d1(unsigned x) { return {x, 1, 1}; }
static unsigned div_up(size_t a, size_t b) { return (unsigned)((a + b - 1) / b); }
// grid_vec8(n) of lib.rs: ceil(ceil(n/8)/256) blocks (clamped 1..65536) of 256.
static EwDim grid_vec8(size_t n) { return d1(std::max(1u, std::min(65536u, div_up(div_up(n, 8), 256)))); }

// Launch variants: (mis, grid, block) = aligned Rust launch; misaligned (scalar); aligned tiny grid.
struct Var { size_t mis; bool small; const char* name; };
static const Var VARS[] = {{0, false, "vec"}, {1, false, "mis"}, {0, true, "small-grid"}};

// ------------------------------------------------------------------------------------------
template <class TO, class TA, class TB>
static void test_add(size_t n) {
    for (const Var& v : VARS) {
        Buf<TA> a(n, v.mis);
        Buf<TB> b(n, v.mis);
        Buf<TO> o(n, v.mis);
        fill_rand(a, 3.f);
        fill_rand(b, 3.f);
        std::vector<float> want(n);
        for (size_t i = 0; i < n; i++) want[i] = rnd_as<TO>(a.get(i) + b.get(i));
        EwDim g = v.small ? d1(1) : grid_vec8(n), bl = d1(v.small ? 32 : 256);
        ew::launch(g, bl, 0, [&] { add_t(o.p(), (const TA*)a.p(), (const TB*)b.p(), (long long)n); });
        check_exact(std::string("add_") + dn<TO>() + dn<TA>() + dn<TB>() + " n=" + std::to_string(n) + " " + v.name, o, want);
    }
}

template <class TA, class TX>
static void test_add_assign_scale(size_t n) {
    for (const Var& v : VARS) {
        Buf<TA> a(n, v.mis);
        Buf<TX> x(n, v.mis);
        fill_rand(a, 3.f);
        fill_rand(x, 3.f);
        std::vector<float> want(n), want2(n);
        for (size_t i = 0; i < n; i++) want[i] = rnd_as<TA>(a.get(i) + x.get(i));
        for (size_t i = 0; i < n; i++) want2[i] = rnd_as<TA>(want[i] * -0.37f);
        EwDim g = v.small ? d1(1) : grid_vec8(n), bl = d1(v.small ? 32 : 256);
        ew::launch(g, bl, 0, [&] { add_assign_t(a.p(), (const TX*)x.p(), (long long)n); });
        std::string tag = std::string("_") + dn<TA>() + dn<TX>() + " n=" + std::to_string(n) + " " + v.name;
        check_exact("add_assign" + tag, a, want);
        ew::launch(g, bl, 0, [&] { scale_t(a.p(), (long long)n, -0.37f); });
        check_exact("scale" + tag, a, want2);
    }
}

// ------------------------------------------------------------------------------------------
template <class TO, class TI>
static void test_swiglu(size_t n) {
    for (const Var& v : VARS) {
        Buf<TI> g(n, v.mis), u(n, v.mis), dh(n, v.mis);
        Buf<TO> h(n, v.mis), dg(n, v.mis), du(n, v.mis);
        fill_rand(g, 8.f);
        fill_rand(u, 2.f);
        fill_rand(dh, 1.f);
        std::vector<float> wh(n), wdg(n), wdu(n);
        for (size_t i = 0; i < n; i++) {
            const float gi = g.get(i), ui = u.get(i), d = dh.get(i);
            const float s = 1.0f / (1.0f + expf(-gi));
            wh[i] = rnd_as<TO>(gi * s * ui);
            wdu[i] = rnd_as<TO>(d * gi * s);
            wdg[i] = rnd_as<TO>(d * ui * s * (1.0f + gi * (1.0f - s)));
        }
        EwDim gr = v.small ? d1(1) : grid_vec8(n), bl = d1(v.small ? 32 : 256);
        ew::launch(gr, bl, 0, [&] { swiglu_fwd_t(h.p(), (const TI*)g.p(), (const TI*)u.p(), (long long)n); });
        ew::launch(gr, bl, 0, [&] {
            swiglu_bwd_t(dg.p(), du.p(), (const TI*)dh.p(), (const TI*)g.p(), (const TI*)u.p(), (long long)n);
        });
        std::string tag = std::string("_") + dn<TO>() + dn<TI>() + " n=" + std::to_string(n) + " " + v.name;
        check_exact("swiglu_fwd" + tag, h, wh);
        check_exact("swiglu_bwd dg" + tag, dg, wdg);
        check_exact("swiglu_bwd du" + tag, du, wdu);
    }
}

// ------------------------------------------------------------------------------------------
template <class TO, class TT>
static void test_embedding(size_t V, size_t H, size_t T) {
    for (const Var& v : VARS) {
        Buf<TT> tab(V * H, v.mis);
        Buf<TO> out(T * H, v.mis);
        fill_rand(tab, 4.f);
        std::vector<int> ids(T);
        for (auto& i : ids) i = (int)(g_rng() % V);
        std::vector<float> want(T * H);
        for (size_t t = 0; t < T; t++)
            for (size_t c = 0; c < H; c++) want[t * H + c] = rnd_as<TO>(tab.get((size_t)ids[t] * H + c));
        EwDim g = v.small ? d1(1) : grid_vec8(T * H), bl = d1(v.small ? 32 : 256);
        ew::launch(g, bl, 0, [&] { embedding_gather_t(out.p(), (const TT*)tab.p(), ids.data(), (long long)T, (long long)H); });
        check_exact(std::string("embedding_") + dn<TO>() + dn<TT>() + " V=" + std::to_string(V) + " H=" +
                        std::to_string(H) + " " + v.name, out, want);
    }
}

// ------------------------------------------------------------------------------------------
template <class TY, class TX>
static void test_rope(size_t T, int heads, int D, double theta) {
    const int half = D / 2;
    for (const Var& v : VARS) {
        if (v.small) continue;  // one block per token already
        Buf<TX> x(T * heads * D, v.mis);
        Buf<TY> y(T * heads * D, v.mis);
        fill_rand(x, 1.f);
        std::vector<int> pos(T);
        for (auto& p : pos) p = (int)(g_rng() % 8192);
        for (float sign : {1.0f, -1.0f}) {
            y.poison();
            std::vector<float> want(T * heads * D);
            for (size_t t = 0; t < T; t++) {
                for (int i = 0; i < half; i++) {
                    const double inv = pow(theta, -((double)(2 * i)) / (double)D);
                    double s, c;
                    sincos((double)pos[t] * inv, &s, &c);
                    const float cf = (float)c, sf = sign * (float)s;
                    for (int h = 0; h < heads; h++) {
                        size_t o = (t * heads + h) * D;
                        float x1 = x.get(o + i), x2 = x.get(o + i + half);
                        want[o + i] = rnd_as<TY>(x1 * cf - x2 * sf);
                        want[o + i + half] = rnd_as<TY>(x2 * cf + x1 * sf);
                    }
                }
            }
            // rope.rs: one thread per pair or per 8 pairs, warp multiple in [32, 256].
            size_t items = (size_t)heads * D / 2 / ((D / 2) % 8 == 0 ? 8 : 1);
            unsigned threads = std::min(256u, std::max(32u, div_up(items, 32) * 32));
            ew::launch(d1((unsigned)T), d1(threads), D * 4, [&] {
                rope_rotate_t(y.p(), (const TX*)x.p(), pos.data(), heads, D, theta, sign);
            });
            check_exact(std::string("rope_") + dn<TY>() + dn<TX>() + " T=" + std::to_string(T) + " heads=" +
                            std::to_string(heads) + " D=" + std::to_string(D) + " sign " + std::to_string((int)sign) +
                            " " + v.name, y, want);
        }
    }
}

// ------------------------------------------------------------------------------------------
static void test_adamw(size_t n) {
    for (const Var& v : VARS) {
        Buf<float> p(n, v.mis), m(n, v.mis), vv(n, v.mis), g(n, v.mis);
        fill_rand(p, 1.f);
        fill_rand(m, 0.1f);
        fill_rand(g, 1.f);
        for (size_t i = 0; i < n; i++) vv.set(i, fabsf(m.get(i)) * 0.3f);
        const float gs = 0.7f;
        const double lr = 1e-3, b1 = 0.9, b2 = 0.999, eps = 1e-8, decay = 1 - 1e-3 * 0.01, bc1 = 1 - 0.9 * 0.9,
                     bc2 = 1 - 0.999 * 0.999;
        std::vector<float> wp(n), wm(n), wv(n);
        for (size_t i = 0; i < n; i++) {
            const double gi = (double)(g.get(i) * gs);
            const double mi = b1 * (double)m.get(i) + (1.0 - b1) * gi;
            const double vi = b2 * (double)vv.get(i) + (1.0 - b2) * gi * gi;
            double pi = (double)p.get(i) * decay;
            pi = pi - lr * (mi / bc1) / (sqrt(vi / bc2) + eps);
            wp[i] = (float)pi;
            wm[i] = (float)mi;
            wv[i] = (float)vi;
        }
        // optimizer.rs: grid1d(ceil(n / 4))
        EwDim gr = v.small ? d1(1) : d1(std::max(1u, div_up(div_up(n, 4), 256))), bl = d1(v.small ? 32 : 256);
        ew::launch(gr, bl, 0, [&] {
            adamw_f32(p.p(), m.p(), vv.p(), (const float*)g.p(), gs, (long long)n, lr, b1, b2, eps, decay, bc1, bc2);
        });
        std::string tag = " n=" + std::to_string(n) + " " + v.name;
        check_exact("adamw p" + tag, p, wp);
        check_exact("adamw m" + tag, m, wm);
        check_exact("adamw v" + tag, vv, wv);
    }
}

// ------------------------------------------------------------------------------------------
// norm.rs's norm_launch.
static void norm_launch(size_t r, size_t c, EwDim& grid, EwDim& block, int& G) {
    size_t per_lane = std::max<size_t>(1, (((c + 7) / 8) + 3) / 4);
    size_t g, rpb;
    if (per_lane <= 32) {
        g = 1;
        while (g < per_lane) g <<= 1;
        rpb = 256 / g;
    } else {
        g = std::min<size_t>((per_lane + 31) / 32, 16) * 32;  // NORM_MAX_LANES = 512
        rpb = 1;
    }
    grid = d1(div_up(r, rpb));
    block = d1(g <= 32 ? 256 : (unsigned)g);
    G = (int)g;
}

template <class TY, class TX>
static void test_norm_fwd(size_t R, size_t C) {
    for (const Var& v : VARS) {
        if (v.small) continue;
        Buf<TX> x(R * C, v.mis);
        Buf<TY> y(R * C, v.mis);
        Buf<float> w(C, v.mis), rstd(R, v.mis);
        fill_rand(x, 2.f);
        for (size_t c = 0; c < C; c++) w.set(c, 1.f + 0.5f * std::normal_distribution<float>(0, 1)(g_rng));
        const float eps = 1e-6f;
        std::vector<double> wy(R * C), wr(R);
        for (size_t r = 0; r < R; r++) {
            double ss = 0;
            for (size_t c = 0; c < C; c++) ss += (double)x.get(r * C + c) * x.get(r * C + c);
            double rs = 1.0 / sqrt(ss / C + eps);
            wr[r] = rs;
            for (size_t c = 0; c < C; c++) wy[r * C + c] = x.get(r * C + c) * rs * w.get(c);
        }
        EwDim g, b;
        int G;
        norm_launch(R, C, g, b, G);
        ew::launch(g, b, 0, [&] {
            rms_norm_fwd_t(y.p(), rstd.p(), (const TX*)x.p(), (const float*)w.p(), (long long)R, (int)C, eps, G);
        });
        std::string tag = std::string("_") + dn<TY>() + dn<TX>() + " " + std::to_string(R) + "x" + std::to_string(C) +
                          " G=" + std::to_string(G) + " " + v.name;
        check_tol("rms_norm_fwd y" + tag, y, wy, 1e-5, 1e-6);
        check_tol("rms_norm_fwd rstd" + tag, rstd, wr, 1e-5, 0);
    }
}

template <class TD, class TG, class TX>
static void test_norm_bwd(size_t R, size_t C) {
    for (const Var& v : VARS) {
        if (v.small) continue;
        Buf<TX> x(R * C, v.mis);
        Buf<TG> dy(R * C, v.mis);
        Buf<TD> dx(R * C, v.mis);
        Buf<float> w(C, v.mis), rstd(R, v.mis), dw(C, v.mis);
        fill_rand(x, 2.f);
        fill_rand(dy, 1.f);
        for (size_t c = 0; c < C; c++) w.set(c, 1.f + 0.5f * std::normal_distribution<float>(0, 1)(g_rng));
        for (size_t r = 0; r < R; r++) {
            double ss = 0;
            for (size_t c = 0; c < C; c++) ss += (double)x.get(r * C + c) * x.get(r * C + c);
            rstd.set(r, (float)(1.0 / sqrt(ss / C + 1e-6)));
        }
        std::vector<double> wdx(R * C), wdw(C, 0.0);
        double maxdx = 0, maxdw = 0;
        for (size_t r = 0; r < R; r++) {
            double rs = rstd.get(r), dot = 0;
            for (size_t c = 0; c < C; c++) dot += (double)dy.get(r * C + c) * w.get(c) * x.get(r * C + c);
            dot = dot * rs / C;
            for (size_t c = 0; c < C; c++) {
                double gx = dy.get(r * C + c), xx = x.get(r * C + c);
                wdx[r * C + c] = rs * (gx * w.get(c) - xx * rs * dot);
                // scale of the terms that cancel (C = 1: dx is ~0 by cancellation)
                maxdx = std::max(maxdx, fabs(rs * gx * w.get(c)));
                wdw[c] += gx * xx * rs;
            }
        }
        for (double d : wdw) maxdw = std::max(maxdw, fabs(d));
        EwDim g, b;
        int G;
        norm_launch(R, C, g, b, G);
        ew::launch(g, b, 0, [&] {
            rms_norm_bwd_dx_t(dx.p(), (const TG*)dy.p(), (const TX*)x.p(), (const float*)w.p(), (const float*)rstd.p(),
                              (long long)R, (int)C, G);
        });
        // norm.rs: splits = min(ceil(R / 256), 4096), rps = ceil(R / splits); grid (ceil(C/256), splits), block (32, 8).
        size_t splits = std::min<size_t>((R + 255) / 256, 4096), rps = (R + splits - 1) / splits;
        Buf<float> partial(splits * C, v.mis);
        ew::launch({div_up(C, 256), (unsigned)splits, 1}, {32, 8, 1}, 0, [&] {
            rms_norm_bwd_dw_partial_t(partial.p(), (const TG*)dy.p(), (const TX*)x.p(), (const float*)rstd.p(),
                                      (long long)R, (int)C, (long long)rps);
        });
        ew::launch(d1(div_up(C, 256)), d1(256), 0, [&] {
            rms_norm_bwd_dw_final(dw.p(), (const float*)partial.p(), (int)splits, (int)C);
        });
        std::string tag = std::string("_") + dn<TD>() + dn<TG>() + dn<TX>() + " " + std::to_string(R) + "x" +
                          std::to_string(C) + " G=" + std::to_string(G) + " " + v.name;
        check_tol("rms_norm_bwd dx" + tag, dx, wdx, 1e-4, 1e-5 * maxdx);
        check_tol("rms_norm_bwd dw" + tag, dw, wdw, 1e-4, 1e-5 * maxdw);
        g_checks++;
        if (!partial.guards_ok()) fail("rms_norm_bwd partial guards" + tag);
    }
}

// ------------------------------------------------------------------------------------------
// ce_rows: per-row CE, argmax and dlogits against an f64 evaluation of the same f32 logits.
// Rows: random (scale 3), a tie for the max (lowest index wins), one finite logit among -inf
// (CE 0 at its label), a NaN logit (CE NaN, the NaN never the argmax). The dlogits go to a
// separate bf16 matrix or over the f32 logits in place, as loss.rs launches them.
template <class TD>
static void test_ce_rows(size_t R, size_t V, size_t mis) {
    const bool bf = is_bf<TD>();
    Buf<float> lg(R * V, mis);
    Buf<TD> dlb(bf ? R * V : 1, 0);
    fill_rand(lg, 3.f);
    std::vector<int> lab(R), ok(R, -1);
    std::vector<float> wt(R);
    std::vector<double> ce(R, -1.0);
    for (size_t r = 0; r < R; r++) {
        lab[r] = (int)(g_rng() % V);
        wt[r] = 0.5f + (float)(g_rng() % 1000) / 1000.f;
    }
    const size_t tie = 0, lone = 1 % R, nanr = 2 % R;
    lg.set(tie * V + V / 3, 40.f);
    lg.set(tie * V + V / 2, 40.f);
    if (V / 3 != V / 2) lab[tie] = (int)(V / 3);  // correct only if the lower index wins the tie
    lab[3 % R] = (int)(V - 1);
    lg.set((3 % R) * V + V - 1, 30.f);  // the max in the last vector, at the label
    for (size_t c = 0; c < V; c++) lg.set(lone * V + c, -INFINITY);
    lg.set(lone * V + lab[lone], 1.5f);
    lg.set(nanr * V + V - 1, NAN);
    const float gs = 1.f / (float)R;
    std::vector<double> wdl(R * V), wce(R);
    std::vector<int> wam(R);
    for (size_t r = 0; r < R; r++) {
        double m = -INFINITY;
        int am = 0;
        for (size_t c = 0; c < V; c++) {
            double z = lg.get(r * V + c);
            if (z > m) { m = z; am = (int)c; }
        }
        double sum = 0;
        for (size_t c = 0; c < V; c++) sum += exp((double)lg.get(r * V + c) - m);
        const double lse = m + log(sum);
        wce[r] = lse - lg.get(r * V + lab[r]);
        wam[r] = am;
        for (size_t c = 0; c < V; c++)
            wdl[r * V + c] = (double)gs * wt[r] * (exp(lg.get(r * V + c) - lse) - (c == (size_t)lab[r] ? 1.0 : 0.0));
    }
    void* dl = bf ? (void*)dlb.p() : (void*)lg.p();
    const int dl_bf16 = bf ? 1 : 0;
    ew::launch(d1((unsigned)R), d1(256), 0, [&] {
        ce_rows(lg.p(), dl, dl_bf16, lab.data(), wt.data(), (int)V, gs, ce.data(), ok.data());
    });
    const std::string tag = std::string("ce_rows_") + dn<TD>() + " " + std::to_string(R) + "x" +
                            std::to_string(V) + (mis ? " mis" : "");
    g_checks++;
    for (size_t r = 0; r < R; r++) {
        const bool want_nan = r == nanr;
        const bool ce_ok = want_nan ? ce[r] != ce[r] : fabs(ce[r] - wce[r]) <= 1e-6 * (1.0 + fabs(wce[r]));
        if (!ce_ok || ok[r] != (wam[r] == lab[r] ? 1 : 0)) {
            char m[256];
            snprintf(m, sizeof m, "%s: row %zu: ce %.9g (want %.9g), correct %d (argmax %d, label %d)", tag.c_str(), r,
                     ce[r], want_nan ? NAN : wce[r], ok[r], wam[r], lab[r]);
            fail(m);
        }
    }
    // the NaN row's dlogits are NaN by construction: compare the others
    std::vector<double> want;
    Buf<TD> got(R * V - V, 0);
    for (size_t r = 0; r < R; r++) {
        if (r == nanr) continue;
        for (size_t c = 0; c < V; c++) {
            const size_t i = r * V + c;
            want.push_back(wdl[i]);
            got.set(want.size() - 1, bf ? dlb.get(i) : lg.get(i));
        }
    }
    if (bf && !dlb.guards_ok()) fail(tag + ": dlogits guard zone written");
    if (!lg.guards_ok()) fail(tag + ": logits guard zone written");
    // f32 exps against f64: ~1e-6 relative at |lse| ~ 20 (lse rounded to f32 once); where
    // p ~ 1 (the label at the max), p - 1 cancels to a few f32 ulps of 1, times gw.
    check_tol(tag + " dlogits", got, want, 2e-6, 4e-7 * gs * 1.5);
}

int main(int argc, char** argv) {
    const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
    for (size_t n : {1, 7, 8, 9, 64, 1073, 4099}) {
#define T_ADD(O, A, B) test_add<DF_T_##O, DF_T_##A, DF_T_##B>(n);
        DF_INST8(T_ADD)
#define T_ADDA(A, X) test_add_assign_scale<DF_T_##A, DF_T_##X>(n);
        DF_INST4(T_ADDA)
#define T_SWIGLU(O, I) test_swiglu<DF_T_##O, DF_T_##I>(n);
        DF_INST4(T_SWIGLU)
    }
    fprintf(stderr, "elementwise + swiglu: %d checks, %d failures (%lld vector accesses so far)\n", g_checks, g_fail, ew::g_vec);
    for (auto vh : {std::pair<size_t, size_t>{100, 96}, {77, 97}, {5, 1}, {9, 8}, {30, 24}}) {
#define T_EMB(O, W) test_embedding<DF_T_##O, DF_T_##W>(vh.first, vh.second, 37);
        DF_INST4(T_EMB)
    }
    fprintf(stderr, "+ embedding: %d checks, %d failures (%lld vector accesses so far)\n", g_checks, g_fail, ew::g_vec);
    for (size_t n : {1, 3, 4, 5, 1001, 4099}) test_adamw(n);
    fprintf(stderr, "+ adamw: %d checks, %d failures (%lld vector accesses so far)\n", g_checks, g_fail, ew::g_vec);
    struct RC { size_t t; int h, d; double th; };
    for (RC rc : {RC{5, 4, 8, 1e4}, RC{7, 3, 128, 1e6}, RC{3, 2, 64, 1e4}, RC{4, 1, 256, 5e5}, RC{6, 3, 20, 1e4},
                  RC{3, 5, 16, 1e4}, RC{2, 40, 128, 1e6}}) {
#define T_ROPE(Y, X) test_rope<DF_T_##Y, DF_T_##X>(rc.t, rc.h, rc.d, rc.th);
        DF_INST4(T_ROPE)
    }
    fprintf(stderr, "+ rope: %d checks, %d failures (%lld vector accesses so far)\n", g_checks, g_fail, ew::g_vec);
    std::vector<std::pair<size_t, size_t>> shapes = {{13, 24}, {300, 64}, {5, 1000}, {1, 7}, {37, 100}, {70, 128},
                                                     {9, 8}, {3, 1}, {4, 1032}, {3, 4096}, {2, 8200}, {600, 40}};
    if (!quick) shapes.push_back({2, 40000});
    if (!quick) shapes.push_back({2, 16384});  // the widest vector-path row (512 lanes)
    if (!quick) shapes.push_back({2, 20000});  // scalar path at 512 lanes
    for (auto rc : shapes) {
#define T_NF(Y, X) test_norm_fwd<DF_T_##Y, DF_T_##X>(rc.first, rc.second);
        DF_INST4(T_NF)
#define T_NB(D, G, X) test_norm_bwd<DF_T_##D, DF_T_##G, DF_T_##X>(rc.first, rc.second);
        DF_INST8(T_NB)
    }
    fprintf(stderr, "+ rms_norm: %d checks, %d failures (%lld vector accesses so far)\n", g_checks, g_fail, ew::g_vec);
    for (size_t v : {1000, 1003, 4, 7, 4096}) {
        for (size_t mis : {0, 1}) {
            test_ce_rows<float>(5, v, mis);
            test_ce_rows<df_bf16>(5, v, mis);
        }
    }
    if (!quick) test_ce_rows<df_bf16>(3, 151936, 0);
    fprintf(stderr, "+ ce_rows: %d checks, %d failures (%lld vector accesses so far)\n", g_checks, g_fail, ew::g_vec);
    printf("%d checks, %d failures\n", g_checks, g_fail);
    return g_fail ? 1 : 0;
}
