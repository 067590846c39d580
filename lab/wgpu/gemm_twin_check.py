#!/usr/bin/env python3
"""The CPU-side check of lab/wgpu/gemm_twin.py (`python3 lab/wgpu/gemm_twin.py --check`): its
CUDA C kernels built as host C++ (a block's threads as host threads, __syncthreads as a
barrier, __shared__ arrays as statics) under ASan + UBSan and TSan against a double-precision
reference, and compiled by NVRTC for sm_90 with ptxas' register and spill counts where
libnvrtc is found. No GPU needed."""
import os

from gemm_twin import KERNELS, SHARED, SRC

# Enough of CUDA for the kernels above to build as host C++: a block runs as `threads` host
# threads, __shared__ arrays are function statics (one block at a time uses them).
HOST_PRELUDE = r"""
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <pthread.h>
#include <thread>
#include <unistd.h>
#include <vector>
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
static inline float2 make_float2(float x, float y) { return float2{x, y}; }
static inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
struct uint3 { unsigned x, y, z; };
static thread_local uint3 threadIdx;
static uint3 blockIdx;
static pthread_barrier_t block_barrier;
static inline void __syncthreads() { pthread_barrier_wait(&block_barrier); }
#define __device__
#define __forceinline__ inline
#define __global__
#define __launch_bounds__(n)
#define __shared__ static
"""

HOST_MAIN = r"""
typedef void (*Kern)(const float*, const float*, float*, int, int, int);
struct Entry { const char* name; Kern f; int threads; int tile_n; };
static const Entry ENTRIES[] = {ENTRY_LIST};

static void launch(const Entry& e, const float* a, const float* b, float* c, int m, int n, int k) {
    int grid = ((m + 127) / 128) * ((n + e.tile_n - 1) / e.tile_n);
    for (int g = 0; g < grid; g++) {
        blockIdx = uint3{unsigned(g), 0u, 0u};
        pthread_barrier_init(&block_barrier, nullptr, e.threads);
        std::vector<std::thread> ts;
        for (int t = 0; t < e.threads; t++)
            ts.emplace_back([=] { threadIdx = uint3{unsigned(t), 0u, 0u}; e.f(a, b, c, m, n, k); });
        for (auto& t : ts) t.join();
        pthread_barrier_destroy(&block_barrier);
    }
}

static void on_alarm(int) {
    const char msg[] = "TIMEOUT: a block's threads never all reached a barrier\n";
    ssize_t r = write(2, msg, sizeof msg - 1);
    (void)r;
    _exit(3);
}

// argv: m n k triples. Exact-size operands (the sanitizers see any access past them), c
// poisoned with NaN (an element nobody stores stays NaN).
int main(int argc, char** argv) {
    signal(SIGALRM, on_alarm);
    alarm(120);
    int bad = 0;
    for (const Entry& e : ENTRIES) {
        for (int s = 1; s + 2 < argc; s += 3) {
            int m = atoi(argv[s]), n = atoi(argv[s + 1]), k = atoi(argv[s + 2]);
            std::vector<float> a((size_t)m * k), b((size_t)n * k), c((size_t)m * n, NAN);
            unsigned r = 12345u + 7u * m + 13u * n + 17u * k;
            for (auto& x : a) { r = r * 1664525u + 1013904223u; x = (r >> 8) / 8388608.0f - 1.0f; }
            for (auto& x : b) { r = r * 1664525u + 1013904223u; x = (r >> 8) / 8388608.0f - 1.0f; }
            launch(e, a.data(), b.data(), c.data(), m, n, k);
            double worst = 0, big = 0;
            long unset = 0;
            for (int i = 0; i < m; i++)
                for (int j = 0; j < n; j++) {
                    double want = 0;
                    for (int l = 0; l < k; l++) want += (double)a[(size_t)i * k + l] * b[(size_t)j * k + l];
                    float got = c[(size_t)i * n + j];
                    big = fmax(big, fabs(want));
                    if (std::isnan(got)) unset++;
                    else worst = fmax(worst, fabs(got - want));
                }
            double rel = big > 0 ? worst / big : worst;
            bool ok = unset == 0 && rel < 1e-5;
            printf("  %-19s m %4d n %4d k %3d: max rel err %.1e, unset %ld %s\n", e.name, m, n, k,
                   rel, unset, ok ? "ok" : "WRONG");
            bad += !ok;
        }
    }
    return bad ? 1 : 0;
}
"""

# Ragged shapes for CHECKED (a partial tile in m and n, odd k, one k-step, an odd and an even
# number of k-steps, 1 x 1 x 1; n = 300 leaves a last 64-column tile of 44, past its second
# column block's start); whole tiles for UNCHECKED.
CHECK_SHAPES = {"": [(200, 136, 33), (128, 128, 16), (130, 260, 72), (1, 1, 1), (64, 300, 50)],
                "UNCHECKED": [(256, 128, 48), (128, 256, 64)]}


def nvrtc_library():
    import ctypes
    import ctypes.util
    import glob

    paths = [os.environ["NVRTC"]] if os.environ.get("NVRTC") else []
    try:
        import nvidia.cuda_nvrtc as pkg

        for d in pkg.__path__:
            paths += sorted(glob.glob(os.path.join(d, "lib", "libnvrtc.so*")))
    except ImportError:
        pass
    paths += [ctypes.util.find_library("nvrtc"), "libnvrtc.so.12", "libnvrtc.so"]
    for p in paths:
        if p:
            try:
                return ctypes.CDLL(p), p
            except OSError:
                pass
    return None, None


