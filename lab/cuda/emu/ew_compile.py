#!/usr/bin/env python3
"""NVRTC-compiles the backend's memory-bound kernel files exactly as kernels.rs does (common.cuh,
then vec.cuh, then the file; --gpu-architecture=compute_90) and reports, per kernel, ptxas
registers / spills and the number of 128-bit global loads and stores in the PTX. No GPU needed.
  python3 lab/cuda/emu/ew_compile.py [file.cu ...]
"""
import os
import re
import sys
import tempfile
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True
sys.path.insert(0, os.path.dirname(HERE))
import attention_lab as lab  # noqa: E402  (nvrtc_compile, find_ptxas)

K = os.path.join(HERE, "..", "..", "..", "backends", "cuda", "kernels")
FILES = ["elementwise.cu", "norm.cu", "rope.cu", "activation.cu", "embedding.cu", "optimizer.cu", "loss.cu",
         "attention_simple.cu"]


def source(f):
    common = open(os.path.join(K, "common.cuh")).read()
    vec = open(os.path.join(K, "vec.cuh")).read()
    src = open(os.path.join(K, f)).read()
    return f'{common}\n#line 1 "{f}"\n#line 1 "vec.cuh"\n{vec}\n#line 1 "{f}"\n{src}'


def ptx_counts(ptx):
    """Per entry: (# ld.global.v4 / v2.f64 etc. 128-bit loads, # 128-bit stores)."""
    out, cur = {}, None
    for ln in ptx.splitlines():
        m = re.match(r"\s*\.(?:visible\s+)?\.entry\s+(\w+)", ln)
        if m:
            cur = m.group(1)
            out[cur] = [0, 0, 0, 0]
            continue
        if cur is None:
            continue
        s = ln.strip()
        if re.match(r"ld\.global(\.nc)?\.v4\.(f32|u32|b32|s32)|ld\.global(\.nc)?\.v2\.(f64|u64|b64)", s):
            out[cur][0] += 1
        elif re.match(r"st\.global\.v4\.(f32|u32|b32|s32)|st\.global\.v2\.(f64|u64|b64)", s):
            out[cur][1] += 1
        elif s.startswith("ld.global"):
            out[cur][2] += 1
        elif s.startswith("st.global"):
            out[cur][3] += 1
    return out


def main():
    files = sys.argv[1:] or FILES
    ptxas = lab.find_ptxas()
    bad = 0
    for f in files:
        ptx, log = lab.nvrtc_compile(source(f), ["--gpu-architecture=compute_90"], name=f)
        if log.strip():
            print(f"[{f}] NVRTC log:\n{log}")
        counts = ptx_counts(ptx.decode())
        regs = {}
        if ptxas:
            with tempfile.TemporaryDirectory() as d:
                pp = os.path.join(d, "a.ptx")
                open(pp, "wb").write(ptx)
                r = subprocess.run([ptxas, "-arch=sm_90a", "-v", pp, "-o", os.path.join(d, "a.cubin")],
                                   capture_output=True, text=True)
                cur = None
                for ln in (r.stdout + r.stderr).splitlines():
                    m = re.search(r"Compiling entry function '(\w+)'", ln)
                    if m:
                        cur = m.group(1)
                    m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", ln)
                    if m and cur:
                        regs.setdefault(cur, {})["spill"] = (int(m.group(1)), int(m.group(2)))
                    m = re.search(r"Used (\d+) registers", ln)
                    if m and cur:
                        regs.setdefault(cur, {})["regs"] = int(m.group(1))
                if r.returncode:
                    print(f"[{f}] ptxas failed: {r.stderr[-2000:]}")
                    bad += 1
        print(f"== {f}: {len(counts)} kernels")
        for k, (l4, s4, l, s) in counts.items():
            rg = regs.get(k, {})
            sp = rg.get("spill", (0, 0))
            if sp != (0, 0):
                bad += 1
            print(f"  {k:32s} regs {rg.get('regs', '?'):>3}  spill {sp[0]}/{sp[1]}  ld128 {l4:2d} st128 {s4:2d}  "
                  f"ld {l:2d} st {s:2d}")
    print("OK" if not bad else f"{bad} problems")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
