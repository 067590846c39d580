#!/usr/bin/env bash
# Memory traffic and clock of the causal S=8192 fwd+bwd kernels, ours (staged `dflash bench`) and torch SDPA's,
# under Nsight Compute (lab run 32). Usage (device, repo root): lab/cuda/ncu_compare.sh OUT_DIR
set -uo pipefail
out=$1; mkdir -p "$out"
M=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_bytes.sum,sm__cycles_elapsed.avg.per_second,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed
ncu --clock-control none --metrics $M -k regex:attn --csv .cudatest/dflash bench --backend cuda --attention cuda-flash \
    --only causal.s8192.fwd_bwd --warmup 0 --runs 1 --out "$out/x.json" > "$out/ncu-ours.csv" 2> "$out/ncu-ours.err"
cat > "$out/sdpa1.py" <<'PY'
import torch, torch.nn.functional as F
q = torch.randn(1, 32, 8192, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
k = torch.randn_like(q, requires_grad=True); v = torch.randn_like(q, requires_grad=True); do = torch.randn_like(q)
for _ in range(2):
    F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(do)
torch.cuda.synchronize()
PY
ncu --clock-control none --metrics $M --csv python3 "$out/sdpa1.py" > "$out/ncu-sdpa.csv" 2> "$out/ncu-sdpa.err"
python3 - "$out/ncu-ours.csv" "$out/ncu-sdpa.csv" <<'PY'
import csv, sys, collections
for f in sys.argv[1:]:
    rows = list(csv.reader(open(f)))
    st = next((i for i, r in enumerate(rows) if r[:1] == ["ID"]), None)
    if st is None:
        print(f, "no CSV"); continue
    hdr = rows[st]; ix = {h: i for i, h in enumerate(hdr)}
    per = collections.OrderedDict()
    for r in rows[st + 1:]:
        try:
            key = (r[ix["ID"]], r[ix["Kernel Name"]][:70])
            per.setdefault(key, {})[r[ix["Metric Name"]]] = (r[ix["Metric Value"]], r[ix["Metric Unit"]])
        except (KeyError, IndexError):
            pass
    print("==", f)
    for (i, name), m in per.items():
        print(f"{i:>4} {name:70s} " + " | ".join(f"{k.split('__')[1][:22]} {v[0]} {v[1]}" for k, v in m.items()))
PY
