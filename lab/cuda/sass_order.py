#!/usr/bin/env python3
"""No GPU: NVRTC (as the backend, compute_90a) -> ptxas -v (sm_90a) -> nvdisasm, then for every attn_fwd_*
and attn_bwd_dkdv_* kernel print the C75xx infos (wgmma serialisation), registers, and the sequence of
HGMMA blocks (H), WARPGROUP.DEPBAR waits (W0/W1 = wait_group 0/1) and MUFU.EX2 blocks (E).
The shipped forward must read "... H W1 E W0 ..." in its main path (run 11: ptxas hoisted W0 above E).
Usage: python3 lab/cuda/sass_order.py [-DMACRO ...]   (needs ptxas and nvdisasm, e.g. pip
nvidia-cuda-nvcc / nvidia-cuda-nvdisasm; set NVDISASM=path if not on PATH)."""
import glob, os, re, shutil, subprocess, sys, tempfile
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import attention_lab as L  # noqa: E402

ptx, _ = L.nvrtc_compile(L.read_source(), L.NVRTC_OPTS + sys.argv[1:])
ptxas = L.find_ptxas()
nvd = os.environ.get("NVDISASM") or shutil.which("nvdisasm") or next(iter(sorted(glob.glob("/tmp/*/nvidia/cu13/bin/nvdisasm"))), None)
with tempfile.TemporaryDirectory() as d:
    open(os.path.join(d, "a.ptx"), "wb").write(ptx)
    r = subprocess.run([ptxas, "-arch=sm_90a", "-v", os.path.join(d, "a.ptx"), "-o", os.path.join(d, "a.cubin")],
                       capture_output=True, text=True)
    print("\n".join(l for l in (r.stdout + r.stderr).splitlines() if "C75" in l) or "no C75xx infos")
    print(L.ptxas_report(ptx, "regs"))
    sass = subprocess.run([nvd, os.path.join(d, "a.cubin")], capture_output=True, text=True).stdout
cur, seqs = None, {}
for ln in sass.splitlines():
    m = re.search(r"\.text\.(\w+):", ln)
    if m:
        cur = m.group(1)
        seqs.setdefault(cur, [])
        continue
    m = re.search(r"/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", ln)
    if not cur or not m:
        continue
    op, s = m.group(2), seqs[cur]
    if "WARPGROUP.DEPBAR" in op:
        s.append("W" + re.search(r"0x(\d)", ln).group(1))
    elif op.startswith("MUFU.EX2") and (not s or s[-1] != "E"):
        s.append("E")
    elif op.startswith("HGMMA") and (not s or s[-1] != "H"):
        s.append("H")
for k, v in seqs.items():
    if v and k.startswith(("attn_fwd", "attn_bwd_dkdv")):
        print(f"{k}: {' '.join(v)}")
