#!/usr/bin/env python3
"""Runs attention.cu on the CPU emulator (emu_rt.h) against a float64 numpy reference.

No GPU needed: catches indexing, fragment-layout, masking, tile-list and barrier bugs before any
device time is spent (it says nothing about speed, and cannot see real races or the real PTX).
  python3 lab/cuda/emu/emu_check.py [--quick]
Needs g++ and numpy.
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(HERE))
import attention_lab as lab  # noqa: E402  (mask builders)
import lab_source  # noqa: E402  (the kernels the emulator compiles)

TOL = dict(out=1e-2, lse=2e-3, dq=2e-2, dk=2e-2, dv=2e-2)


def to_bf16(x):
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def from_bf16(b):
    return (b.astype(np.uint32) << 16).view(np.float32)


def reference(q, k, v, do, m, scale):
    Tq, Hq, D = q.shape
    Tk, Hkv, _ = k.shape
    G = Hq // Hkv
    fs, fe, ss, se = [x.astype(np.int64) for x in m]
    kid = np.arange(Tk)[None, :]
    vis = ((kid >= fs[:, None]) & (kid < fe[:, None])) | ((kid >= ss[:, None]) & (kid < se[:, None]))
    has = vis.any(1)
    out = np.zeros_like(q)
    lse = np.full((Tq, Hq), -np.inf)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for h in range(Hq):
        hk = h // G
        s = np.where(vis, q[:, h] @ k[:, hk].T * scale, -np.inf)
        mx = np.where(has, s.max(1), 0.0)
        p = np.where(vis, np.exp(s - mx[:, None]), 0.0)
        l = p.sum(1)
        lse[:, h] = np.where(has, mx + np.log(np.where(has, l, 1.0)), -np.inf)
        p = p / np.where(has, l, 1.0)[:, None]
        o = p @ v[:, hk]
        out[:, h] = o
        dp = do[:, h] @ v[:, hk].T
        di = (do[:, h] * o).sum(1)
        ds = p * (dp - di[:, None])
        dq[:, h] = scale * ds @ k[:, hk]
        dk[:, hk] += scale * ds.T @ q[:, h]
        dv[:, hk] += p.T @ do[:, h]
    return out, lse, dq, dk, dv, has


def rel(a, b):
    n = np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / max(n, 1e-30))


def inputs(Tq, Tk, Hq, Hkv, D, seed):
    rng = np.random.default_rng(seed)
    return [from_bf16(to_bf16(rng.standard_normal(s))).astype(np.float64)
            for s in ((Tq, Hq, D), (Tk, Hkv, D), (Tk, Hkv, D), (Tq, Hq, D))]


def emulate(exe, q, k, v, do, m, Tk, scale, env_extra):
    """Runs the emulator's forward and backward; (out, lse, dq, dk, dv, seconds) or an error."""
    Tq, Hq, D = q.shape
    Hkv = k.shape[1]
    with tempfile.TemporaryDirectory() as d:
        for nm, x in (("q", q), ("k", k), ("v", v), ("do", do)):
            to_bf16(x).tofile(os.path.join(d, nm + ".bin"))
        for nm, x in zip(("fs", "fe", "ss", "se"), m):
            np.ascontiguousarray(x, dtype=np.int32).tofile(os.path.join(d, nm + ".bin"))
        t = time.time()
        env = dict(os.environ, **env_extra)
        r = subprocess.run([exe, str(D), str(Tq), str(Tk), str(Hq), str(Hkv), repr(scale), d], capture_output=True,
                           text=True, env=env)
        dt = time.time() - t
        if r.returncode:
            return f"EMU FAILED rc={r.returncode}: {r.stderr[-1500:]}"
        out = from_bf16(np.fromfile(os.path.join(d, "out.bin"), np.uint16)).reshape(Tq, Hq, D).astype(np.float64)
        lse = np.fromfile(os.path.join(d, "lse.bin"), np.float32).reshape(Tq, Hq).astype(np.float64)
        dq = from_bf16(np.fromfile(os.path.join(d, "dq.bin"), np.uint16)).reshape(Tq, Hq, D).astype(np.float64)
        dk = from_bf16(np.fromfile(os.path.join(d, "dk.bin"), np.uint16)).reshape(Tk, Hkv, D).astype(np.float64)
        dv = from_bf16(np.fromfile(os.path.join(d, "dv.bin"), np.uint16)).reshape(Tk, Hkv, D).astype(np.float64)
    return out, lse, dq, dk, dv, dt