def nvrtc_check():
    """ptxas's statistics of each kernel under each define, or False if a compile failed."""
    import ctypes
    import re

    lib, path = nvrtc_library()
    if lib is None:
        print("NVRTC: no library (NVRTC=/path/libnvrtc.so, or pip install nvidia-cuda-nvrtc-cu12):"
              " compile not checked")
        return True
    ver = (ctypes.c_int(), ctypes.c_int())
    lib.nvrtcVersion(ctypes.byref(ver[0]), ctypes.byref(ver[1]))
    print(f"NVRTC {ver[0].value}.{ver[1].value} ({path}), sm_90:")
    ok = True
    for define in ["", "UNCHECKED"]:
        prog = ctypes.c_void_p()
        if lib.nvrtcCreateProgram(ctypes.byref(prog), SRC.encode(), b"gemm_twin.cu", 0, None, None):
            print("  nvrtcCreateProgram failed")
            return False
        opts = [b"-arch=sm_90", b"-lineinfo", b"--ptxas-options=-v"]
        if define:
            opts.append(f"-D{define}".encode())
        arr = (ctypes.c_char_p * len(opts))(*opts)
        res = lib.nvrtcCompileProgram(prog, len(opts), arr)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size))
        buf = ctypes.create_string_buffer(size.value + 1)
        lib.nvrtcGetProgramLog(prog, buf)
        log = buf.value.decode(errors="replace")
        lib.nvrtcDestroyProgram(ctypes.byref(prog))
        stats, fn, other = {}, None, []
        for line in log.splitlines():
            hit = re.search(r"(?:Compiling entry function|Function properties for) '?(\w+)'?", line)
            if hit:
                fn = hit.group(1)
                continue
            if fn and "spill stores" in line:
                stats.setdefault(fn, {})["spill"] = re.search(r"(\d+) bytes spill stores", line).group(1)
            elif fn and "Used" in line and "registers" in line:
                st = stats.setdefault(fn, {})
                st["regs"] = re.search(r"Used (\d+) registers", line).group(1)
                smem = re.search(r"(\d+) bytes smem", line)
                st["smem"] = smem.group(1) if smem else "0"
            elif line.strip() and "ptxas info" not in line:
                other.append(line)
        for line in other:
            print(f"  {define or 'CHECKED'}: {line}")
        if res:
            print(f"  {define or 'CHECKED'}: compile FAILED (nvrtcResult {res})")
            ok = False
            continue
        for label, entry, _, _ in KERNELS:
            st = stats.get(entry)
            if st is None:
                print(f"  {label}{define or 'CHECKED'}: {entry}: no ptxas statistics in the log")
                continue
            want = SHARED[entry]
            good = int(st.get("smem", -1)) == want
            ok &= good
            print(f"  {label}{define or 'CHECKED'}: {entry}: regs {st.get('regs')}, spill stores "
                  f"{st.get('spill')} bytes, shared {st.get('smem')} bytes"
                  + ("" if good else f" (expected {want}: WRONG)"))
    return ok


def check():
    """The CPU-side check (--check): 0 if everything passed."""
    import shutil
    import subprocess
    import tempfile

    ok = True
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("clang++")
    if not cxx:
        print("no C++ compiler (g++ or clang++): host run not checked")
        ok = False
    else:
        entries = ", ".join(f'{{"{l}{e}", {e}, {t}, {tn}}}' for l, e, t, tn in KERNELS)
        code = HOST_PRELUDE + SRC + HOST_MAIN.replace("ENTRY_LIST", entries)
        sanitizers = [("asan+ubsan", ["-fsanitize=address,undefined", "-fno-sanitize-recover=all"]),
                      ("tsan", ["-fsanitize=thread"])]
        with tempfile.TemporaryDirectory() as tmp:
            cpp = os.path.join(tmp, "twin.cpp")
            with open(cpp, "w") as f:
                f.write(code)
            for define, shapes in CHECK_SHAPES.items():
                for san, flags in sanitizers:
                    exe = os.path.join(tmp, f"twin-{define or 'checked'}-{san}")
                    cmd = [cxx, "-std=c++17", "-O1", "-g", "-pthread", "-Wall", "-Wno-unknown-pragmas",
                           *flags, *([f"-D{define}"] if define else []), cpp, "-o", exe]
                    print(f"host {define or 'CHECKED'} under {san}:", flush=True)
                    built = subprocess.run(cmd, capture_output=True, text=True)
                    if built.stdout or built.stderr:
                        print(built.stdout + built.stderr)
                    if built.returncode:
                        print("  build FAILED")
                        ok = False
                        continue
                    argv = [str(x) for shape in shapes for x in shape]
                    env = dict(os.environ, TSAN_OPTIONS="halt_on_error=1 exitcode=66")
                    try:
                        ran = subprocess.run([exe, *argv], capture_output=True, text=True,
                                             timeout=300, env=env)
                    except subprocess.TimeoutExpired:
                        print("  TIMEOUT")
                        ok = False
                        continue
                    print(ran.stdout, end="")
                    if ran.returncode:
                        print(ran.stderr[-6000:])
                        print(f"  FAILED (exit {ran.returncode})")
                        ok = False
    ok = nvrtc_check() and ok
    print("check:", "passed" if ok else "FAILED")
    return 0 if ok else 1

