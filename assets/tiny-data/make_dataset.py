#!/usr/bin/env python3
"""Build the embedded default drafter dataset from the tiny target (assets/tiny-target).

Prompts are random 96..160-byte windows that start at a line start, cut from the stdlib files
that the tiny target was NOT trained on (its held-out files; see train_tiny_target.py). Each
prompt is continued greedily (argmax, no sampling, no EOS stop) by the tiny target for 160 new
tokens, in float32 with TF32 off. A sample is prompt bytes + completion tokens (no BOS);
loss_mask is 0 on the prompt and 1 on the completion.

The held-out files are split again by file (sha256("dflash-eval:" + relpath) % 5 == 0 -> eval),
so train and eval prompts come from disjoint files.

Output: two directories in the on-disk format of HF `datasets` `Dataset.save_to_disk`
(Arrow IPC *stream* file `data-00000-of-00001.arrow` + `dataset_info.json` + `state.json`):
    train/  2400 rows, input_ids list<int32>, loss_mask list<int8>
    eval/     64 rows, input_ids list<int64>, loss_mask list<int64>

Usage: python3 assets/tiny-data/make_dataset.py [--target-dir DIR] [--out-dir DIR]
(`--fake-generate` replaces the model by a dummy continuation, to test this script without torch.)
"""
import argparse
import hashlib
import importlib.util
import json
import os
import sys
import time

import numpy as np
import pyarrow as pa

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET_DIR = os.path.join(os.path.dirname(HERE), "tiny-target")