def kv_nan_violations(out, lse, dq, dk, dv, vis, G, key, kv_head, in_v):
    """The NaN-key / NaN-value contract (see run_nan_case); one message per violation."""
    Tq, Hq = lse.shape
    bad = []
    for i in range(Tq):
        for h in range(Hq):
            if vis[i, key] and h // G == kv_head and in_v:
                if not (np.isnan(out[i, h, 0]) and np.isfinite(lse[i, h]) and np.isnan(dq[i, h]).all()):
                    bad.append(f"row {i} h {h} reads the NaN value but out[0]/dq are not NaN or lse is not finite")
            elif in_v and vis[i].any():
                if not np.isfinite(lse[i, h]):
                    bad.append(f"row {i} h {h} never reads the NaN value but its lse is not finite")
            elif vis[i, key] and h // G == kv_head:
                if not (np.isnan(out[i, h]).all() and np.isnan(lse[i, h]) and np.isnan(dq[i, h]).all()):
                    bad.append(f"row {i} h {h} reads the NaN key but out/lse/dq are not all NaN")
            elif not vis[i].any():
                if not ((out[i, h] == 0).all() and lse[i, h] == -np.inf):
                    bad.append(f"row {i} sees no key but out/lse are not 0/-inf")
            elif not (np.isfinite(out[i, h]).all() and np.isfinite(lse[i, h])):
                bad.append(f"row {i} h {h} never reads the NaN input but out/lse are not finite")
    for nm, g in (("dk", dk), ("dv", dv)):
        if in_v and nm == "dv":
            if not np.isfinite(g[key, kv_head]).all():
                bad.append("dv of the NaN value is not finite")
        elif not np.isnan(g[key, kv_head]).all():
            bad.append(f"{nm} of the NaN key is not all NaN")
    return bad


def row_nan_violations(out, lse, dq, dk, dv, vis, G, row, head, in_do):
    """The NaN-query / NaN-d_out contract at tile granularity (the Rust suite's `NanInput::Q`
    and `NanInput::DOut` under `within_tiles`): for q, out, lse and dq of (row, head) all NaN;
    for d_out, its out and lse untouched and its dq all NaN; either way every other (row,
    head) keeps a finite out, lse (-inf and out 0 where it sees no key) and dq (the forward
    and dq = dS K are row-wise even as MMAs); the keys (row, head) sees have dk all NaN and dv
    all NaN (q) or NaN at dim 0 and finite past it (d_out); keys it does not see in its kv
    head are left to tile granularity (0 x NaN in the dS^T Q and P^T dO MMAs), except dv past
    dim 0 for d_out, finite; keys of other kv heads finite."""
    Tq, Hq = lse.shape
    bad = []
    for i in range(Tq):
        for h in range(Hq):
            reader = i == row and h == head
            if reader and not in_do:
                if not (np.isnan(out[i, h]).all() and np.isnan(lse[i, h]) and np.isnan(dq[i, h]).all()):
                    bad.append(f"row {i} h {h} holds the NaN q but out/lse/dq are not all NaN")
                continue
            if not vis[i].any():
                if not ((out[i, h] == 0).all() and lse[i, h] == -np.inf):
                    bad.append(f"row {i} sees no key but out/lse are not 0/-inf")
            elif not (np.isfinite(out[i, h]).all() and np.isfinite(lse[i, h])):
                bad.append(f"row {i} h {h}: out/lse are not finite")
            if reader:
                if not np.isnan(dq[i, h]).all():
                    bad.append(f"row {i} h {h} holds the NaN d_out but its dq is not all NaN")
            elif not np.isfinite(dq[i, h]).all():
                bad.append(f"row {i} h {h} holds no NaN but its dq is not finite")
    kv_head = head // G
    for j in range(dk.shape[0]):
        for g in range(dk.shape[1]):
            if g != kv_head:
                if not (np.isfinite(dk[j, g]).all() and np.isfinite(dv[j, g]).all()):
                    bad.append(f"key {j} kv head {g}: another kv head's dk/dv is not finite")
            elif vis[row, j]:
                dv_ok = np.isnan(dv[j, g, 0]) and (np.isnan(dv[j, g]).all() if not in_do else np.isfinite(dv[j, g, 1:]).all())
                if not (np.isnan(dk[j, g]).all() and dv_ok):
                    bad.append(f"key {j} is seen by the NaN row but dk/dv are not NaN as they must be")
            elif in_do and not np.isfinite(dv[j, g, 1:]).all():
                bad.append(f"key {j} is not seen by the NaN row but dv past dim 0 is not finite")
    return bad


