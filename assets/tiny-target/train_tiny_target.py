#!/usr/bin/env python3
"""Train the tiny embedded default target of dflash-rs.

A byte-level Qwen3ForCausalLM (hidden 128, 8 layers, 4 heads / 2 KV heads, head_dim 32,
intermediate 384, vocab 264) trained on the `.py` sources of the Python standard library found on
the machine it runs on.

Tokenizer (no tokenizer file needed):
    id 0..255  = the byte with that value
    id 256     = MASK (never in the data; the drafter's `mask_token_id`)
    id 257     = EOS/BOS (separates files in the training stream)
    id 258..263 unused (vocab padded to 264)

Split: every stdlib `.py` file (sorted relative paths) is held out when
`sha256(relpath) mod 20 == 0` (~5%); the rest are training files. `make_dataset.py` in
assets/tiny-data builds the drafter dataset from the held-out files only (it imports the
functions below).

Usage (defaults reproduce the shipped model, up to GPU non-determinism):
    python3 assets/tiny-target/train_tiny_target.py [--out-dir DIR] [--steps N|auto]
Needs torch + transformers (>= 4.5x; written against 5.x) and a CUDA GPU (CPU works, slowly).
"""
import argparse
import hashlib
import math
import os
import sys
import sysconfig
import time

import numpy as np

VOCAB_SIZE = 264
MASK_ID = 256
EOS_ID = 257
HELDOUT_MOD = 20  # 1 file in 20 held out

# Auto-selected by the original run (`--steps auto --time-budget 225` on one H200); see README.md.
DEFAULT_STEPS = 3505


# ---------------------------------------------------------------- corpus (no torch needed)

def stdlib_root():
    return sysconfig.get_paths()["stdlib"]


