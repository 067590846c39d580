#!/usr/bin/env python3
"""HF transformers `generate` on the shapes of `dflash bench`'s `generate.8b.b*` figures, so
that they compare with it in the same device call:

    python3 bench/hf_generate.py --out hf.json
    dflash bench --backend cuda --only generate --baselines hf.json

A random-weight Qwen3-8B-shaped model (bf16, SDPA, on the GPU), prompts of 512 random tokens,
128 new tokens, greedy, no EOS (every sequence runs to its length), the default dynamic KV
cache. Decode tokens per second = batch * (new - 1) / (t(new) - t(1)): the time of the
generation minus that of a prefill-only generation, as dflash counts its decode phase (each
sequence's first token comes from the prefill). Writes `{"generate.8b.bB": tok/s, ...}`.
`--tiny` runs a small model on the CPU (a check that the script works, not a baseline).
"""

import argparse
import json
import sys
import time

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM


def config(tiny: bool) -> Qwen3Config:
    if tiny:
        shape = dict(hidden_size=64, intermediate_size=192, num_hidden_layers=4,
                     num_attention_heads=4, num_key_value_heads=1, head_dim=16, vocab_size=512)
    else:
        shape = dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                     num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                     vocab_size=151936)
    return Qwen3Config(**shape, rms_norm_eps=1e-6, rope_theta=1_000_000.0,
                       max_position_embeddings=40960, tie_word_embeddings=False,
                       attn_implementation="sdpa")


def timed(model, ids, new: int, device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                         min_new_tokens=new, do_sample=False, eos_token_id=None,
                         pad_token_id=0)
    if device.type == "cuda":
        torch.cuda.synchronize()
    assert out.shape == (ids.shape[0], ids.shape[1] + new), out.shape
    return time.perf_counter() - t0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--batches", default="1,16,64")
    p.add_argument("--prompt", type=int, default=512)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--runs", type=int, default=2, help="timed runs, the best is kept")
    p.add_argument("--tiny", action="store_true")
    a = p.parse_args()
    device = torch.device("cpu" if a.tiny else "cuda")
    torch.manual_seed(0)
    cfg = config(a.tiny)
    with torch.device(device):
        model = Qwen3ForCausalLM(cfg).to(torch.bfloat16).eval()
    for prm in model.parameters():
        torch.nn.init.normal_(prm, std=0.02) if prm.dim() > 1 else torch.nn.init.ones_(prm)
    print(f"hf_generate: torch {torch.__version__}, {device}, "
          f"{sum(p.numel() for p in model.parameters()) / 1e9:.2f} B parameters",
          file=sys.stderr)
    results = {}
    with torch.inference_mode():
        for batch in [int(b) for b in a.batches.split(",")]:
            ids = torch.randint(0, cfg.vocab_size, (batch, a.prompt), device=device)
            timed(model, ids, 4, device)  # warm-up
            full = min(timed(model, ids, a.new, device) for _ in range(a.runs))
            prefill = min(timed(model, ids, 1, device) for _ in range(a.runs))
            decode = max(full - prefill, 1e-9)
            tok_s = batch * (a.new - 1) / decode
            results[f"generate.8b.b{batch}"] = tok_s
            print(f"  batch {batch}: {tok_s:.1f} tok/s decode ({decode:.3f} s), "
                  f"prefill {prefill:.3f} s", file=sys.stderr)
    with open(a.out, "w") as f:
        json.dump(results, f, indent=1)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