def run_nan_case(exe, name, D, Hq, Hkv, m, Tk, at, head, seed, where):
    """The NaN policy (ARCHITECTURE.md), at the tile granularity of the tensor-core kernels
    (the Rust suite's `NanCase::within_tiles`). `where` is "k" or "v" (`at` a key, `head` its
    kv head: kv_nan_violations) or "q" or "do" (`at` a query row, `head` its q head:
    row_nan_violations); the NaN goes in element 0. For a key: the rows that read it are NaN
    in out, lse and dq, dk and dv of the key NaN, rows that see no key 0 / -inf, every other
    row's out and lse finite (its dq unchecked: dq = dS K is an MMA over whole tiles). For a
    value: the rows that read it have out[.., 0] and dq NaN, every lse untouched, the key's dk
    NaN and its dv finite; other rows of a tile holding it may meet it through a zero weight."""
    Tq = len(m[0])
    q, k, v, do = inputs(Tq, Tk, Hq, Hkv, D, seed)
    {"k": k, "v": v, "q": q, "do": do}[where][at, head, 0] = np.nan
    got = emulate(exe, q, k, v, do, m, Tk, D ** -0.5, {})
    head_line = f"{name} NaN {where}[{at}, {head}]"
    head_line = f"{head_line:44s} D={D:3d} H={Hq}/{Hkv}: "
    if isinstance(got, str):
        return head_line + got, False
    out, lse, dq, dk, dv, dt = got
    fs, fe, ss, se = [x.astype(np.int64) for x in m]
    kid = np.arange(Tk)[None, :]
    vis = ((kid >= fs[:, None]) & (kid < fe[:, None])) | ((kid >= ss[:, None]) & (kid < se[:, None]))
    G = Hq // Hkv
    if where in ("k", "v"):
        bad = kv_nan_violations(out, lse, dq, dk, dv, vis, G, at, head, where == "v")
    else:
        bad = row_nan_violations(out, lse, dq, dk, dv, vis, G, at, head, where == "do")
    ok = not bad
    return head_line + ("PASS" if ok else f"FAIL ({len(bad)}) " + "; ".join(bad[:3])) + f" ({dt:.1f}s)", ok


