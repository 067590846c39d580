#!/usr/bin/env bash
# Per-kernel time of one benchmark figure, on the device machine (needs ncu, no nsys there):
#   .cudatest/profile-bench.sh <--only filter> <skip launches> <count launches> [out dir]
# Runs the staged `dflash bench` once plainly (wall time) and once under Nsight Compute with
# only gpu__time_duration (one pass, no replay), printing the per-kernel summary, so kernel
# time can be set against wall time: the difference is host gaps, syncs and transfers.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
only=$1; skip=$2; count=$3; out=${4:-.}
"$here/dflash" bench --backend cuda --attention cuda-flash --only "$only" --warmup 1 --runs 2 \
    --out "$out/plain-$only.json"
ncu --clock-control none --metrics gpu__time_duration.sum --launch-skip "$skip" \
    --launch-count "$count" --csv \
    "$here/dflash" bench --backend cuda --attention cuda-flash --only "$only" --warmup 0 --runs 1 \
    --out "$out/ncu-$only.json" > "$out/ncu-$only.csv" 2> "$out/ncu-$only.err" || true
python3 - "$out/ncu-$only.csv" <<'PY'
import csv, sys, collections
rows = list(csv.reader(open(sys.argv[1])))
# ncu's CSV shares stdout with the bench's own table: start at ncu's header row.
start = next((i for i, r in enumerate(rows) if r[:1] == ["ID"]), None)
if start is None:
    sys.exit("ncu wrote no CSV header; see the .err file")
hdr = rows[start]; rows = rows[start:]
ix = {h: i for i, h in enumerate(hdr)}
scale = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0}
tot = collections.defaultdict(lambda: [0, 0.0])
for r in rows[1:]:
    try:
        name = r[ix["Kernel Name"]][:80]
        ms = float(r[ix["Metric Value"]].replace(",", "")) * scale[r[ix["Metric Unit"]]]
    except (KeyError, ValueError):
        continue
    tot[name][0] += 1; tot[name][1] += ms
all_t = sum(v for _, v in tot.values())
for name, (n, v) in sorted(tot.items(), key=lambda kv: -kv[1][1])[:25]:
    print(f"{v:9.3f} ms {100*v/all_t:5.1f}% {n:6d}x  {name}")
print(f"total kernel time {all_t:.3f} ms over {sum(n for n, _ in tot.values())} launches")
PY
