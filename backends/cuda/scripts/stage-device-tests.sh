#!/usr/bin/env bash
# Builds every CUDA test executable of dflash-backend-cuda here (no GPU or CUDA toolkit needed:
# the unit tests and one integration test per op family, tests/*.rs) and stages stripped copies
# in .cudatest/ at the repository root (ignored by git), with .cudatest/run_all.sh, which runs
# each of them in turn, ready to run on a CUDA machine:
#
#   export LD_LIBRARY_PATH=/usr/local/cuda-13.0/targets/x86_64-linux/lib:/usr/lib/x86_64-linux-gnu
#   .cudatest/run_all.sh                        # all op families, drafter step, timings
#   DFLASH_CUDA_GEMM=fp32 .cudatest/run_all.sh  # default backend GEMMs in exact f32
#   .cudatest/gemm --nocapture                  # one op family (also: run_all.sh <filter>)
#
# Another crate's tests stage the same way into another directory, e.g. the wgpu backend's for
# a Vulkan run on the GPU machine: `stage-device-tests.sh dflash-backend-wgpu .wgputest`.
#
# run_all.sh passes `--nocapture --test-threads 1` (plus its own arguments) to each executable,
# runs all of them even after a failure, and exits non-zero if any failed.
# (The release profile keeps debug info; stripping keeps each binary a few MB instead of ~80.)
set -euo pipefail
pkg=${1:-dflash-backend-cuda}
dir=${2:-.cudatest}
cd "$(dirname "$0")/../../.."
grep -qx "/$dir/" .git/info/exclude 2>/dev/null || echo "/$dir/" >> .git/info/exclude
# Only this crate's test harnesses are executables in the build's artifact messages; each is
# <target name>-<hash> (the unit tests: e.g. dflash_backend_cuda-<hash>).
mapfile -t exes < <(cargo test --release -p "$pkg" --no-run --message-format=json 2>/dev/null \
    | grep '"executable":"' | sed 's/.*"executable":"\([^"]*\)".*/\1/' | sort -u)
[ "${#exes[@]}" -gt 0 ] || { echo "no test executable found" >&2; exit 1; }
rm -rf "$dir" && mkdir "$dir"
names=()
for exe in "${exes[@]}"; do
    name=$(basename "$exe" | sed 's/-[0-9a-f]*$//')
    cp "$exe" "$dir/$name" && strip "$dir/$name"
    names+=("$name")
done
{
    echo '#!/usr/bin/env bash'
    echo '# Runs every staged CUDA test executable (written by stage-device-tests.sh).'
    echo 'cd "$(dirname "$0")"'
    echo 'failed=()'
    echo "for t in ${names[*]}; do"
    echo '    echo "=== $t"'
    echo '    ./"$t" --nocapture --test-threads 1 "$@" || failed+=("$t")'
    echo 'done'
    echo '[ "${#failed[@]}" -eq 0 ] || { echo "FAILED: ${failed[*]}" >&2; exit 1; }'
    echo 'echo "all test executables passed"'
} > "$dir/run_all.sh"
chmod +x "$dir/run_all.sh"
ls -la "$dir"
