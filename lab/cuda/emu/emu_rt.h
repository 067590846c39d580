// CPU emulator runtime for backends/cuda/kernels/attention.cu (kernel lab only, never shipped).
//
// Each CUDA thread of a block is a ucontext coroutine on one OS thread; a thread yields only at
// synchronisation points (__syncthreads, and every warp-collective: shuffles, ballots, ldmatrix,
// mma), so warp-collectives see all 32 lanes' operands exactly as the hardware does. Fragment
// layouts of ldmatrix (plain and .trans) and mma.m16n8k16 follow the PTX ISA definitions.
// Blocks run one after another. Extra checks the GPU cannot give cheaply:
//  - a barrier or warp-collective reached by only part of a block/warp is a deadlock: reported;
//  - cp.async copies are either performed at issue (EMU_CP=0) or deferred to the wait that
//    retires their group (EMU_CP=1), so reads before the right wait see stale data; with
//    EMU_SHUFFLE a thread also lags a random number of passes at its wait, so a missing barrier
//    after the wait lets other warps read smem that is not filled yet;
//  - the order in which threads run between sync points can be shuffled (EMU_SHUFFLE=seed);
//  - dynamic shared memory starts filled with 0xFF (bf16/f32 NaN) for every block.
#pragma once
#include "cuda_shim.h"

struct EmuDim { unsigned x, y, z; };

namespace emu {
struct Thread {
    ucontext_t ctx;
    EmuDim tidx;
    bool done;
    // cp.async groups (EMU_CP=1): pending committed groups and the open one
    struct Copy { unsigned dst; const void* src; int n, bytes; };
    std::vector<std::vector<Copy>> groups;
    std::vector<Copy> open;
    uint32_t nwait = 0;
};
struct Sync { int count = 0; long gen = 0; };

inline ucontext_t g_main;
inline std::vector<Thread> g_th;
inline std::vector<char*> g_stacks;
inline Thread* g_cur = nullptr;
inline EmuDim g_blk = {0, 0, 0};
inline unsigned char* g_smem = nullptr;
inline std::vector<unsigned char> g_smem_buf;
inline int g_nthreads = 0;
inline Sync g_block_sync;
inline Sync g_warp_sync[32];
inline uint32_t g_ex[32][32][8];  // per warp, per lane exchange slots
inline bool g_progress = false;
inline std::function<void()> g_body;
inline int g_cp_mode = 0;
inline unsigned g_shuffle = 0;
inline std::mt19937 g_rng(1);
const size_t STACK = 256 * 1024;

inline void yield() { swapcontext(&g_cur->ctx, &g_main); }
inline void arrive(Sync& s, int n) {
    long g = s.gen;
    if (++s.count == n) {
        s.count = 0;
        s.gen++;
        g_progress = true;
    } else {
        while (s.gen == g) yield();
        g_progress = true;
    }
}
inline int lane() { return g_cur->tidx.x & 31; }
inline int warp() { return g_cur->tidx.x >> 5; }
inline void warp_sync() { arrive(g_warp_sync[warp()], 32); }

inline void do_copy(const Thread::Copy& c) {
    if (c.n) memcpy(g_smem + c.dst, c.src, c.bytes);
    else memset(g_smem + c.dst, 0, c.bytes);
}

inline void trampoline(int i) {
    g_body();
    g_th[i].done = true;
    g_progress = true;
    swapcontext(&g_th[i].ctx, &g_main);
}

inline void launch(int grid, int block, size_t smem_bytes, std::function<void()> body) {
    if (g_stacks.size() < (size_t)block)
        for (size_t i = g_stacks.size(); i < (size_t)block; i++) g_stacks.push_back((char*)malloc(STACK));
    g_body = body;
    for (int b = 0; b < grid; b++) {
        g_blk = {(unsigned)b, 0, 0};
        g_smem_buf.assign(smem_bytes + 16, 0xFF);
        g_smem = g_smem_buf.data();
        g_th.assign(block, Thread());
        g_nthreads = block;
        g_block_sync = Sync();
        for (auto& w : g_warp_sync) w = Sync();
        for (int i = 0; i < block; i++) {
            Thread& t = g_th[i];
            t.tidx = {(unsigned)i, 0, 0};
            t.done = false;
            getcontext(&t.ctx);
            t.ctx.uc_stack.ss_sp = g_stacks[i];
            t.ctx.uc_stack.ss_size = STACK;
            t.ctx.uc_link = nullptr;
            makecontext(&t.ctx, (void (*)())trampoline, 1, i);
        }
        std::vector<int> order(block);
        for (int i = 0; i < block; i++) order[i] = i;
        int stall = 0;
        for (;;) {
            bool alive = false;
            g_progress = false;
            if (g_shuffle) std::shuffle(order.begin(), order.end(), g_rng);
            for (int i : order) {
                if (g_th[i].done) continue;
                alive = true;
                g_cur = &g_th[i];
                swapcontext(&g_main, &g_th[i].ctx);
            }
            if (!alive) break;
            if (!g_progress) {
                if (++stall > 3) {
                    fprintf(stderr, "EMU DEADLOCK in block %d: threads wait at a barrier/collective others never reach\n", b);
                    for (int i = 0; i < block; i++)
                        if (!g_th[i].done) fprintf(stderr, "  thread %d alive\n", i);
                    exit(3);
                }
            } else {
                stall = 0;
            }
        }
        for (auto& t : g_th)
            if (!t.groups.empty() || !t.open.empty()) {
                fprintf(stderr, "EMU: block %d exits with cp.async groups not waited for\n", b);
                exit(4);
            }
    }
    g_cur = nullptr;
}
}  // namespace emu

