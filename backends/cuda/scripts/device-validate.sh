#!/usr/bin/env bash
# The whole CUDA check on a GPU machine, in one go (docs/design.md §6): every conformance test
# binary, the §4 benchmark suite, and the embedded default trained end to end on the GPU.
# Stage first, here (no GPU needed):
#   bash backends/cuda/scripts/stage-device-tests.sh
#   cp target/release/dflash .cudatest/ && strip .cudatest/dflash
#   cp backends/cuda/scripts/device-validate.sh .cudatest/
# then, on the GPU machine, from the repository root:
#   .cudatest/device-validate.sh OUT_DIR
# Writes OUT_DIR/{tests.log, <gpu>.json, bench.log, train.log} and prints a summary.
set -uo pipefail
out=${1:?usage: device-validate.sh OUT_DIR}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
export LD_LIBRARY_PATH=/usr/local/cuda-13.0/targets/x86_64-linux/lib:/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader || true

"$here/run_all.sh" > "$out/tests.log" 2>&1
tests_rc=$?
echo "== tests (rc $tests_rc)"
grep -E "^test result|FAILED|panicked" "$out/tests.log" | sort | uniq -c

# The suite ends with the job itself (e2e.8b.1gpu, e2e.small.1gpu) and load.8b, which writes a
# 16 GB random bf16 checkpoint under DFLASH_BENCH_CACHE (default: the temp dir) when absent.
"$here/dflash" bench --backend cuda --attention cuda-flash --scale full --warmup 1 --runs 3 \
    --results-dir "$out" > "$out/bench.log" 2>&1
bench_rc=$?
echo "== bench (rc $bench_rc)"
cut -c1-110 "$out/bench.log"

# The embedded default on the GPU: target and drafter share the device, so features go from
# one backend instance (stream) to the other without a copy. d=32 heads: cuda-simple.
"$here/dflash" train --config configs/default.toml --set backend.name='"cuda"' \
    --set backend.attention='"cuda-simple"' --set run.dir="\"$out/runs\"" > "$out/train.log" 2>&1
train_rc=$?
echo "== train (rc $train_rc)"
tail -2 "$out/train.log"
"$here/dflash" status "$out/runs/default" | tail -4
exit $(( tests_rc != 0 || bench_rc != 0 || train_rc != 0 ))
