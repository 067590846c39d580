// CPU emulator runtime for the backend's memory-bound kernels (elementwise, norm, rope,
// activation, embedding, optimizer; kernel lab only, never shipped). Adapted from emu_rt.h
// (attention): every CUDA thread of a block is a ucontext coroutine that yields only at
// __syncthreads and warp shuffles, so those see every lane exactly as the hardware does; blocks
// run one after another; 3-D grids and blocks; blockDim / gridDim; dynamic shared memory
// (ew::g_smem, filled with 0xFF per block); shuffles of 4- and 8-byte values. A barrier or
// shuffle that only part of a block / warp reaches is reported as a deadlock.
#pragma once
#include "cuda_shim.h"

struct EwDim { unsigned x, y, z; };

namespace ew {
struct Thread {
    ucontext_t ctx;
    EwDim tidx;
    int lin;
    bool done;
};
struct Sync { int count = 0; long gen = 0; };

inline ucontext_t g_main;
inline std::vector<Thread> g_th;
inline std::vector<char*> g_stacks;
inline Thread* g_cur = nullptr;
inline EwDim g_blk = {0, 0, 0}, g_bdim = {1, 1, 1}, g_gdim = {1, 1, 1};
inline unsigned char* g_smem = nullptr;
inline std::vector<unsigned char> g_smem_buf;
inline int g_nthreads = 0;
inline Sync g_block_sync;
inline Sync g_warp_sync[32];
inline uint64_t g_ex[32][32];
inline bool g_progress = false;
inline std::function<void()> g_body;
inline long long g_vec = 0;  // 16-byte vector accesses so far (vec.cuh)
const size_t STACK = 64 * 1024;

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
inline int lane() { return g_cur->lin & 31; }
inline int warp() { return g_cur->lin >> 5; }
inline int warp_size(int w) { return std::min(32, g_nthreads - 32 * w); }
inline void warp_sync() { arrive(g_warp_sync[warp()], warp_size(warp())); }

inline void trampoline(int i) {
    g_body();
    g_th[i].done = true;
    g_progress = true;
    swapcontext(&g_th[i].ctx, &g_main);
}

inline void launch(EwDim grid, EwDim block, size_t smem_bytes, std::function<void()> body) {
    const int nt = (int)(block.x * block.y * block.z);
    if (nt < 1 || nt > 1024) { fprintf(stderr, "EW: bad block size %d\n", nt); exit(6); }
    if (g_stacks.size() < (size_t)nt)
        for (size_t i = g_stacks.size(); i < (size_t)nt; i++) g_stacks.push_back((char*)malloc(STACK));
    g_body = body;
    g_bdim = block;
    g_gdim = grid;
    for (unsigned bz = 0; bz < grid.z; bz++)
        for (unsigned by = 0; by < grid.y; by++)
            for (unsigned bx = 0; bx < grid.x; bx++) {
                g_blk = {bx, by, bz};
                g_smem_buf.assign(smem_bytes + 16, 0xFF);
                g_smem = g_smem_buf.data();
                g_th.assign(nt, Thread());
                g_nthreads = nt;
                g_block_sync = Sync();
                for (auto& w : g_warp_sync) w = Sync();
                for (int i = 0; i < nt; i++) {
                    Thread& t = g_th[i];
                    t.tidx = {(unsigned)(i % block.x), (unsigned)((i / block.x) % block.y),
                              (unsigned)(i / (block.x * block.y))};
                    t.lin = i;
                    t.done = false;
                    getcontext(&t.ctx);
                    t.ctx.uc_stack.ss_sp = g_stacks[i];
                    t.ctx.uc_stack.ss_size = STACK;
                    t.ctx.uc_link = nullptr;
                    makecontext(&t.ctx, (void (*)())trampoline, 1, i);
                }
                int stall = 0;
                for (;;) {
                    bool alive = false;
                    g_progress = false;
                    for (int i = 0; i < nt; i++) {
                        if (g_th[i].done) continue;
                        alive = true;
                        g_cur = &g_th[i];
                        swapcontext(&g_main, &g_th[i].ctx);
                    }
                    if (!alive) break;
                    if (!g_progress) {
                        if (++stall > 3) {
                            fprintf(stderr, "EW DEADLOCK in block (%u,%u,%u)\n", bx, by, bz);
                            exit(3);
                        }
                    } else {
                        stall = 0;
                    }
                }
            }
    g_cur = nullptr;
}
}  // namespace ew

#define threadIdx (ew::g_cur->tidx)
#define blockIdx (ew::g_blk)
#define blockDim (ew::g_bdim)
#define gridDim (ew::g_gdim)

inline void __syncthreads() { ew::arrive(ew::g_block_sync, ew::g_nthreads); }

template <class T>
inline T __shfl_xor_sync(unsigned, T v, int m) {
    static_assert(sizeof(T) <= 8, "shuffles of <= 8 bytes");
    int w = ew::warp(), l = ew::lane();
    if ((l ^ m) >= ew::warp_size(w)) { fprintf(stderr, "EW: shuffle source lane outside the warp\n"); exit(5); }
    memcpy(&ew::g_ex[w][l], &v, sizeof(T));
    ew::warp_sync();
    T r;
    memcpy(&r, &ew::g_ex[w][l ^ m], sizeof(T));
    ew::warp_sync();
    return r;
}

// Every 16-byte vector access of vec.cuh must be 16-byte aligned.
#define DF_VEC_CHECK(p)                                                                     \
    do {                                                                                    \
        ew::g_vec++;                                                                        \
        if (((uintptr_t)(p)) & 15) {                                                        \
            fprintf(stderr, "EW: misaligned 16-byte access at %p (%s:%d)\n", (const void*)(p), \
                    __FILE__, __LINE__);                                                    \
            exit(7);                                                                        \
        }                                                                                   \
    } while (0)