#define threadIdx (emu::g_cur->tidx)
#define blockIdx (emu::g_blk)
#define ATTN_DYN_SMEM unsigned char* smem = emu::g_smem

inline void __syncthreads() { emu::arrive(emu::g_block_sync, emu::g_nthreads); }

template <class T>
inline T __shfl_xor_sync(unsigned, T v, int m) {
    static_assert(sizeof(T) == 4, "32-bit shuffles only");
    int w = emu::warp(), l = emu::lane();
    memcpy(&emu::g_ex[w][l][0], &v, 4);
    emu::warp_sync();
    T r;
    memcpy(&r, &emu::g_ex[w][l ^ m][0], 4);
    emu::warp_sync();
    return r;
}
inline unsigned __ballot_sync(unsigned, bool p) {
    int w = emu::warp(), l = emu::lane();
    emu::g_ex[w][l][0] = p ? 1u : 0u;
    emu::warp_sync();
    unsigned r = 0;
    for (int i = 0; i < 32; i++) r |= (emu::g_ex[w][i][0] & 1u) << i;
    emu::warp_sync();
    return r;
}

typedef unsigned int u32;
static inline u32 smem_u32(const void* p) { return (u32)((const unsigned char*)p - emu::g_smem); }
static inline void cp_async_n(u32 dst, const void* src, bool pred, int bytes) {
    emu::Thread::Copy c{dst, src, pred ? 1 : 0, bytes};
    if (emu::g_cp_mode == 0) emu::do_copy(c);
    else emu::g_cur->open.push_back(c);
}
static inline void cp_async16(u32 dst, const void* src, bool pred) { cp_async_n(dst, src, pred, 16); }
static inline void cp_async4(u32 dst, const void* src, bool pred) { cp_async_n(dst, src, pred, 4); }
static inline void cp_async_commit() {
    if (emu::g_cp_mode == 0) return;
    emu::g_cur->groups.push_back(emu::g_cur->open);
    emu::g_cur->open.clear();
}
template <int N>
static inline void cp_async_wait() {
    auto& g = emu::g_cur->groups;
    if (emu::g_shuffle && (emu::g_cp_mode == 0 || (int)g.size() > N)) {  // this warp lags behind: other warps may run ahead
        uint32_t h = emu::g_shuffle * 0x9E3779B1u ^ (emu::g_blk.x * 0x85EBCA77u) ^ (emu::warp() * 0xC2B2AE3Du) ^
                     (emu::g_cur->nwait++ * 0x27D4EB2Fu);
        h ^= h >> 15; h *= 0x2C1B3C6Du; h ^= h >> 12;
        int n = (int)(h % 4) * 16;
        while (n--) {
            emu::g_progress = true;
            emu::yield();
        }
    }
    while ((int)g.size() > N) {
        for (auto& c : g.front()) emu::do_copy(c);
        g.erase(g.begin());
    }
}
static inline uint16_t emu_lds16(u32 addr) {
    uint16_t v;
    memcpy(&v, emu::g_smem + addr, 2);
    return v;
}
static inline void ldsm_impl(u32 addr, u32* r, bool trans) {
    int w = emu::warp(), l = emu::lane();
    if (addr % 16) { fprintf(stderr, "EMU: ldmatrix row address %u not 16-byte aligned\n", addr); exit(5); }
    emu::g_ex[w][l][0] = addr;
    emu::warp_sync();
    for (int i = 0; i < 4; i++) {
        uint32_t lo, hi;
        if (!trans) {  // thread l: row l/4, elements 2*(l%4), +1
            u32 rowa = emu::g_ex[w][8 * i + l / 4][0];
            lo = emu_lds16(rowa + 2 * (2 * (l % 4)));
            hi = emu_lds16(rowa + 2 * (2 * (l % 4) + 1));
        } else {       // thread l: M[2*(l%4)][l/4], M[2*(l%4)+1][l/4]
            u32 r0 = emu::g_ex[w][8 * i + 2 * (l % 4)][0];
            u32 r1 = emu::g_ex[w][8 * i + 2 * (l % 4) + 1][0];
            lo = emu_lds16(r0 + 2 * (l / 4));
            hi = emu_lds16(r1 + 2 * (l / 4));
        }
        r[i] = lo | (hi << 16);
    }
    emu::warp_sync();
}
static inline void ldsm_x4(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
    u32 r[4];
    ldsm_impl(addr, r, false);
    r0 = r[0]; r1 = r[1]; r2 = r[2]; r3 = r[3];
}
static inline void ldsm_x4_t(u32 addr, u32& r0, u32& r1, u32& r2, u32& r3) {
    u32 r[4];
    ldsm_impl(addr, r, true);
    r0 = r[0]; r1 = r[1]; r2 = r[2]; r3 = r[3];
}
static inline float emu_bf(uint32_t h) { return __uint_as_float((h & 0xffffu) << 16); }
static inline void mma16816(float* c, const u32* a, u32 b0, u32 b1) {
    int w = emu::warp(), l = emu::lane();
    u32* s = emu::g_ex[w][l];
    s[0] = a[0]; s[1] = a[1]; s[2] = a[2]; s[3] = a[3]; s[4] = b0; s[5] = b1;
    emu::warp_sync();
    float A[16][16], B[16][8];
    for (int j = 0; j < 32; j++) {
        const u32* t = emu::g_ex[w][j];
        int r = j / 4, k = 2 * (j % 4);
        A[r][k] = emu_bf(t[0]); A[r][k + 1] = emu_bf(t[0] >> 16);
        A[r + 8][k] = emu_bf(t[1]); A[r + 8][k + 1] = emu_bf(t[1] >> 16);
        A[r][k + 8] = emu_bf(t[2]); A[r][k + 9] = emu_bf(t[2] >> 16);
        A[r + 8][k + 8] = emu_bf(t[3]); A[r + 8][k + 9] = emu_bf(t[3] >> 16);
        B[k][r] = emu_bf(t[4]); B[k + 1][r] = emu_bf(t[4] >> 16);
        B[k + 8][r] = emu_bf(t[5]); B[k + 9][r] = emu_bf(t[5] >> 16);
    }
    int r = l / 4, n = 2 * (l % 4);
    for (int k = 0; k < 16; k++) {
        c[0] += A[r][k] * B[k][n];
        c[1] += A[r][k] * B[k][n + 1];
        c[2] += A[r + 8][k] * B[k][n];
        c[3] += A[r + 8][k] * B[k][n + 1];
    }
    emu::warp_sync();
}
static inline uint32_t emu_f2bf(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0u;
    return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}
static inline u32 pack_bf16(float lo, float hi) { return emu_f2bf(lo) | (emu_f2bf(hi) << 16); }
static inline float ex2(float x) { return exp2f(x); }
static inline void red_add_v2(float* p, float a, float b) {
    if (((uintptr_t)p) % 8) { fprintf(stderr, "EMU: red.v2 address not 8-byte aligned\n"); exit(5); }
    p[0] += a;
    p[1] += b;
}
