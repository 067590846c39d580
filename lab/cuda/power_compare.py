#!/usr/bin/env python3
"""Causal S=8192 attention, ours (the staged `dflash bench`) against torch SDPA on the same GPU, in one go:
time, board power and SM clock while each runs back to back for a few seconds (nvidia-smi sampled every
20 ms), so the two are compared at the same temperature and power limit. Lab run 32.

Usage (device, repo root, .cudatest staged): python3 lab/cuda/power_compare.py [secs] [rounds]
"""
import json, os, statistics, subprocess, sys, tempfile, time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attention_lab import PowerSampler  # noqa: E402

SECS = float(sys.argv[1]) if len(sys.argv) > 1 else 3.0
ROUNDS = int(sys.argv[2]) if len(sys.argv) > 2 else 2
S, H, D = 8192, 32, 128
FLOP_FWD = 4.0 * H * D * (S * (S + 1) / 2)


def sdpa(fb, secs):
    q = torch.randn(1, H, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=fb)
    k = torch.randn_like(q, requires_grad=fb)
    v = torch.randn_like(q, requires_grad=fb)
    do = torch.randn_like(q)

    def step():
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if fb:
            o.backward(do)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    ts, t_end = [], time.time() + secs
    while time.time() < t_end:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); step(); b.record(); b.synchronize()
        ts.append(a.elapsed_time(b) / 1e3)
    return statistics.median(ts), len(ts)


def ours(fb, secs):
    name = "causal.s8192." + ("fwd_bwd" if fb else "fwd")
    per = 0.0045 if fb else 0.0011
    runs = max(3, int(secs / per))
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([".cudatest/dflash", "bench", "--backend", "cuda", "--attention", "cuda-flash", "--only", name,
                        "--warmup", "3", "--runs", str(runs), "--out", f"{d}/r.json"], check=True, capture_output=True)
        r = json.load(open(f"{d}/r.json"))
        r = r if isinstance(r, list) else r.get("results", r)
        rec = next(x for x in r if x["name"].endswith(name))
    return 1.0 / (rec["value"] * 1e12 / ((3.5 if fb else 1.0) * FLOP_FWD)), runs


smp = PowerSampler()
time.sleep(0.5)
print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; causal S={S}, {H} heads, d={D}; {SECS} s each, {ROUNDS} rounds")
for rnd in range(ROUNDS):
    for fb in (False, True):
        for who, fn in (("ours", ours), ("sdpa", sdpa)):
            t0 = time.time()
            t, n = fn(fb, SECS)
            t1 = time.time()
            tf = (3.5 if fb else 1.0) * FLOP_FWD / t / 1e12
            print(f"round {rnd} {'fwd+bwd' if fb else 'fwd    '} {who}: {t*1e3:7.3f} ms {tf:6.1f} TF ({n} runs) | "
                  f"{smp.window(t0 + 0.3 * (t1 - t0), t1)}", flush=True)
smp.p.terminate()
