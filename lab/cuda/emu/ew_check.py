#!/usr/bin/env python3
"""Runs the backend's memory-bound kernels (elementwise add / add_assign / scale, SwiGLU,
embedding, RoPE, RMSNorm fwd / bwd dx / dw, the cross-entropy rows) on the CPU emulator (ew_rt.h) with the launches the
Rust side uses, and checks them (ew_main.cpp: bit-exact against the same f32 formula on the host
for the elementwise ops, f64 references with tolerances for RMSNorm; vector path, scalar
fallback on misaligned pointers, small grids; NaN guard zones around every buffer).
No GPU needed. Says nothing about speed.
  python3 lab/cuda/emu/ew_check.py [--quick]
Needs g++.
"""
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
K = os.path.join(HERE, "..", "..", "..", "backends", "cuda", "kernels")
FILES = ["elementwise.cu", "activation.cu", "embedding.cu", "rope.cu", "norm.cu", "optimizer.cu", "loss.cu"]


def main():
    quick = "--quick" in sys.argv
    parts = ['#include "ew_rt.h"', open(os.path.join(K, "common.cuh")).read(),
             '#line 1 "vec.cuh"', open(os.path.join(K, "vec.cuh")).read()]
    for f in FILES:
        src = open(os.path.join(K, f)).read()
        # dynamic shared memory: the emulator's per-block buffer
        src = src.replace("extern __shared__ float tab[];", "float* tab = (float*)ew::g_smem;")
        parts += [f'#line 1 "{f}"', src]
    with tempfile.TemporaryDirectory() as d:
        open(os.path.join(d, "ew_src.h"), "w").write("\n".join(parts) + "\n")
        exe = os.path.join(d, "ew_main")
        t = time.time()
        subprocess.run(["g++", "-std=c++17", "-O2", "-Wall", "-Wno-unknown-pragmas", "-Wno-unused-function",
                        "-I", d, "-I", HERE, "-o", exe, os.path.join(HERE, "ew_main.cpp")], check=True)
        print(f"built in {time.time() - t:.1f}s", flush=True)
        t = time.time()
        r = subprocess.run([exe] + (["--quick"] if quick else []))
        print(f"ran in {time.time() - t:.1f}s")
        return r.returncode


if __name__ == "__main__":
    sys.exit(main())