def load_trainer_module():
    path = os.path.join(TARGET_DIR, "train_tiny_target.py")
    spec = importlib.util.spec_from_file_location("train_tiny_target", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def is_eval_file(rel):
    return int(hashlib.sha256(("dflash-eval:" + rel).encode("utf-8")).hexdigest(), 16) % 5 == 0


def sample_prompts(files, n, rng, min_len, max_len):
    """n distinct prompts (file, start, bytes) from line starts of `files` [(rel, bytes)]."""
    cands = []
    for fi, (_, data) in enumerate(files):
        arr = np.frombuffer(data, dtype=np.uint8)
        starts = np.concatenate([[0], np.nonzero(arr == 10)[0] + 1])
        starts = starts[starts + min_len <= len(data)]
        for s in starts.tolist():
            cands.append((fi, s))
    order = rng.permutation(len(cands))
    out = []
    for k in order.tolist():
        fi, s = cands[k]
        data = files[fi][1]
        L = int(rng.integers(min_len, max_len + 1))
        if s + L > len(data):
            continue
        p = data[s:s + L]
        if p[0] in b"\n\r" or len(p.strip()) < min_len // 2:
            continue
        out.append((files[fi][0], s, p))
        if len(out) == n:
            break
    assert len(out) == n, f"only {len(out)} prompts available, {n} wanted"
    return out


def greedy_generate(model, prompts, new_tokens, device, log_every=10):
    """Greedy continuations, batched by prompt length (no padding anywhere)."""
    import torch

    by_len = {}
    for i, p in enumerate(prompts):
        by_len.setdefault(len(p), []).append(i)
    out = [None] * len(prompts)
    t0 = time.time()
    with torch.no_grad():
        for gi, (L, idxs) in enumerate(sorted(by_len.items())):
            ids = torch.tensor(np.stack([np.frombuffer(prompts[i], dtype=np.uint8) for i in idxs]).astype(np.int64),
                               device=device)
            for _ in range(new_tokens):
                logits = model(input_ids=ids, use_cache=False).logits[:, -1, :]
                nxt = logits.float().argmax(dim=-1, keepdim=True)
                ids = torch.cat([ids, nxt], dim=1)
            comp = ids[:, L:].cpu().numpy()
            for j, i in enumerate(idxs):
                out[i] = comp[j]
            if gi % log_every == 0:
                print(f"  generated length group {gi+1}/{len(by_len)} (L={L}, {len(idxs)} prompts), "
                      f"{time.time()-t0:.0f}s")
    return out


def teacher_forced_agreement(model, seqs, prompt_lens, device):
    """Fraction of completion tokens equal to the argmax of one full-sequence forward."""
    import torch

    by_len = {}
    for i, L in enumerate(prompt_lens):
        by_len.setdefault(len(seqs[i]), []).append(i)
    agree = total = 0
    worst = []
    with torch.no_grad():
        for T, idxs in by_len.items():
            ids = torch.tensor(np.stack([seqs[i] for i in idxs]), device=device)
            am = model(input_ids=ids, use_cache=False).logits.float().argmax(-1).cpu().numpy()
            for j, i in enumerate(idxs):
                L = prompt_lens[i]
                pred = am[j, L - 1:T - 1]
                tgt = seqs[i][L:]
                a = int((pred == tgt).sum())
                agree += a
                total += len(tgt)
                if a < len(tgt):
                    worst.append((i, len(tgt) - a))
    return agree, total, worst


def fake_generate(prompts, new_tokens):
    # local test stand-in: repeat the prompt's bytes
    return [np.frombuffer((p * (new_tokens // len(p) + 1))[:new_tokens], dtype=np.uint8).astype(np.int64)
            for p in prompts]


def write_hf_dataset(out_dir, columns, writer_batch_size=1000):
    """columns: list of (name, list[np.ndarray], pyarrow value type, HF dtype string).

    Writes what `datasets.Dataset.save_to_disk` writes for one shard."""
    os.makedirs(out_dir, exist_ok=True)
    n = len(columns[0][1])
    assert all(len(c[1]) == n for c in columns)
    features = {name: {"feature": {"dtype": hf, "_type": "Value"}, "_type": "Sequence"}
                for name, _, _, hf in columns}
    schema = pa.schema([pa.field(name, pa.list_(t)) for name, _, t, _ in columns],
                       metadata={"huggingface": json.dumps({"info": {"features": features}})})
    fname = "data-00000-of-00001.arrow"
    path = os.path.join(out_dir, fname)
    with pa.OSFile(path, "wb") as sink:
        with pa.ipc.new_stream(sink, schema) as w:
            for s in range(0, n, writer_batch_size):
                arrays = [pa.array([a.tolist() for a in vals[s:s + writer_batch_size]], type=pa.list_(t))
                          for _, vals, t, _ in columns]
                w.write_batch(pa.RecordBatch.from_arrays(arrays, schema=schema))
    with open(path, "rb") as f:
        fp = hashlib.sha256(f.read()).hexdigest()[:16]
    info = {"citation": "", "description": "", "features": features, "homepage": "", "license": ""}
    with open(os.path.join(out_dir, "dataset_info.json"), "w") as f:
        json.dump(info, f, indent=2)
    state = {
        "_data_files": [{"filename": fname}],
        "_fingerprint": fp,
        "_format_columns": None,
        "_format_kwargs": {},
        "_format_type": None,
        "_output_all_columns": False,
        "_split": None,
    }
    with open(os.path.join(out_dir, "state.json"), "w") as f:
        json.dump(state, f, indent=2, sort_keys=True)
    return path


def show(tok):
    out, buf = [], bytearray()
    for t in map(int, tok):
        if t < 256:
            buf.append(t)
        else:
            out.append(buf.decode("utf-8", "replace"))
            buf = bytearray()
            out.append({256: "<MASK>", 257: "<EOS>"}.get(t, f"<{t}>"))
    out.append(buf.decode("utf-8", "replace"))
    return "".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target-dir", default=TARGET_DIR)
    ap.add_argument("--out-dir", default=HERE)
    ap.add_argument("--n-train", type=int, default=2400)
    ap.add_argument("--n-eval", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=160)
    ap.add_argument("--min-prompt", type=int, default=96)
    ap.add_argument("--max-prompt", type=int, default=160)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stdlib", default=None)
    ap.add_argument("--fake-generate", action="store_true", help="no model (local test of this script)")
    args = ap.parse_args()
    t0 = time.time()

    tt = load_trainer_module()
    root, _, held = tt.split_corpus(args.stdlib)
    listed = os.path.join(args.target_dir, "heldout_files.txt")
    if os.path.exists(listed):
        with open(listed) as f:
            want = [l.strip() for l in f if l.strip() and not l.startswith("#")]
        if want != [r for r, _ in held]:
            print("WARNING: held-out file list differs from the one the target was trained with")
    ev_files = [(r, d) for r, d in held if is_eval_file(r)]
    tr_files = [(r, d) for r, d in held if not is_eval_file(r)]
    print(f"stdlib {root}: held-out files: {len(tr_files)} for train prompts "
          f"({sum(len(d) for _, d in tr_files)} bytes), {len(ev_files)} for eval prompts "
          f"({sum(len(d) for _, d in ev_files)} bytes)")
    assert len(ev_files) >= 3 and len(tr_files) >= 3

    rng = np.random.default_rng(args.seed)
    tr_prompts = sample_prompts(tr_files, args.n_train, rng, args.min_prompt, args.max_prompt)
    ev_prompts = sample_prompts(ev_files, args.n_eval, rng, args.min_prompt, args.max_prompt)
    all_prompts = [p for _, _, p in tr_prompts] + [p for _, _, p in ev_prompts]

    model = device = None
    if args.fake_generate:
        comps = fake_generate(all_prompts, args.new_tokens)
    else:
        import torch
        from transformers import Qwen3ForCausalLM

        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.set_float32_matmul_precision("highest")
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        try:
            model = Qwen3ForCausalLM.from_pretrained(args.target_dir, dtype=torch.float32, attn_implementation="eager")
        except TypeError:
            model = Qwen3ForCausalLM.from_pretrained(args.target_dir, torch_dtype=torch.float32,
                                                     attn_implementation="eager")
        model = model.float().to(device).eval()
        print(f"loaded target ({sum(p.numel() for p in model.parameters())} params) on {device}, "
              f"attn {model.config._attn_implementation}")
        comps = greedy_generate(model, all_prompts, args.new_tokens, device)
        print(f"generation done in {time.time()-t0:.0f}s")

    seqs, masks, plens = [], [], []
    for p, c in zip(all_prompts, comps):
        c = np.asarray(c, dtype=np.int64)
        assert c.shape == (args.new_tokens,)
        assert not (c == tt.MASK_ID).any(), "MASK token generated"
        ids = np.concatenate([np.frombuffer(p, dtype=np.uint8).astype(np.int64), c])
        m = np.concatenate([np.zeros(len(p), np.int64), np.ones(len(c), np.int64)])
        seqs.append(ids)
        masks.append(m)
        plens.append(len(p))
    n_eos = sum(int((s == tt.EOS_ID).sum()) for s in seqs)
    print(f"{len(seqs)} samples, lengths {min(map(len, seqs))}..{max(map(len, seqs))}, "
          f"{n_eos} EOS tokens in completions, max token id {max(int(s.max()) for s in seqs)}")

    if model is not None:
        a, t, worst = teacher_forced_agreement(model, seqs, plens, device)
        print(f"teacher-forced argmax agreement with generated tokens: {a}/{t} ({a/t:.6f}); "
              f"{len(worst)} samples with a mismatch {worst[:10]}")

    ntr = args.n_train
    tr_path = write_hf_dataset(os.path.join(args.out_dir, "train"), [
        ("input_ids", [s.astype(np.int32) for s in seqs[:ntr]], pa.int32(), "int32"),
        ("loss_mask", [m.astype(np.int8) for m in masks[:ntr]], pa.int8(), "int8"),
    ])
    ev_path = write_hf_dataset(os.path.join(args.out_dir, "eval"), [
        ("input_ids", seqs[ntr:], pa.int64(), "int64"),
        ("loss_mask", masks[ntr:], pa.int64(), "int64"),
    ])
    with open(os.path.join(args.out_dir, "prompts.tsv"), "w") as f:
        f.write("split\tindex\tfile\tbyte_offset\tprompt_len\n")
        for i, (r, s, p) in enumerate(tr_prompts):
            f.write(f"train\t{i}\t{r}\t{s}\t{len(p)}\n")
        for i, (r, s, p) in enumerate(ev_prompts):
            f.write(f"eval\t{i}\t{r}\t{s}\t{len(p)}\n")

    # read back
    for path, n in ((tr_path, ntr), (ev_path, args.n_eval)):
        with pa.OSFile(path, "rb") as src:
            tbl = pa.ipc.open_stream(src).read_all()
        assert tbl.num_rows == n, (tbl.num_rows, n)
        print(f"{path}: {os.path.getsize(path)} bytes, {tbl.num_rows} rows, schema {tbl.schema.types}")

    for i in (0, 1, ntr):
        L = plens[i]
        print(f"---- sample {i} ({'train' if i < ntr else 'eval'}), prompt {L} bytes "
              f"from {(tr_prompts + ev_prompts)[i][0]}")
        print("PROMPT:     " + repr(show(seqs[i][:L])))
        print("COMPLETION: " + repr(show(seqs[i][L:])))
    print(f"total {time.time()-t0:.0f}s")


if __name__ == "__main__":
    main()
