#!/usr/bin/env python3
"""A CPU emulator of the wgpu tensor-core GEMM kernel `matmul_coop`, statement for statement.

What it is: backends/wgpu/src/shaders/gemm_coop.wgsl (`matmul_coop`, its helpers `tile_at`,
`put_pair_ha` / `put_pair_hb`, `put_a_coop` / `put_b_coop`, `coop_a` / `coop_b`,
`drain_coop`), the parts of backends/wgpu/src/shaders/gemm.wgsl it uses (`GemmParams`, `WM`,
`WK`, `pair_pos`, `fetch_a2` / `fetch_b2`, `fetch_a128` / `fetch_b128`, `pair_a` / `pair_b`,
`store`), the operand readers backends/wgpu/src/pipelines/source.rs generates (`raw_a`,
`raw_a2` for f32 or f16 storage), and the host side of backends/wgpu/src/gemm.rs (`gemm`,
`check_extent`, `plan`, `blocks`, `dispatch_block`'s 12 parameter words and bindings,
lib.rs's `span`, pipelines.rs's `grid`) transcribed into numpy, each function named as in its
source so it can be compared line by line. Threads are vectorised: a WGSL `u32` of thread
`lid` is an int64 array over the 256 `lid`s of a workgroup, a `bool` a mask; subgroup-wide
cooperative operations run once per subgroup.

What it checks, on every dispatch:
- every index into the workgroup arrays `ha` / `hb` (3072 f16 each) and `hc` (2048 f32),
  including each element of a cooperative matrix's 16 x 16 block, is in bounds (the module
  carries no runtime checks, so an out-of-bounds index is a real bug; the largest index seen
  is printed with the summary, against the kernel header's proof: 3063 and 2047); the
  pointer and stride of each cooperative load / store are multiples of 16 bytes (relative to
  the array's start: where the driver places the array is its own);
- every read of `ga` / `gb` / `gc` is inside its binding (the span `dispatch_block` binds,
  rounded to whole words as `bind_elems` does), and every u32 index it reads at is below 2^32;
- races between barriers: within one barrier phase, an element of workgroup memory written by
  one agent (a thread, or a subgroup's cooperative operation) is not read or written by
  another (two threads putting the same element of a tile is caught here);
- stale reads: a cooperative load reads only elements put in the same k-step, `drain_coop`
  only elements its subgroup's `coopStoreT` wrote in the same call;
- c: each element of the block written exactly once per dispatch, nothing else written;
  elements outside the product (the padding of the buffers) stay NaN; beta == 0 never reads
  c (c starts as NaN, so a read would leak);
- the result against the f64 product of the f16-rounded operands (|err| <= 1e-5 (sum |a||b| +
  |beta c|)), operands embedded in NaN-filled buffers so that any element read outside the
  product that reaches the sum shows up as NaN.

What it cannot check: what a driver does with the SPIR-V (naga's lowering of coopLoad /
coopLoadT / coopStoreT / coopMultiplyAdd is taken as: coopLoadT<M>(&arr[base], s) element
(r, c) = arr[base + r s + c], coopLoad (r, c) = arr[base + c s + r], coopStoreT writes (r, c)
to arr[base + r s + c], coopMultiplyAdd(a, b, c) = a @ b + c, f16 operands, f32
accumulation); every way subgroups may map onto the workgroup (two are run: subgroup_id =
lid / 32 and lid % 8, 8 subgroups of 32 lanes either way; other sizes are not, the host
refuses them); the memory model (a barrier is modelled as a full workgroup-memory fence,
which naga 30's SPIR-V does not promise, see the kernel's header); the accumulation order and
rounding inside a tensor-core MMA (emulated as a float32 numpy matmul); f32 -> f16 rounding
(numpy's round-to-nearest-even, overflow to inf; WGSL allows either neighbour); FMA
contraction in `store`; performance (bank conflicts: a consistently different HSK is valid).

Agents are 0..255 (threads) and 256 + sg (subgroup sg's cooperative operations).

How to run (python3 with numpy, e.g. /usr/bin/python3; no GPU; ~15 s, --mutations ~45 s):
    python3 lab/wgpu/coop_emu.py --check            # the conformance cases, exit 1 on failure
    python3 lab/wgpu/coop_emu.py --check --mutate c0_sg_mod2   # the same with a planted bug
    python3 lab/wgpu/coop_emu.py --mutations        # every planted bug: caught or not
"""
import argparse
import struct
import sys
import time

import numpy as np

# ---- gemm.wgsl / gemm_coop.wgsl constants ------------------------------------------------------
WM = 128
WK = 16
HSK = 24  # halves per row of a tile stored along k: 16 + 8 pad
HSW = 136  # halves per row of a tile stored along the 128-wide dimension: 128 + 8
HA_LEN = 3072
HC_LEN = 2048
THREADS = 256
U32 = 1 << 32

