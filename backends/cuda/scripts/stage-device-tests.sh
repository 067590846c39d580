#!/usr/bin/env bash
# Builds the CUDA conformance tests here (no GPU or CUDA toolkit needed) and stages a stripped
# copy in .cudatest/ at the repository root (ignored by git), ready to run on a CUDA machine:
#
#   export LD_LIBRARY_PATH=/usr/local/cuda-13.0/targets/x86_64-linux/lib:/usr/lib/x86_64-linux-gnu
#   .cudatest/cuda_tests --nocapture            # all op families, drafter step, timings
#   DFLASH_CUDA_GEMM=fp32 .cudatest/cuda_tests  # default backend GEMMs in exact f32
#
# (The release profile keeps debug info; stripping keeps the binary ~3 MB instead of ~80.)
set -euo pipefail
cd "$(dirname "$0")/../../.."
grep -qx '/.cudatest/' .git/info/exclude 2>/dev/null || echo '/.cudatest/' >> .git/info/exclude
out=$(cargo test --release -p dflash-backend-cuda --no-run --message-format=json 2>/dev/null \
    | grep '"executable":"[^"]*/cuda-[0-9a-f]*"' | sed 's/.*"executable":"\([^"]*\)".*/\1/' | tail -1)
[ -n "$out" ] || { echo "no test executable found" >&2; exit 1; }
rm -rf .cudatest && mkdir .cudatest
cp "$out" .cudatest/cuda_tests && strip .cudatest/cuda_tests
ls -la .cudatest
