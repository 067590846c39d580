// Host driver of the CPU emulator: runs attention.cu's forward and backward entry points on
// inputs written by emu_check.py and writes the outputs back. Kernel lab only.
//   emu_main D Tq Tk Hq Hkv scale DIR
// DIR holds q.bin k.bin v.bin do.bin (bf16), fs/fe/ss/se.bin (i32); receives out.bin lse.bin
// dq.bin dk.bin dv.bin. Env: EMU_CP=0|1 (cp.async at issue | at wait), EMU_SHUFFLE=seed.
#include "emu_rt.h"
#define ATTN_EMU 1
#include "attention.cu"  // the lab's copy (lab_source.py), found through -I

#include <string>

template <class T>
static std::vector<T> rd(const std::string& p, size_t n) {
    std::vector<T> v(n);
    FILE* f = fopen(p.c_str(), "rb");
    if (!f || fread(v.data(), sizeof(T), n, f) != n) { fprintf(stderr, "read %s failed\n", p.c_str()); exit(2); }
    fclose(f);
    return v;
}
template <class T>
static void wr(const std::string& p, const std::vector<T>& v) {
    FILE* f = fopen(p.c_str(), "wb");
    fwrite(v.data(), sizeof(T), v.size(), f);
    fclose(f);
}

int main(int argc, char** argv) {
    if (argc < 8) { fprintf(stderr, "usage: emu_main D Tq Tk Hq Hkv scale DIR\n"); return 2; }
    const int D = atoi(argv[1]), Tq = atoi(argv[2]), Tk = atoi(argv[3]), Hq = atoi(argv[4]), Hkv = atoi(argv[5]);
    const float scale = (float)atof(argv[6]);
    const std::string dir = argv[7];
    if (getenv("EMU_CP")) emu::g_cp_mode = atoi(getenv("EMU_CP"));
    if (getenv("EMU_SHUFFLE")) { emu::g_shuffle = atoi(getenv("EMU_SHUFFLE")); emu::g_rng.seed(emu::g_shuffle); }

    std::vector<int> cfg(3 * ATTN_CONFIG_FIELDS, 0);
    emu::launch(1, 32, 0, [&] { attn_config(cfg.data()); });
    const int* c = nullptr;
    for (int i = 0; i < 3; i++)
        if (cfg[i * ATTN_CONFIG_FIELDS] == D) c = &cfg[i * ATTN_CONFIG_FIELDS];
    if (!c) { fprintf(stderr, "no config for D=%d\n", D); return 2; }

    auto q = rd<uint16_t>(dir + "/q.bin", (size_t)Tq * Hq * D);
    auto k = rd<uint16_t>(dir + "/k.bin", (size_t)Tk * Hkv * D);
    auto v = rd<uint16_t>(dir + "/v.bin", (size_t)Tk * Hkv * D);
    auto dO = rd<uint16_t>(dir + "/do.bin", (size_t)Tq * Hq * D);
    auto fs = rd<int>(dir + "/fs.bin", Tq), fe = rd<int>(dir + "/fe.bin", Tq);
    auto ss = rd<int>(dir + "/ss.bin", Tq), se = rd<int>(dir + "/se.bin", Tq);
    std::vector<uint16_t> out((size_t)Tq * Hq * D, 0x7fc0), dq(q.size(), 0x7fc0), dk(k.size(), 0x7fc0), dv(v.size(), 0x7fc0);
    const float qnan = __uint_as_float(0x7fc00000u);
    std::vector<float> lse((size_t)Tq * Hq, qnan);
    const int nqt = (Tq + 63) / 64;
    std::vector<float> Di((size_t)Tq * Hq, qnan), acc((size_t)Tq * Hq * D, qnan);
    std::vector<int> summ(nqt * 8, 0x1234567);

    const int BM = c[1], fthr = c[2], fsm = c[3], BN = c[4], bthr = c[5], bsm = c[6], pthr = c[8];
    auto fwd = attn_fwd_d128;
    auto pre = attn_bwd_pre_d128;
    auto dkdv = attn_bwd_dkdv_d128;
#ifndef ATTN_ONLY_D128
    if (D == 64) { fwd = attn_fwd_d64; pre = attn_bwd_pre_d64; dkdv = attn_bwd_dkdv_d64; }
    if (D == 256) { fwd = attn_fwd_d256; pre = attn_bwd_pre_d256; dkdv = attn_bwd_dkdv_d256; }
#endif
    typedef const bf16_t* P;
    emu::launch((Tq + BM - 1) / BM * Hq, fthr, fsm, [&] {
        fwd((P)q.data(), (P)k.data(), (P)v.data(), fs.data(), fe.data(), ss.data(), se.data(), (bf16_t*)out.data(),
            lse.data(), nullptr /* work: the mma.sync forward takes one item per CTA */, Tq, Tk, Hq, Hkv, scale,
            1 /* hgroup */, TmaDesc{}, TmaDesc{}, TmaDesc{});
    });
    emu::launch(nqt * Hq, pthr, 0, [&] {
        pre((P)out.data(), (P)dO.data(), fs.data(), fe.data(), ss.data(), se.data(), Di.data(), acc.data(), summ.data(), Tq, Hq);
    });
    emu::launch((Tk + BN - 1) / BN * Hkv, bthr, bsm, [&] {
        dkdv((P)q.data(), (P)k.data(), (P)v.data(), (P)dO.data(), lse.data(), Di.data(), summ.data(), fs.data(), fe.data(),
             ss.data(), se.data(), acc.data(), (bf16_t*)dk.data(), (bf16_t*)dv.data(), Tq, Tk, Hq, Hkv, scale,
             1 /* hgroup: one kv head per group, the order furthest from one group */, TmaDesc{}, TmaDesc{},
             TmaDesc{});  // (tensor maps: used by the wgmma kernel only, not emulated)
    });
    long long n = (long long)Tq * Hq * D;
    emu::launch((int)((n / 4 + 255) / 256), 256, 0, [&] { attn_bwd_dq_convert(acc.data(), (bf16_t*)dq.data(), n, scale); });

    wr(dir + "/out.bin", out);
    wr(dir + "/lse.bin", lse);
    wr(dir + "/dq.bin", dq);
    wr(dir + "/dk.bin", dk);
    wr(dir + "/dv.bin", dv);
    return 0;
}