# Planted bugs (--mutate NAME): each changes one statement of the transcription, marked
# `# MUTATION <name>` where it does. BENIGN ones are changes that keep the kernel correct, which
# no check should flag: HSK is only a pad (any row stride >= 16 whose rows stay inside the
# 3072 halves is a valid layout: 127 * 16 + 16 = 2048), and the fetch's own `kk < gp.k` tests
# already make a fetch past the last k-step read nothing (the guard only saves the work).
BENIGN = {"hsk16", "no_kstep_guard"}
MUTATIONS = {
    "swap_load_a": "coop_a uses coopLoad where the WGSL has coopLoadT and vice versa",
    "swap_load_b": "coop_b uses coopLoad where the WGSL has coopLoadT and vice versa",
    "hsk16": "HSK = 16 everywhere (tile_at and coop_a / coop_b alike)",
    "hsk16_tile_at": "HSK = 16 in tile_at only (the puts), 24 in the cooperative loads",
    "hsk8": "HSK = 8 everywhere (rows of 16 k in 8 halves: the puts overlap)",
    "c0_sg_mod2": "c0 = 64 (sg % 2) instead of 64 (sg / 4)",
    "no_kstep_guard": "the next step's fetch without `if (k0 + WK < gp.k)`",
    "fetch_past_k": "fetch_a2 / fetch_b2 without their `kk < gp.k` tests (fetch past k)",
    "beta_twice": "store: gc = beta * (beta * gc) + x",
    "host_beta_every_chunk": "dispatch_block passes beta to every K chunk, not 1 after the first",
    "drop_loop_barrier2": "no workgroupBarrier at the end of the k loop",
    "drop_drain_barrier1": "no workgroupBarrier between coopStoreT and the lanes' reads",
}
MUT = None
# What the cases exercised (printed with the summary): pairs read as one load, pairs split
# (an odd base, or the second element outside), workgroups of a 2-D grid's tail, dispatches
# of a K chunk after the first (beta = 1).
COVER = {"one_load": 0, "split_pair_odd_base": 0, "split_pair_edge": 0, "tail_wg": 0,
         "later_k_chunk": 0, "max_ha": -1, "max_hb": -1, "max_hc": -1}
# How subgroup_id / subgroup_invocation_id map to local_invocation_index: "blocked" (lid / 32,
# lid % 32, what the brief assumes) or "interleaved" (lid % 8, lid / 8: Vulkan promises no
# mapping, and the kernel must not depend on one).
SG_MAP = "blocked"


def mut(name):
    assert name in MUTATIONS, name
    return MUT == name


class KernelFault(Exception):
    """An out-of-bounds index, a race, a stale read or a bad store: a bug in the kernel."""


# ---- workgroup memory: values plus the bookkeeping of the checks ------------------------------


class Workgroup:
    """A `var<workgroup>` array. Agents: thread `lid` is `lid`, subgroup `sg`'s cooperative
    operations are 256 + sg. Per barrier phase it records who wrote and who read each element;
    `epoch` is the step (k-step, or drain call) in which each element was last written."""

    def __init__(self, name, n, dtype):
        self.name, self.n, self.dtype = name, n, dtype
        self.v = np.full(n, np.nan, dtype)  # uninitialised: NaN
        self.epoch = np.full(n, -1, np.int64)
        self.writer = np.full(n, -1, np.int64)
        self.reader = np.full(n, -1, np.int64)  # -2: several readers

    def barrier(self):
        self.writer[:] = -1
        self.reader[:] = -1

    def _bounds(self, idx, what):
        if idx.size:
            COVER["max_" + self.name] = max(COVER["max_" + self.name], int(idx.max()))
        if idx.size and (idx.min() < 0 or idx.max() >= self.n):
            raise KernelFault(
                f"{what}: {self.name}[{idx.min()}..{idx.max()}] outside array<{self.n}>")

    def write(self, idx, val, agent, epoch, what):
        idx = np.asarray(idx, np.int64).ravel()
        agent = np.broadcast_to(np.asarray(agent, np.int64), idx.shape).ravel()
        val = np.asarray(val).ravel()
        self._bounds(idx, what)
        # Two agents writing one element in one phase (e.g. two threads' puts overlapping).
        o = np.lexsort((agent, idx))
        si, sa = idx[o], agent[o]
        clash = (si[1:] == si[:-1]) & (sa[1:] != sa[:-1])
        if clash.any():
            e = si[1:][clash][0]
            raise KernelFault(f"{what}: {self.name}[{e}] written by two agents in one phase")
        w, r = self.writer[idx], self.reader[idx]
        for seen, verb in ((w, "written"), (r, "read")):
            bad = (seen != -1) & (seen != agent)
            if bad.any():
                who = "several agents" if seen[bad][0] == -2 else f"agent {seen[bad][0]}"
                raise KernelFault(f"{what}: race on {self.name}[{idx[bad][0]}]: written by "
                                  f"agent {agent[bad][0]}, {verb} by {who} in the same "
                                  "barrier phase")
        self.v[idx] = val.astype(self.dtype)
        self.writer[idx] = agent
        self.epoch[idx] = epoch

    def read(self, idx, agent, epoch, what):
        shape = np.shape(idx)
        idx = np.asarray(idx, np.int64).ravel()
        agent = np.broadcast_to(np.asarray(agent, np.int64), idx.shape).ravel()
        self._bounds(idx, what)
        w = self.writer[idx]
        bad = (w != -1) & (w != agent)
        if bad.any():
            raise KernelFault(f"{what}: race on {self.name}[{idx[bad][0]}] (read by agent "
                              f"{agent[bad][0]}, written by agent {w[bad][0]} in the same "
                              "barrier phase)")
        stale = self.epoch[idx] != epoch
        if stale.any():
            e = idx[stale][0]
            raise KernelFault(f"{what}: {self.name}[{e}] read before it was written this step "
                              f"(last written in step {self.epoch[e]}, now {epoch})")
        r = self.reader[idx]
        self.reader[idx] = np.where((r == -1) | (r == agent), agent, -2)
        # several agents reading one element in this batch: mark it -2
        o = np.lexsort((agent, idx))
        si, sa = idx[o], agent[o]
        many = (si[1:] == si[:-1]) & (sa[1:] != sa[:-1])
        self.reader[si[1:][many]] = -2
        return self.v[idx].reshape(shape)