def list_py_files(root):
    """Sorted relative paths (with '/') of the stdlib's .py files, site/dist-packages excluded."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(
            d for d in dirnames if d not in ("site-packages", "dist-packages", "__pycache__")
        )
        for f in filenames:
            if not f.endswith(".py"):
                continue
            full = os.path.join(dirpath, f)
            if os.path.islink(full) or not os.path.isfile(full):
                continue
            out.append(os.path.relpath(full, root).replace(os.sep, "/"))
    return sorted(out)


def is_heldout(rel):
    return int(hashlib.sha256(rel.encode("utf-8")).hexdigest(), 16) % HELDOUT_MOD == 0


def load_files(root, rels):
    """[(rel, bytes)] for non-empty files."""
    out = []
    for rel in rels:
        with open(os.path.join(root, rel), "rb") as f:
            data = f.read()
        if data:
            out.append((rel, data))
    return out


def split_corpus(root=None):
    root = root or stdlib_root()
    rels = list_py_files(root)
    train = [r for r in rels if not is_heldout(r)]
    held = [r for r in rels if is_heldout(r)]
    return root, load_files(root, train), load_files(root, held)


def to_stream(files):
    """One int32 token stream: [EOS] file0 [EOS] file1 ... [EOS]."""
    total = sum(len(d) for _, d in files) + len(files) + 1
    s = np.empty(total, dtype=np.int32)
    p = 0
    for _, d in files:
        s[p] = EOS_ID
        p += 1
        s[p:p + len(d)] = np.frombuffer(d, dtype=np.uint8)
        p += len(d)
    s[p] = EOS_ID
    assert p + 1 == total
    return s


# ---------------------------------------------------------------- model

def make_config(**overrides):
    from transformers import Qwen3Config

    kw = dict(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        hidden_act="silu",
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        attention_bias=False,
        attention_dropout=0.0,
        tie_word_embeddings=False,
        use_sliding_window=False,
        initializer_range=0.02,
        bos_token_id=EOS_ID,
        eos_token_id=EOS_ID,
    )
    theta = overrides.pop("rope_theta", 10000.0)
    kw.update(overrides)
    try:  # transformers 5.x
        cfg = Qwen3Config(rope_parameters={"rope_type": "default", "rope_theta": float(theta)}, **kw)
    except TypeError:  # transformers 4.x
        cfg = Qwen3Config(rope_theta=float(theta), **kw)
    rp = getattr(cfg, "rope_parameters", None)
    got = rp["rope_theta"] if isinstance(rp, dict) and "rope_theta" in rp else cfg.rope_theta
    assert float(got) == float(theta), (got, theta)
    assert not cfg.tie_word_embeddings
    return cfg


def lr_at(step, total, peak, warmup, final_frac):
    if step < warmup:
        return peak * (step + 1) / warmup
    t = min(1.0, (step - warmup) / max(1, total - warmup))
    return peak * (final_frac + (1 - final_frac) * 0.5 * (1 + math.cos(math.pi * t)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out-dir", default=here)
    ap.add_argument("--steps", default=str(DEFAULT_STEPS),
                    help="optimizer steps, or 'auto' = as many as fit in --time-budget seconds")
    ap.add_argument("--time-budget", type=float, default=225.0, help="seconds, for --steps auto")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=300)
    ap.add_argument("--final-lr-frac", type=float, default=0.02)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--log-every", type=int, default=100)
    ap.add_argument("--eval-every", type=int, default=1000)
    ap.add_argument("--max-eval-windows", type=int, default=4096)
    ap.add_argument("--stdlib", default=None, help="override the stdlib directory")
    args = ap.parse_args()

    import torch
    import torch.nn.functional as F
    import transformers
    from transformers import Qwen3ForCausalLM

    t_start = time.time()
    print(f"python {sys.version.split()[0]} torch {torch.__version__} transformers {transformers.__version__}")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        print("device:", torch.cuda.get_device_name(0))
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    root, train_files, held_files = split_corpus(args.stdlib)
    tr = to_stream(train_files)
    he = to_stream(held_files)
    print(f"stdlib {root}: {len(train_files)} train files ({tr.size/1e6:.2f}M tokens), "
          f"{len(held_files)} held-out files ({he.size/1e6:.2f}M tokens)")
    assert tr.size > 2_000_000 and he.size > 50_000, "stdlib too small?"

    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    cfg = make_config()
    model = Qwen3ForCausalLM(cfg)
    for impl in ("sdpa",):
        try:
            model.set_attn_implementation(impl)
        except Exception as e:  # older transformers
            print("set_attn_implementation failed:", e)
    model.to(device).float().train()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"params {n_params} ({n_params/1e6:.3f}M), attn {getattr(model.config, '_attn_implementation', '?')}")

    S, B, V = args.seq, args.batch, VOCAB_SIZE
    tr_gpu = torch.from_numpy(tr.astype(np.int64)).to(device)
    he_gpu = torch.from_numpy(he.astype(np.int64)).to(device)
    ar = torch.arange(S + 1, device=device)
    n_he = min((he.size - 1) // S, args.max_eval_windows)
    he_windows = he_gpu[(torch.arange(n_he, device=device) * S)[:, None] + ar]  # each token predicted once
    g_eval = torch.Generator(device=device).manual_seed(args.seed + 99)
    tr_eval_idx = torch.randint(0, tr.size - (S + 1), (min(n_he, 512),), device=device, generator=g_eval)
    tr_windows = tr_gpu[tr_eval_idx[:, None] + ar]
    print(f"held-out eval: {n_he} windows x {S} predicted tokens")

    @torch.no_grad()
    def evaluate(windows, limit=None, fp32=False, bs=256):
        model.eval()
        w_all = windows if limit is None else windows[:limit]
        tot = torch.zeros((), device=device, dtype=torch.float64)
        cnt = 0
        for i in range(0, w_all.shape[0], bs):
            w = w_all[i:i + bs]
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=not fp32 and device.type == "cuda"):
                logits = model(input_ids=w[:, :-1], use_cache=False).logits
            tot += F.cross_entropy(logits.float().reshape(-1, V), w[:, 1:].reshape(-1), reduction="sum").double()
            cnt += w[:, 1:].numel()
        model.train()
        return tot.item() / cnt

    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() >= 2 else no_decay).append(p)
    opt_kw = dict(lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    if device.type == "cuda":
        opt_kw["fused"] = True
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], **opt_kw)

    gen = torch.Generator(device=device).manual_seed(args.seed + 1)
    auto = args.steps == "auto"
    total = 10 ** 9 if auto else int(args.steps)
    if not auto:
        assert total > args.warmup
    T0, T1 = 10, 60  # timing window for --steps auto (inside warm-up, so the schedule is unaffected)
    assert T1 < args.warmup
    loss_acc = torch.zeros((), device=device)
    n_acc = 0
    t_train = time.time()
    t_mark = None
    step = 0
    print(f"training: batch {B} x seq {S} = {B*S} tokens/step, lr {args.lr}, warmup {args.warmup}")
    while step < total:
        lr = lr_at(step, total, args.lr, args.warmup, args.final_lr_frac)
        for gr in opt.param_groups:
            gr["lr"] = lr
        idx = torch.randint(0, tr.size - (S + 1), (B,), device=device, generator=gen)
        win = tr_gpu[idx[:, None] + ar]
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            logits = model(input_ids=win[:, :-1], use_cache=False).logits
        loss = F.cross_entropy(logits.float().reshape(-1, V), win[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_acc += loss.detach()
        n_acc += 1
        step += 1
        if auto and step == T0:
            if device.type == "cuda":
                torch.cuda.synchronize()
            t_mark = time.time()
        if auto and step == T1:
            if device.type == "cuda":
                torch.cuda.synchronize()
            now = time.time()
            per = (now - t_mark) / (T1 - T0)
            left = args.time_budget - (now - t_train)
            evals = 0.0  # eval cost is small; leave a 5% margin for it
            total = T1 + int(0.95 * left / per - evals)
            print(f"auto: {per*1000:.1f} ms/step -> total steps {total} "
                  f"(re-run with --steps {total} to reproduce)")
            assert total > args.warmup + 100
        if step % args.log_every == 0 or step == total:
            avg = (loss_acc / n_acc).item()
            loss_acc.zero_()
            n_acc = 0
            el = time.time() - t_train
            print(f"step {step:6d}  lr {lr:.2e}  train_loss {avg:.4f}  ({el:.0f}s, {step*B*S/el/1e6:.2f}M tok/s)")
        if step % args.eval_every == 0 and step != total:
            print(f"step {step:6d}  heldout_loss(bf16, 256 windows) {evaluate(he_windows, limit=256):.4f}")

    el = time.time() - t_train
    print(f"trained {total} steps in {el:.0f}s ({total*B*S/1e9:.2f}B tokens)")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    h_fp32 = evaluate(he_windows, fp32=True)
    t_fp32 = evaluate(tr_windows, fp32=True)
    print(f"FINAL heldout_loss (fp32, {n_he} windows, nats/byte) {h_fp32:.4f}  = {h_fp32/math.log(2):.4f} bits/byte")
    print(f"FINAL train_loss  (fp32, {tr_windows.shape[0]} random windows, nats/byte) {t_fp32:.4f}")

    os.makedirs(args.out_dir, exist_ok=True)
    model = model.float().cpu()
    try:
        model.save_pretrained(args.out_dir, safe_serialization=True)
    except TypeError:
        model.save_pretrained(args.out_dir)
    with open(os.path.join(args.out_dir, "heldout_files.txt"), "w") as f:
        f.write(f"# held-out stdlib files (python {sys.version.split()[0]}, root {root}); "
                f"sha256(relpath) % {HELDOUT_MOD} == 0\n")
        for rel, _ in held_files:
            f.write(rel + "\n")
    print("saved to", args.out_dir, sorted(os.listdir(args.out_dir)))
    print(f"total wall {time.time()-t_start:.0f}s")


if __name__ == "__main__":
    main()