def run_case(exe, name, D, Hq, Hkv, m, Tk, seed, env_extra):
    Tq = len(m[0])
    q, k, v, do = inputs(Tq, Tk, Hq, Hkv, D, seed)
    scale = D ** -0.5
    got = emulate(exe, q, k, v, do, m, Tk, scale, env_extra)
    if isinstance(got, str):
        return f"{name:40s} D={D:3d} {got}", False
    out, lse, dq, dk, dv, dt = got
    ro, rl, rdq, rdk, rdv, has = reference(q, k, v, do, m, scale)
    errs = {}
    errs["out"] = rel(out, ro) if not np.isnan(out).any() else float("nan")
    fin = np.isfinite(rl)
    if np.isnan(lse).any() or not np.array_equal(np.isfinite(lse), fin) or not (lse[~fin] == -np.inf).all():
        errs["lse"] = float("nan")
    else:
        errs["lse"] = float(np.abs(lse[fin] - rl[fin]).max()) if fin.any() else 0.0
    for nm, x, rr in (("dq", dq, rdq), ("dk", dk, rdk), ("dv", dv, rdv)):
        errs[nm] = rel(x, rr) if not np.isnan(x).any() else float("nan")
    bad = []
    if (~has).any() and not (out[~has] == 0).all():
        bad.append("empty rows not zero")
    ok = all(e == e and e <= TOL[n] for n, e in errs.items()) and not bad
    msg = f"{name:40s} D={D:3d} Tq={Tq:4d} Tk={Tk:4d} H={Hq}/{Hkv} {env_extra}: " + " ".join(
        f"{n} {e:.1e}" for n, e in errs.items()) + f" {'PASS' if ok else 'FAIL'} {' '.join(bad)} ({dt:.1f}s)"
    if not ok:
        for nm, x, rr in (("out", out, ro), ("dq", dq, rdq), ("dk", dk, rdk), ("dv", dv, rdv)):
            e = np.nan_to_num(np.abs(x - rr), nan=1e9).max(-1)
            idx = np.argsort(e.ravel())[-3:][::-1]
            msg += f"\n    worst {nm}: " + ", ".join(f"(row {i // e.shape[1]}, h {i % e.shape[1]}: {e.ravel()[i]:.3g})" for i in idx)
        if np.isnan(lse).any() or errs["lse"] != errs["lse"]:
            bad_rows = np.where((np.isnan(lse) | (np.isfinite(lse) != fin)).any(1))[0][:8]
            msg += f"\n    lse bad rows {bad_rows.tolist()}"
    return msg, ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", default="")
    ap.add_argument("-j", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--cflags", default="", help="extra g++ flags, e.g. -DATTN_FWD_CFG_128=128,64,64,4,false")
    args = ap.parse_args()
    exe = os.path.join(tempfile.gettempdir(), "attn_emu_main")
    t = time.time()
    subprocess.run(["g++", "-std=c++17", "-O2", "-Wno-unknown-pragmas", "-I", lab_source.kernel_dir()] +
                   args.cflags.split() + ["-o", exe, os.path.join(HERE, "emu_main.cpp")], check=True)
    print(f"built emulator in {time.time() - t:.1f}s", flush=True)
    rng = np.random.default_rng(5)
    an = list(lab.sample_anchors(rng, 150, 9)) + [-1, -1]
    cases = [
        ("dense 80x150", 128, 2, 1, *lab.mask_dense(80, 150), {}),
        ("causal 150", 128, 2, 2, *lab.mask_causal(150), {}),
        ("dflash S150 N11 (2 padding)", 128, 4, 2, *lab.mask_dflash(150, an), {}),
        ("dflash S150 N11 (2 padding)", 64, 4, 2, *lab.mask_dflash(150, an), {}),
        ("dflash S150 N11 (2 padding)", 256, 2, 1, *lab.mask_dflash(150, an), {}),
        ("dflash S300 N20", 128, 2, 1, *lab.mask_dflash(300, lab.sample_anchors(rng, 300, 20)), {"EMU_CP": "1"}),
        ("dflash S300 N20 shuffled", 128, 2, 1, *lab.mask_dflash(300, lab.sample_anchors(rng, 300, 20)),
         {"EMU_CP": "1", "EMU_SHUFFLE": "7"}),
        ("dflash S300 N20 shuffled cp-at-issue", 128, 2, 1, *lab.mask_dflash(300, lab.sample_anchors(rng, 300, 20)),
         {"EMU_CP": "0", "EMU_SHUFFLE": "11"}),
        ("dflash-sliding W40 S200 N10", 128, 2, 1, *lab.mask_dflash(200, lab.sample_anchors(rng, 200, 10), window=40), {}),
        ("document [50,90,30,7]", 128, 2, 1, *lab.mask_document([50, 90, 30, 7]), {}),
        ("dflash S200 N12 anchors<40", 128, 2, 1, *lab.mask_dflash(200, np.sort(rng.choice(40, 12, replace=False))), {}),
        ("dense 70x130 d64", 64, 2, 2, *lab.mask_dense(70, 130), {"EMU_CP": "1"}),
        ("causal 140 d256", 256, 1, 1, *lab.mask_causal(140), {"EMU_CP": "1", "EMU_SHUFFLE": "3"}),
    ]
    if args.quick:
        cases = cases[:3]
    if args.only:
        cases = [c for c in cases if args.only in c[0]]
    if "ATTN_ONLY_D128" in args.cflags:
        cases = [c for c in cases if c[1] == 128]
    # (name, D, Hq, Hkv, mask..., Tk, at, head, where): keys and values at `at` in kv head 1;
    # q and d_out at query row `at` in q head 3 (kv head 1; its sibling head 2 stays clean).
    dfl_row = 16 * 2 + 3  # slot 3 of the third block: the other rows of its tile see other keys
    nan_cases = [
        ("dflash S150 N11 (2 padding)", 128, 4, 2, *lab.mask_dflash(150, an), 60, 1, "k"),
        ("dflash S150 N11 (2 padding)", 128, 4, 2, *lab.mask_dflash(150, an), 60, 1, "v"),
        ("causal 150", 64, 4, 2, *lab.mask_causal(150), 30, 1, "k"),
        ("causal 150", 64, 4, 2, *lab.mask_causal(150), 30, 1, "v"),
        ("dflash S150 N11 (2 padding)", 128, 4, 2, *lab.mask_dflash(150, an), dfl_row, 3, "q"),
        ("dflash S150 N11 (2 padding)", 128, 4, 2, *lab.mask_dflash(150, an), dfl_row, 3, "do"),
        ("causal 150", 64, 4, 2, *lab.mask_causal(150), 40, 3, "q"),
        ("causal 150", 64, 4, 2, *lab.mask_causal(150), 40, 3, "do"),
    ]
    if args.quick:
        nan_cases = nan_cases[:2]
    if args.only:
        nan_cases = [c for c in nan_cases if args.only in c[0]]
    with ThreadPoolExecutor(max_workers=args.j) as ex:
        futs = [ex.submit(run_case, exe, nm, D, Hq, Hkv, m, Tk, 100 + i, env) for i, (nm, D, Hq, Hkv, m, Tk, env) in enumerate(cases)]
        futs += [ex.submit(run_nan_case, exe, nm, D, Hq, Hkv, m, Tk, at, hd, 200 + i, where)
                 for i, (nm, D, Hq, Hkv, m, Tk, at, hd, where) in enumerate(nan_cases)]
        oks = []
        for f in futs:
            msg, ok = f.result()
            print(msg, flush=True)
            oks.append(ok)
    print(f"{sum(oks)} passed, {len(oks) - sum(oks)} failed")
    return 0 if all(oks) else 1


if __name__ == "__main__":
    sys.exit(main())
