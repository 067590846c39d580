#!/usr/bin/env bash
# Stages everything a GPU check needs into .carry/ (ignored by git), here, where Rust is:
# the release `dflash`, every CUDA and wgpu test executable (the CUDA plugin's with its library
# in .cudatest/plugin/), and the Debian Vulkan loader with
# the glvnd libraries (a GPU image with the NVIDIA driver but no loader needs them for wgpu).
# Then, on the GPU machine, from the repository root (carry `.carry`):
#
#   bash bench/device/validate.sh OUT PHASE...     # phases: see validate.sh
#
# The carried tree must stay under the device's limit (64 MiB with the tracked files), so the
# executables travel xz-compressed; the script prints the total and fails if it is over.
#
# `bash bench/device/stage.sh --no-cuda-tests` skips the CUDA test executables (a wgpu-only
# or bench-only call: `validate.sh` phases other than cuda-tests need only `dflash` and the
# wgpu tests), which saves their release build here.
#
# `--ab-base REV` also builds the release `dflash` of revision REV (in a worktree under /tmp)
# as .ab/dflash-base, packed into .carry/ab.tar.xz, for validate.sh's `ab` phase: the tree's
# binary against REV's, alternated, in one call.
set -euo pipefail
cuda_tests=1
ab_base=
while [ $# -gt 0 ]; do
    case "$1" in
        --no-cuda-tests) cuda_tests=0 ;;
        --ab-base) ab_base=${2:?--ab-base needs a revision}; shift ;;
        *) echo "usage: stage.sh [--no-cuda-tests] [--ab-base REV]" >&2; exit 2 ;;
    esac
    shift
done
cd "$(dirname "$0")/../.."
limit=$((64 << 20))
for d in .carry .gl .ab; do
    grep -qx "/$d/" .git/info/exclude 2>/dev/null || echo "/$d/" >> .git/info/exclude
done
cargo build --release -p dflash-cli
if [ "$cuda_tests" = 1 ]; then
    bash backends/cuda/scripts/stage-device-tests.sh dflash-backend-cuda .cudatest
    # The CUDA plugin's device conformance (its tests find the cdylib next to themselves).
    bash backends/cuda/scripts/stage-device-tests.sh dflash-plugin-cuda-attention .cudatest/plugin
    cp "$(ls target/release/deps/libdflash_plugin_cuda_attention.so target/release/libdflash_plugin_cuda_attention.so 2>/dev/null | head -1)" \
        .cudatest/plugin/ && strip .cudatest/plugin/libdflash_plugin_cuda_attention.so
    # Its `gpu` test compares with the C plugin, which it loads from the absolute build path
    # compiled into it (dflash_plugin_c_attention::LIBRARY): carry that file at that path
    # (validate.sh links /work/main to the checkout and unpacks from its root).
    c_plugin=$(grep -aoE '/work/main/target/[[:alnum:]_./-]*libc_attention\.so' .cudatest/plugin/gpu | head -1)
    [ -n "$c_plugin" ] && [ -f "$c_plugin" ] || { echo "the C plugin the gpu test loads was not found" >&2; exit 1; }
else
    rm -rf .cudatest && mkdir .cudatest
fi
bash backends/cuda/scripts/stage-device-tests.sh dflash-backend-wgpu .wgputest
cp target/release/dflash .cudatest/dflash && strip .cudatest/dflash
if ! ls .gl/libvulkan1_*.deb >/dev/null 2>&1; then
    mkdir -p .gl /tmp/amd64/partial
    o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
    # shellcheck disable=SC2086
    apt-get $o update -qq && (cd .gl && apt-get $o download libvulkan1 libegl1 libglvnd0 \
        libopengl0 libgl1 libglx0 libgles2) || echo "warning: no Vulkan loader packages (wgpu phase will find no adapter)"
fi
rm -rf .carry && mkdir .carry
if [ -n "$ab_base" ]; then
    wt=/tmp/dflash-ab-base
    git worktree remove --force "$wt" 2>/dev/null || rm -rf "$wt"
    git worktree add --detach "$wt" "$ab_base"
    # Its own target directory: the worktree's crates live at other paths, so sharing ours
    # would rebuild them anyway and evict this tree's artefacts.
    (cd "$wt" && CARGO_TARGET_DIR=/tmp/dflash-ab-target cargo build --release -p dflash-cli)
    mkdir -p .ab && cp /tmp/dflash-ab-target/release/dflash .ab/dflash-base && strip .ab/dflash-base
    git -C "$wt" rev-parse --short HEAD > .ab/base-rev
    git worktree remove --force "$wt"
    tar -cf - .ab/dflash-base .ab/base-rev | xz -T0 -6 > .carry/ab.tar.xz
fi
cp .gl/*.deb .carry/ 2>/dev/null || true
tar -cf - .cudatest | xz -T0 -6 > .carry/cudatest.tar.xz
if [ -n "${c_plugin:-}" ]; then
    tar -cf - "${c_plugin#/work/main/}" | xz -T0 -6 > .carry/c-plugin.tar.xz
fi
tar -cf - .wgputest | xz -T0 -6 > .carry/wgputest.tar.xz
tracked=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
carried=$(du -cb .carry | tail -1 | cut -f1)
total=$((tracked + carried))
echo "tracked $((tracked >> 20)) MiB + .carry $((carried >> 20)) MiB = $((total >> 20)) MiB (limit 64)"
[ "$total" -lt "$limit" ] || { echo "over the device's 64 MiB: carry less" >&2; exit 1; }