# ---- storage bindings and source.rs's generated operand readers -------------------------------


class Storage:
    """A wgpu buffer of `n` f32 or f16 elements (`data`, its tail padded with NaN to whole
    words: an f16 tensor's buffer always has room for the rounding of `bind_elems`)."""

    def __init__(self, n, f16):
        self.f16 = f16
        self.len = n
        dtype = np.float16 if f16 else np.float32
        self.data = np.full(n + (n & 1 if f16 else 0) + 2, np.nan, dtype)

    def size(self):
        return 2 if self.f16 else 4

    def bind_elems(self, start, len_):
        """storage.rs's bind_elems: elements [start, start + len), size rounded up to words."""
        es = self.size()
        size = max(-(-(es * len_) // 4) * 4, 4)
        assert start + size // es <= self.data.size, "binding past the buffer"
        return self.data[start:start + size // es]  # a view: gc's writes land in the buffer


class Operand:
    """source.rs's gemm_operand: `g{x}` bound as array<f32> or array<vec2<f16>>, raw_x(i),
    raw_x2(i). Reads are checked against the binding (the module has no runtime checks)."""

    def __init__(self, name, binding, f16):
        self.name, self.g, self.f16 = name, binding, f16
        self.words = binding.size // 2 if f16 else binding.size  # elements of g{x}

    def _check(self, w, what):
        if w.size and (w.max() >= self.words or w.min() < 0):
            raise KernelFault(f"{what}: g{self.name}[{w.max()}] outside the binding of "
                              f"{self.words}")

    def raw(self, i):
        """raw_x(i): f32 `g[i]`; f16 `g[i >> 1u][i & 1u]`."""
        if i.size and i.max() >= U32:
            raise KernelFault(f"raw_{self.name}: index {i.max()} wraps u32")
        if self.f16:
            self._check(i >> 1, f"raw_{self.name}")
            return self.g[2 * (i >> 1) + (i & 1)]
        self._check(i, f"raw_{self.name}")
        return self.g[i]

    def raw2(self, i):
        """raw_x2(i): f32 `vec2(g[i], g[i + 1u])`; f16 `g[i >> 1u]` (the word holding i)."""
        if i.size and i.max() + 1 >= U32:
            raise KernelFault(f"raw_{self.name}2: index {i.max()} wraps u32")
        if self.f16:
            self._check(i >> 1, f"raw_{self.name}2")
            w = i >> 1
            return np.stack([self.g[2 * w], self.g[2 * w + 1]], axis=-1)
        self._check(i, f"raw_{self.name}2")
        self._check(i + 1, f"raw_{self.name}2")
        return np.stack([self.g[i], self.g[i + 1]], axis=-1)


class GemmParams:
    """gemm.wgsl's GemmParams read from the 12 parameter words of dispatch_block."""

    def __init__(self, words):
        (self.m, self.n, self.k, self.a_off, self.lda, self.ta, self.b_off, self.ldb, self.tb,
         self.c_off, self.ldc) = [int(w) for w in words[:11]]
        self.beta = np.float32(struct.unpack("<f", struct.pack("<I", words[11]))[0])


# ---- the kernel ----------------------------------------------------------------------------------


def pair_pos(lid, p, along_k):
    """gemm.wgsl pair_pos: (x of 128, kk of 16) of pair p of thread lid."""
    if along_k:
        return (lid // 8 + 32 * p, 2 * (lid % 8))
    return (2 * (lid % 64), lid // 64 + 4 * p)


def coop_load_t(arr, base, stride, agent, epoch, what):
    """coopLoadT<M>(&arr[base], stride): row-major, (r, c) = arr[base + r stride + c]."""
    check_coop_alignment(arr, base, stride, what)
    r, c = np.indices((16, 16))
    return arr.read(base + r * stride + c, agent, epoch, what)


def coop_load(arr, base, stride, agent, epoch, what):
    """coopLoad<M>(&arr[base], stride): column-major, (r, c) = arr[base + c stride + r]."""
    check_coop_alignment(arr, base, stride, what)
    r, c = np.indices((16, 16))
    return arr.read(base + c * stride + r, agent, epoch, what)


def coop_store_t(acc, arr, base, stride, agent, epoch, what):
    """coopStoreT(acc, &arr[base], stride): (r, c) to arr[base + r stride + c]."""
    check_coop_alignment(arr, base, stride, what)
    r, c = np.indices((16, 16))
    arr.write(base + r * stride + c, acc, agent, epoch, what)


def check_coop_alignment(arr, base, stride, what):
    es = arr.v.itemsize
    if (base * es) % 16 or (stride * es) % 16:
        raise KernelFault(f"{what}: pointer {arr.name}[{base}] or stride {stride} not a "
                          "multiple of 16 bytes")


def coop_multiply_add(a, b, c):
    """coopMultiplyAdd(a, b, c) = a @ b + c: f16 operands, f32 accumulation."""
    return (np.matmul(a.astype(np.float32), b.astype(np.float32)) + c).astype(np.float32)


class MatmulCoop:
    """One dispatch: the module-scope variables (gp, ga, gb, gc; ha, hb, hc per workgroup)."""

    def __init__(self, words, ga, gb, gc):
        self.gp = GemmParams(words)
        self.ga, self.gb = ga, gb
        self.gc = gc  # f32 binding (a view into the buffer)
        self.gc_writes = np.zeros(gc.size, np.int64)
        self.gc_read = np.zeros(gc.size, bool)

    # -- gemm.wgsl ------------------------------------------------------------------------------
    def pair_a(self, base, lo, hi):
        return self._pair(self.ga, base, lo, hi)

    def pair_b(self, base, lo, hi):
        return self._pair(self.gb, base, lo, hi)

    @staticmethod
    def _pair(g, base, lo, hi):
        """pair_a / pair_b: stored elements base and base + 1, 0 where lo / hi is false."""
        v = np.zeros(base.shape + (2,), np.float16 if g.f16 else np.float32)  # var v = Raw()
        one_load = hi & ((base & 1) == 0)  # if (hi && (base & 1u) == 0u) { return raw2(base); }
        v[one_load] = g.raw2(base[one_load])
        rest = ~one_load
        COVER["one_load"] += int(one_load.sum())
        COVER["split_pair_odd_base"] += int((rest & hi).sum())
        COVER["split_pair_edge"] += int((rest & lo & ~hi).sum())
        lo_, hi_ = rest & lo, rest & hi
        v[lo_, 0] = g.raw(base[lo_])  # if (lo) { v.x = raw(base); }
        v[hi_, 1] = g.raw(base[hi_] + 1)  # if (hi) { v.y = raw(base + 1u); }
        return v

    def fetch_a2(self, lid, p, m0, k0):
        gp = self.gp
        at = pair_pos(lid, p, gp.ta == 0)
        i = m0 + at[0]
        kk = k0 + at[1]
        kin = lambda x: True if mut("fetch_past_k") else x < gp.k  # MUTATION fetch_past_k
        if gp.ta == 0:
            inside = i < gp.m
            return self.pair_a(gp.a_off + i * gp.lda + kk, inside & kin(kk), inside & kin(kk + 1))
        inside = np.broadcast_to(kin(kk), lid.shape)
        return self.pair_a(gp.a_off + kk * gp.lda + i, inside & (i < gp.m), inside & (i + 1 < gp.m))

    def fetch_b2(self, lid, p, k0, n0):
        gp = self.gp
        at = pair_pos(lid, p, gp.tb != 0)
        j = n0 + at[0]
        kk = k0 + at[1]
        kin = lambda x: True if mut("fetch_past_k") else x < gp.k  # MUTATION fetch_past_k
        if gp.tb != 0:
            inside = j < gp.n
            return self.pair_b(gp.b_off + j * gp.ldb + kk, inside & kin(kk), inside & kin(kk + 1))
        inside = np.broadcast_to(kin(kk), lid.shape)
        return self.pair_b(gp.b_off + kk * gp.ldb + j, inside & (j < gp.n), inside & (j + 1 < gp.n))

    def fetch_a128(self, lid, m0, k0):
        return [self.fetch_a2(lid, p, m0, k0) for p in range(4)]  # FragA(p0, p1, p2, p3)

    def fetch_b128(self, lid, k0, n0):
        return [self.fetch_b2(lid, p, k0, n0) for p in range(4)]  # FragB(p0, p1, p2, p3)

    def store(self, i, j, x):
        """gemm.wgsl store(i, j, x), for the threads of the arrays i, j, x."""
        gp = self.gp
        ok = j < gp.n  # if (j < gp.n)
        i, j, x = i[ok], j[ok], x[ok]
        at = gp.c_off + i * gp.ldc + j
        if at.size and (at.max() >= self.gc.size or at.max() >= U32):
            raise KernelFault(f"store: gc[{at.max()}] outside the binding of {self.gc.size}")
        np.add.at(self.gc_writes, at, 1)
        if gp.beta == 0.0:
            self.gc[at] = x
        else:
            self.gc_read[at] = True
            if mut("beta_twice"):  # MUTATION beta_twice
                self.gc[at] = gp.beta * (gp.beta * self.gc[at]) + x
            else:
                self.gc[at] = gp.beta * self.gc[at] + x

    # -- gemm_coop.wgsl ---------------------------------------------------------------------------
    def tile_at(self, at, along_k):
        hsk = 16 if mut("hsk16") or mut("hsk16_tile_at") else 8 if mut("hsk8") else HSK  # MUTATION
        return np.where(along_k, at[0] * hsk + at[1], at[1] * HSW + at[0])

    def put_pair_ha(self, at, along_k, v, lid):
        i = self.tile_at(at, along_k)
        self.ha.write(i, v[:, 0], lid, self.step, "put_pair_ha")  # ha[i] = v.x
        self.ha.write(i + 1, v[:, 1], lid, self.step, "put_pair_ha")  # ha[i + 1u] = v.y

    def put_pair_hb(self, at, along_k, v, lid):
        i = self.tile_at(at, along_k)
        self.hb.write(i, v[:, 0], lid, self.step, "put_pair_hb")
        self.hb.write(i + 1, v[:, 1], lid, self.step, "put_pair_hb")

    def put_a_coop(self, lid, f):
        ak = self.gp.ta == 0
        for p in range(4):  # put_pair_ha(pair_pos(lid, p, ak), ak, vec2<f16>(f.pP))
            self.put_pair_ha(pair_pos(lid, p, ak), ak, f[p].astype(np.float16), lid)

    def put_b_coop(self, lid, f):
        bk = self.gp.tb != 0
        for p in range(4):
            self.put_pair_hb(pair_pos(lid, p, bk), bk, f[p].astype(np.float16), lid)

    def coop_a(self, r0, sg):
        hsk = 16 if mut("hsk16") else 8 if mut("hsk8") else HSK  # MUTATION hsk16 / hsk8
        row_major, col_major = coop_load_t, coop_load
        if mut("swap_load_a"):  # MUTATION swap_load_a
            row_major, col_major = coop_load, coop_load_t
        if self.gp.ta == 0:
            return row_major(self.ha, r0 * hsk, hsk, 256 + sg, self.step, "coop_a")
        return col_major(self.ha, r0, HSW, 256 + sg, self.step, "coop_a")

    def coop_b(self, c0, sg):
        hsk = 16 if mut("hsk16") else 8 if mut("hsk8") else HSK  # MUTATION hsk16 / hsk8
        row_major, col_major = coop_load_t, coop_load
        if mut("swap_load_b"):  # MUTATION swap_load_b
            row_major, col_major = coop_load, coop_load_t
        if self.gp.tb == 0:
            return row_major(self.hb, c0, HSW, 256 + sg, self.step, "coop_b")
        return col_major(self.hb, c0 * hsk, hsk, 256 + sg, self.step, "coop_b")

    def workgroup_barrier(self):
        for arr in (self.ha, self.hb, self.hc):
            arr.barrier()

    def drain_coop(self, acc, sg, lane, i0, j0, lid):
        """drain_coop for every thread at once: acc[s] is subgroup s's accumulator, sg, lane,
        i0, j0 and lid arrays over the 256 threads."""
        self.drain += 1
        base = sg * 256
        for s in np.unique(sg):  # coopStoreT(acc, &hc[base], 16u), once per subgroup
            coop_store_t(acc[s], self.hc, s * 256, 16, 256 + s, self.drain, "drain_coop")
        if not mut("drop_drain_barrier1"):  # MUTATION drop_drain_barrier1
            self.workgroup_barrier()
        for e in range(8):
            at = lane + 32 * e
            i = i0 + at // 16
            inside = i < self.gp.m  # if (i < gp.m) { store(i, j0 + at % 16u, hc[base + at]); }
            x = self.hc.read((base + at)[inside], lid[inside], self.drain, "drain_coop")
            self.store(i[inside], (j0 + at % 16)[inside], x)
        self.workgroup_barrier()

    def matmul_coop(self, wid, nwg):
        gp = self.gp
        lid = np.arange(THREADS, dtype=np.int64)  # local_invocation_index
        if SG_MAP == "blocked":
            sg_in, lane_in = lid // 32, lid % 32  # subgroup_id, subgroup_invocation_id
        else:
            sg_in, lane_in = lid % 8, lid // 8
        tiles_n = (gp.n + WM - 1) // WM
        g = wid[0] + wid[1] * nwg[0]
        if g >= tiles_n * ((gp.m + WM - 1) // WM):
            COVER["tail_wg"] += 1
            return  # the tail of a 2-D grid
        m0 = (g // tiles_n) * WM
        n0 = (g % tiles_n) * WM
        sg = np.minimum(sg_in, 7)
        lane = lane_in & 31
        r0 = 32 * (sg % 4)
        c0 = 64 * (sg % 2) if mut("c0_sg_mod2") else 64 * (sg // 4)  # MUTATION c0_sg_mod2
        self.ha = Workgroup("ha", HA_LEN, np.float16)
        self.hb = Workgroup("hb", HA_LEN, np.float16)
        self.hc = Workgroup("hc", HC_LEN, np.float32)
        self.step, self.drain = 0, 0
        # cRC of subgroup s: acc[s, R, C] (rows r0 + 16 R, columns c0 + 16 C of the tile)
        acc = np.zeros((8, 2, 4, 16, 16), np.float32)
        subgroups = np.unique(sg)
        fa = self.fetch_a128(lid, m0, 0)
        fb = self.fetch_b128(lid, 0, n0)
        k0 = 0
        while k0 < gp.k:
            self.step += 1
            self.put_a_coop(lid, fa)
            self.put_b_coop(lid, fb)
            self.workgroup_barrier()
            if k0 + WK < gp.k or mut("no_kstep_guard"):  # MUTATION no_kstep_guard
                fa = self.fetch_a128(lid, m0, k0 + WK)
                fb = self.fetch_b128(lid, k0 + WK, n0)
            for s in subgroups:  # each subgroup's cooperative operations (r0, c0 of its lanes)
                r0_s, c0_s = int(r0[sg == s][0]), int(c0[sg == s][0])
                a = [self.coop_a(r0_s, s), self.coop_a(r0_s + 16, s)]
                b = [self.coop_b(c0_s + 16 * C, s) for C in range(4)]
                for R in range(2):
                    for C in range(4):
                        acc[s, R, C] = coop_multiply_add(a[R], b[C], acc[s, R, C])
            if not mut("drop_loop_barrier2"):  # MUTATION drop_loop_barrier2
                self.workgroup_barrier()
            k0 = k0 + WK
        i0 = m0 + r0
        i1 = m0 + r0 + 16
        j0 = n0 + c0
        for R, i in ((0, i0), (1, i1)):
            for C in range(4):  # drain_coop(cRC, sg, lane, iR, j0 + 16 C)
                self.drain_coop(acc[:, R, C], sg, lane, i, j0 + 16 * C, lid)


# ---- the host: gemm.rs ---------------------------------------------------------------------------

TILE = 128


class Device:
    """The adapter limits the host reads."""

    def __init__(self, max_binding_bytes=1 << 30, offset_align=256, max_wg_per_dim=65535):
        self.max_binding_bytes = max_binding_bytes
        self.min_storage_buffer_offset_alignment = offset_align
        self.max_compute_workgroups_per_dimension = max_wg_per_dim

    def align_of(self, f16):  # storage.rs
        return max(max(self.min_storage_buffer_offset_alignment, 4) // (2 if f16 else 4), 1)

    def max_binding_elems(self):  # lib.rs
        return self.max_binding_bytes // 4

    def span_elems(self):
        return self.max_binding_elems() - self.align_of(False)

    def span_elems_of(self, f16):
        return self.span_elems() * (2 if f16 else 1)

    def span(self, s, start, len_):
        """lib.rs span: the binding from the aligned offset at or below start, and the shift."""
        align = self.align_of(s.f16)
        base = start // align * align
        return s.bind_elems(base, len_ + (start - base)), start - base

    def grid(self, groups):  # pipelines.rs
        mx = max(self.max_compute_workgroups_per_dimension, 1)
        x = min(groups, mx)
        y = -(-groups // max(x, 1))
        assert y <= mx
        return x, y


def stored_extent(t, r, c):
    return (r, c) if not t else (c, r)


def plan(mnk, tt, limits):
    m, n, k = mnk
    ta, tb = tt
    limit_a, limit_b, limit_c = limits
    mc, nc, kc = max(m, 1), max(n, 1), max(k, 1)
    while True:
        spans = [
            (mc * k, 0, limit_a) if not ta else (kc * m, 2, limit_a),
            (kc * n, 2, limit_b) if not tb else (nc * k, 1, limit_b),
            (mc * n, 0, limit_c),
        ]
        over = [s for s in spans if s[0] > s[2]]
        if not over:
            return mc, nc, kc
        top = max(s[0] for s in over)
        dim = [s for s in over if s[0] == top][-1][1]  # Rust's max_by_key: the last maximum
        d = [mc, nc, kc][dim]
        if d == 1:
            return None
        d = min(-(-(d // 2) // TILE) * TILE, d - 1) if d > 2 * TILE else d // 2
        if dim == 0:
            mc = d
        elif dim == 1:
            nc = d
        else:
            kc = d


def blocks(mnk, chunks):
    m, n, k = mnk
    mc, nc, kc = chunks
    out = []
    for m0 in range(0, m, mc):
        for n0 in range(0, n, nc):
            ks = [0] if k == 0 else list(range(0, k, kc))
            for k0 in ks:
                out.append((m0, min(mc, m - m0), n0, min(nc, n - n0), k0, min(kc, max(k - k0, 0))))
    return out


def check_extent(o, rows, cols):
    s, at, ld, _ = o
    end = rows * ld + at
    assert cols <= ld and end <= s.len, "operand outside its buffer"


def gemm(dev, a, b, c, c_at, mnk, beta, stats):
    """gemm.rs WgpuBackend::gemm with the kernel matmul_coop. a, b: (Storage, at, ld, t)."""
    m, n, k = mnk
    if m == 0 or n == 0:
        return
    assert k > 0  # k == 0 is a fill / scale on the host, not this kernel
    check_extent(a, *stored_extent(a[3], m, k))
    check_extent(b, *stored_extent(b[3], k, n))
    c_out = (c, c_at, n, False)
    check_extent(c_out, m, n)
    limits = (dev.span_elems_of(a[0].f16), dev.span_elems_of(b[0].f16), dev.span_elems())
    chunks = plan((m, n, k), (a[3], b[3]), limits)
    assert chunks is not None
    for blk in blocks((m, n, k), chunks):
        dispatch_block(dev, a, b, c_out, beta, blk, stats)


def dispatch_block(dev, a, b, c, beta, blk, stats):
    """gemm.rs dispatch_block: the bindings, the 12 parameter words, the grid; then the run."""
    m0, bm, n0, bn, k0, bk = blk
    first_k = k0 == 0
    ar0, arows, acol = (m0, bm, k0) if not a[3] else (k0, bk, m0)
    br0, brows, bcol = (k0, bk, n0) if not b[3] else (n0, bn, k0)
    ab, ash = dev.span(a[0], a[1] + ar0 * a[2], max(arows, 1) * a[2])
    bb, bsh = dev.span(b[0], b[1] + br0 * b[2], max(brows, 1) * b[2])
    cb, csh = dev.span(c[0], c[1] + m0 * c[2], bm * c[2])
    beta_word = beta if first_k or mut("host_beta_every_chunk") else 1.0  # MUTATION
    COVER["later_k_chunk"] += not first_k
    words = [bm, bn, bk, ash + acol, a[2], int(a[3]), bsh + bcol, b[2], int(b[3]),
             csh + n0, c[2], struct.unpack("<I", struct.pack("<f", beta_word))[0]]
    assert all(0 <= w < U32 for w in words)
    groups = -(-bm // WM) * -(-bn // WM)
    gx, gy = dev.grid(groups)
    k_ = MatmulCoop(words, Operand("a", ab, a[0].f16), Operand("b", bb, b[0].f16), cb)
    for wy in range(gy):
        for wx in range(gx):
            k_.matmul_coop((wx, wy, 0), (gx, gy, 1))
    # Each element of the block's c written exactly once, nothing else.
    want = np.zeros(cb.size, np.int64)
    gp = k_.gp
    ii, jj = np.meshgrid(np.arange(gp.m), np.arange(gp.n), indexing="ij")
    want[(gp.c_off + ii * gp.ldc + jj).ravel()] = 1
    if (k_.gc_writes != want).any():
        e = np.flatnonzero(k_.gc_writes != want)[0]
        raise KernelFault(f"store: gc[{e}] of the block written {k_.gc_writes[e]} times, "
                          f"want {want[e]}")
    if gp.beta == 0.0 and k_.gc_read.any():
        raise KernelFault("store: read c with beta == 0")
    stats["dispatches"] += 1
    stats["workgroups"] += gx * gy


# ---- the check ---------------------------------------------------------------------------------


def run_case(rng, case):
    global SG_MAP
    SG_MAP = case.get("sg_map", "blocked")
    (m, n, k), ta, tb, a16, b16, beta = case["shape"], case["ta"], case["tb"], case["a16"], \
        case["b16"], case["beta"]
    dev = case.get("dev", Device())
    a_at, a_pad, b_at, b_pad, c_at = (case.get(x, 0) for x in ("a_at", "a_pad", "b_at", "b_pad",
                                                              "c_at"))
    A = rng.uniform(-1, 1, (m, k)).astype(np.float32)  # op(a)
    B = rng.uniform(-1, 1, (k, n)).astype(np.float32)  # op(b)

    def embed(X, t, at, pad, f16):
        S = X.T if t else X  # the stored matrix
        rows, cols = S.shape
        ld = cols + pad
        st = Storage(at + rows * ld + 3, f16)
        view = st.data[at:at + rows * ld].reshape(rows, ld)
        view[:, :cols] = S
        return st, ld

    sa, lda = embed(A, ta, a_at, a_pad, a16)
    sb, ldb = embed(B, tb, b_at, b_pad, b16)
    sc = Storage(c_at + m * n + 5, False)
    C0 = rng.uniform(-1, 1, (m, n)).astype(np.float32)
    if beta != 0.0:
        sc.data[c_at:c_at + m * n] = C0.ravel()  # else: c stays NaN, must not be read
    stats = {"dispatches": 0, "workgroups": 0}
    try:
        gemm(dev, (sa, a_at, lda, ta), (sb, b_at, ldb, tb), sc, c_at, (m, n, k), beta, stats)
    except KernelFault as e:
        return False, f"FAULT {e}", stats
    A16 = A.astype(np.float16).astype(np.float64)
    B16 = B.astype(np.float16).astype(np.float64)
    ref = A16 @ B16
    scale = np.abs(A16) @ np.abs(B16)
    if beta != 0.0:
        ref = ref + np.float64(beta) * C0
        scale = scale + np.abs(np.float64(beta) * C0)
    got = sc.data[c_at:c_at + m * n].reshape(m, n).astype(np.float64)
    outside = np.concatenate([sc.data[:c_at], sc.data[c_at + m * n:]])
    if not np.isnan(outside).all():
        return False, "wrote c outside the product", stats
    if np.isnan(got).any():
        i, j = np.argwhere(np.isnan(got))[0]
        return False, f"NaN at c[{i},{j}] ({np.isnan(got).sum()} NaN)", stats
    err = np.abs(got - ref) / (scale + 1e-30)
    worst = err.max()
    if worst > 1e-5:
        i, j = np.unravel_index(err.argmax(), err.shape)
        return False, (f"c[{i},{j}] = {got[i, j]:.6g}, want {ref[i, j]:.6g} (err {worst:.2e} of "
                       "sum |a||b|)"), stats
    return True, f"err {worst:.1e}", stats


def cases():
    out = []
    shapes = [(7, 5, 3), (33, 65, 17), (1, 9, 1), (130, 257, 67), (200, 33, 100), (130, 40, 131),
              (3, 700, 2), (128, 128, 32), (16, 16, 16)]
    dts = [(False, False), (True, True), (False, True), (True, False)]
    for s in shapes:
        for ta, tb in [(0, 0), (0, 1), (1, 0), (1, 1)]:
            for a16, b16 in dts:
                for beta in (0.0, -0.5):
                    out.append(dict(shape=s, ta=ta, tb=tb, a16=a16, b16=b16, beta=beta))
    # Sub-blocks as gemm.rs's chunking produces them: operands at offsets inside larger
    # buffers with row strides longer than their rows, bindings narrow enough that `plan`
    # splits M, N and K (K chunks after the first with beta = 1), binding offsets aligned to
    # 256 or 16 bytes (so odd element shifts for f16), and a grid of at most 4 workgroups a row
    # (a 2-D grid with a tail).
    # Subgroups interleaved across the workgroup (subgroup_id = lid % 8).
    for s in [(33, 65, 17), (130, 257, 67)]:
        for ta, tb in [(0, 0), (0, 1), (1, 0), (1, 1)]:
            out.append(dict(shape=s, ta=ta, tb=tb, a16=ta == 1, b16=False, beta=-0.5,
                            sg_map="interleaved"))
    # (290, 200, 300) under 30000-word bindings: t00 f32/f32 splits M (64) and K (128, 128,
    # 44), t01 f16/f16 N (100), t10 f32/f16 K (64), t11 f16/f16 N and K (100, 128).
    small = Device(max_binding_bytes=4 * 30000, offset_align=256)
    # (260, 520, 45) under 45000-word bindings: M in chunks of 64 (shifts of the f16 a odd:
    # 16-byte alignment is 8 halves), 5 workgroups a dispatch on a grid of 4 x 2.
    tiny_align = Device(max_binding_bytes=4 * 45000, offset_align=16, max_wg_per_dim=4)
    for (ta, tb), (a16, b16) in zip([(0, 0), (0, 1), (1, 0), (1, 1)],
                                    [(False, False), (True, True), (False, True), (True, True)]):
        for beta in (0.0, -0.5):
            out.append(dict(shape=(290, 200, 300), ta=ta, tb=tb, a16=a16, b16=b16, beta=beta,
                            a_at=37, a_pad=5, b_at=11, b_pad=3, c_at=29, dev=small))
            out.append(dict(shape=(260, 520, 45), ta=ta, tb=tb, a16=True, b16=tb == 1,
                            beta=beta, a_at=3, a_pad=1, b_at=6, b_pad=0, c_at=1,
                            dev=tiny_align))
    return out


def check(quiet=False, stop_at_first=False, first_failure=None):
    rng = np.random.default_rng(12345)
    for key in COVER:
        COVER[key] = -1 if key.startswith("max_") else 0
    t0 = time.time()
    fails = 0
    cs = cases()
    for n, case in enumerate(cs):
        ok, msg, stats = run_case(rng, case)
        fails += not ok
        if not quiet or not ok:
            d = case.get("dev")
            sub = ""
            if d is not None:
                align = d.min_storage_buffer_offset_alignment
                sub = (f" sub-blocks(at {case['a_at']}/{case['b_at']}/{case['c_at']}, ld+"
                       f"{case['a_pad']}/{case['b_pad']}, align {align})")
            if "sg_map" in case:
                sub += f" subgroups {case['sg_map']}"
            print(f"{'ok  ' if ok else 'FAIL'} {'x'.join(map(str, case['shape'])):>11} "
                  f"t{case['ta']}{case['tb']} f{16 if case['a16'] else 32}/"
                  f"{16 if case['b16'] else 32} beta {case['beta']:>4}{sub} "
                  f"[{stats['dispatches']} dispatch, {stats['workgroups']} wg] {msg}",
                  flush=True)
        if not ok and first_failure is not None and not first_failure:
            first_failure.append(f"{'x'.join(map(str, case['shape']))} t{case['ta']}{case['tb']}"
                                 f" beta {case['beta']}: {msg}")
        if not ok and stop_at_first:
            break
    print(f"{n + 1 - fails} passed, {fails} failed "
          f"({time.time() - t0:.1f} s){' mutation ' + MUT if MUT else ''}; exercised: "
          + ", ".join(f"{k} {v}" for k, v in COVER.items()))
    return fails


def main():
    global MUT
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="every case (the default)")
    ap.add_argument("--quick", action="store_true",
                    help="every case, printing failures and the summary only (CI, xtask emu)")
    ap.add_argument("--mutate", choices=sorted(MUTATIONS))
    ap.add_argument("--mutations", action="store_true", help="run every planted bug")
    args = ap.parse_args()
    if args.mutations:
        rows = []
        for name, what in MUTATIONS.items():
            MUT = name
            t0 = time.time()
            first = []
            fails = check(quiet=True, stop_at_first=True, first_failure=first)
            expected = (not fails) if name in BENIGN else bool(fails)
            rows.append((name, "CAUGHT" if fails else "not caught", expected, time.time() - t0,
                         what, first[0] if first else "(all cases pass)"))
        MUT = None
        print("\nmutation               result      expected      time   what / first failure")
        for name, res, expected, t, what, first in rows:
            exp = ("yes" if expected else "NO") + (" (benign)" if name in BENIGN else "")
            print(f"{name:<22} {res:<11} {exp:<13} {t:5.1f}s {what}\n{'':>8}{first}")
        return 0 if all(r[2] for r in rows) else 1
    MUT = args.mutate
    return 1 if check(quiet=args.quick) else 0


if __name__ == "__main__":
    sys.exit(main())
