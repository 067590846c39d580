#!/usr/bin/env bash
# Every GPU check of the project, on the device machine, from the repository root, with the
# `.carry/` that bench/device/stage.sh made:
#
#   bash bench/device/validate.sh OUT PHASE...
#
# Phases (each fits one device call of <= 10 minutes; name several to run them in order):
#   cuda-tests   every CUDA conformance executable, the CUDA plugin's too    -> OUT/cuda-tests.log
#   wgpu-tests   every wgpu executable on the GPU through Vulkan           -> OUT/wgpu-tests.log
#   components   gemm, the loss, attention, target forward, drafter steps (CUDA) -> OUT/components.json
#   job          e2e.8b.1gpu, e2e.small.1gpu, load.8b (CUDA)               -> OUT/job.json
#   generate     HF generate, then generate.8b.b* against it (CUDA)        -> OUT/generate.json
#   wgpu-bench   gemm, attention ctx4096, drafter step b1 on wgpu (shipped: the tensor-core
#                attention forward where the adapter has it; then the f32 forward,
#                DFLASH_WGPU_ATTN_COOP=0) and CUDA     -> OUT/{wgpu,wgpu-f32,cuda}-bench.json
#   wgpu-knobs   wgpu gemm + attention ctx4096 under each measurement switch and each GEMM
#                kernel behind DFLASH_WGPU_GEMM (matmul, matmul128_db, _w, _n, matmul_coop)
#                                                                          -> OUT/wgpu-knobs.log
#   wgpu-qreg    attention ctx4096 + drafter step: the shipped subgroup variants against each
#                turned off (DFLASH_WGPU_ATTN_WIDE=0, DQ_SG=0 + DKDV_SG=0, all four =0); drafter
#                step with DFLASH_WGPU_F16=0                               -> OUT/wgpu-qreg.log
#   wgpu-coop    gemm + drafter step b1 with the tensor-core GEMM (DFLASH_WGPU_GEMM=matmul_coop)
#                against the shipped one, alternated twice                  -> OUT/wgpu-coop.log
#   wgpu-order   attention ctx4096 alone, then after the GEMM bench in the same process, and
#                the drafter step, each with the buffer pool and without (DFLASH_WGPU_POOL=0),
#                alternated twice (its forward+backward ran 1.6x slower after the GEMMs)
#                                                                          -> OUT/wgpu-order.log
#   wgpu-coop-attn  the tensor-core attention forward (DFLASH_WGPU_ATTN_COOP=1, f16 products):
#                its conformance test, then attention ctx4096 and the drafter step alternated
#                with the f32 forward (=0), then profiled              -> OUT/wgpu-coop-attn.log
#   wgpu-latency the fixed cost of one op call timed alone (record, submit, wait): attention at
#                smoke scale (kernels of microseconds) on wgpu and CUDA, alternated twice,
#                then ctx4096 profiled (its kernel's own time)           -> OUT/wgpu-latency.log
#   wgpu-stats   what NVIDIA's compiler made of the wgpu GEMM and attention pipelines, and of
#                each GEMM variant (DFLASH_WGPU_PIPELINE_STATS: registers, spills, ...)
#                                                                          -> OUT/wgpu-stats.log, .tar.gz
#   ab           the staged binary against .ab/dflash-base (stage.sh --ab-base REV), alternated
#                twice, on AB_ARGS (default: wgpu gemm, attention ctx4096, drafter step)
#                                                                          -> OUT/ab.log
#   gemm-twin    the wgpu GEMM's algorithm in CUDA C (lab/wgpu/gemm_twin.py) -> OUT/gemm-twin.log
#   wgpu-train   the embedded default trained through wgpu (~2 min)        -> OUT/wgpu-train.log
#   wgpu-coop-train  the same with the tensor-core GEMM (DFLASH_WGPU_GEMM=matmul_coop, f16
#                operands): its tau against wgpu-train's                   -> OUT/wgpu-coop-train.log
#   wgpu-train-d128  the embedded default with a head_dim 128 drafter (--set drafter.head_dim=128)
#                trained through wgpu as shipped (the tensor-core attention forward where the
#                adapter has it; the start line says which forward ran) and with the f32
#                forward (DFLASH_WGPU_ATTN_COOP=0): losses and tau side by side
#                                                                          -> OUT/wgpu-train-d128.log
#   plan         dflash plan of the embedded default on CUDA               -> OUT/plan.json
#   multi-gpu    e2e.8b on 1 GPU, 2 GPUs split, 2 GPUs data-parallel (NCCL) -> OUT/multi.json
#                (needs a machine with 2+ GPUs; the NCCL tests are in cuda-tests)
# The device returns at most 8 files from OUT: name few phases per call.
# Prints a short table of each phase last; exits non-zero if any phase failed.
set -uo pipefail
out=${1:?usage: validate.sh OUT PHASE...}
shift
mkdir -p "$out"
for f in .carry/*.deb; do [ -e "$f" ] && dpkg -x "$f" /; done
ldconfig 2>/dev/null || true
for t in .carry/*.tar.xz; do [ -e "$t" ] && tar -xJf "$t"; done
# The test executables find their fixtures through the path they were built in.
mkdir -p /work && { [ -e /work/main ] || ln -s "$PWD" /work/main; }
export LD_LIBRARY_PATH=/usr/local/cuda-13.0/targets/x86_64-linux/lib:/usr/lib/x86_64-linux-gnu
export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-/tmp}
[ -f /usr/share/vulkan/icd.d/nvidia_icd.json ] && export VK_DRIVER_FILES=/usr/share/vulkan/icd.d/nvidia_icd.json
D=.cudatest/dflash
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader || true

failed=()
table() { cut -c1-140 "$1" | grep -E "^[a-z0-9]+\.[a-z0-9.]+ " || true; }
for phase in "$@"; do
    echo "== $phase"
    # The tensor-core attention forward ships where the adapter has it. The phases that
    # measure the f32 forward's variants, switches and pipelines pin the f32 forward; the
    # others run as shipped or set the switch themselves.
    unset DFLASH_WGPU_ATTN_COOP
    case $phase in
    wgpu-knobs|wgpu-qreg|wgpu-order|wgpu-latency|wgpu-stats) export DFLASH_WGPU_ATTN_COOP=0 ;;
    esac
    case $phase in
    cuda-tests)
        if [ ! -x .cudatest/run_all.sh ]; then
            echo "no CUDA tests staged (stage.sh --no-cuda-tests)"; failed+=("$phase"); continue
        fi
        .cudatest/run_all.sh > "$out/cuda-tests.log" 2>&1 || failed+=("$phase")
        if [ -x .cudatest/plugin/run_all.sh ]; then
            .cudatest/plugin/run_all.sh >> "$out/cuda-tests.log" 2>&1 || failed+=("$phase (plugin)")
        fi
        grep -E "^test result|FAILED|panicked" "$out/cuda-tests.log" | sort | uniq -c ;;
    wgpu-tests)
        .wgputest/run_all.sh > "$out/wgpu-tests.log" 2>&1 || failed+=("$phase")
        grep -E "^test result|FAILED|panicked|skipped" "$out/wgpu-tests.log" | cut -c1-160 | sort | uniq -c ;;
    components)
        $D bench --backend cuda --attention cuda-flash --only gemm,loss,attention,target,drafter \
            --out "$out/components.json" > "$out/components.log" 2>&1 || failed+=("$phase")
        table "$out/components.log" ;;
    job)
        $D bench --backend cuda --attention cuda-flash --warmup 1 --runs 1 --only e2e,load \
            --out "$out/job.json" > "$out/job.log" 2>&1 || failed+=("$phase")
        table "$out/job.log" ;;
    generate)
        python3 bench/hf_generate.py --out "$out/hf.json" > "$out/hf.log" 2>&1 || failed+=("$phase (HF)")
        base=(); [ -s "$out/hf.json" ] && base=(--baselines "$out/hf.json")
        $D bench --backend cuda --only generate "${base[@]}" --out "$out/generate.json" \
            > "$out/generate.log" 2>&1 || failed+=("$phase")
        table "$out/generate.log" ;;
    wgpu-bench)
        # wgpu: as shipped (the switch unset above); wgpu-f32: the f32 attention forward.
        for be in "wgpu wgpu wgpu-tiled" "wgpu-f32 wgpu wgpu-tiled 0" "cuda cuda cuda-flash"; do
            read -r tag name kernel coop <<< "$be"
            # Word-split on purpose: the switch unset for the shipped runs.
            # shellcheck disable=SC2086
            env ${coop:+DFLASH_WGPU_ATTN_COOP=$coop} \
                timeout 420 $D bench --backend "$name" --attention "$kernel" \
                --only gemm,attention.dflash.ctx4096,drafter.step.b1.throughput \
                --out "$out/$tag-bench.json" > "$out/$tag-bench.log" 2>&1 || failed+=("$phase ($tag)")
            echo "-- $tag"; table "$out/$tag-bench.log"
        done ;;
    wgpu-knobs)
        for knobs in "" "DFLASH_WGPU_CHECKS=all" "DFLASH_WGPU_CHECKS=none" \
                "DFLASH_WGPU_ROBUSTNESS=off" "DFLASH_WGPU_CHECKS=none DFLASH_WGPU_ROBUSTNESS=off" \
                "DFLASH_WGPU_GEMM=matmul" "DFLASH_WGPU_GEMM=matmul128_db" \
                "DFLASH_WGPU_GEMM=matmul128_w" "DFLASH_WGPU_GEMM=matmul128_n" \
                "DFLASH_WGPU_GEMM=matmul_coop"; do
            echo "-- knobs: ${knobs:-none}" >> "$out/wgpu-knobs.log"
            env $knobs $D bench --backend wgpu --attention wgpu-tiled \
                --only gemm,attention.dflash.ctx4096 --out /tmp/knobs.json \
                >> "$out/wgpu-knobs.log" 2>&1 || failed+=("$phase ($knobs)")
        done
        grep -E "^-- knobs|^(gemm|attention)\." "$out/wgpu-knobs.log" | cut -c1-140 ;;
    wgpu-qreg)
        # The shipped subgroup variants (query registers and two keys a lane in the forward,
        # dq and dk/dv on subgroups) against each turned off, one binary, alternated twice (the
        # attention forward, forward + backward, and the drafter step that runs them).
        off="DFLASH_WGPU_ATTN_QREG=0 DFLASH_WGPU_ATTN_WIDE=0 DFLASH_WGPU_ATTN_DQ_SG=0 DFLASH_WGPU_ATTN_DKDV_SG=0"
        for round in 1 2; do
            for knob in SHIPPED=1 DFLASH_WGPU_ATTN_WIDE=0 \
                    "DFLASH_WGPU_ATTN_DQ_SG=0 DFLASH_WGPU_ATTN_DKDV_SG=0" "$off"; do
                echo "-- $knob (round $round)" >> "$out/wgpu-qreg.log"
                # Word-split on purpose: a knob may set two variables.
                # shellcheck disable=SC2086
                env $knob $D bench --backend wgpu --attention wgpu-tiled \
                    --only attention.dflash.ctx4096,drafter.step.b1.throughput \
                    --out "/tmp/qreg-$round.json" >> "$out/wgpu-qreg.log" 2>&1 \
                    || failed+=("$phase ($knob)")
            done
        done
        # And the f32 compute format (frozen weights in f32: the LM head's GEMM on the f32
        # path, which ran ~25% faster than the f16-operand one).
        echo "-- DFLASH_WGPU_F16=0" >> "$out/wgpu-qreg.log"
        DFLASH_WGPU_F16=0 $D bench --backend wgpu --attention wgpu-tiled \
            --only gemm.compute.8192,drafter.step.b1.throughput --out /tmp/f32.json \
            >> "$out/wgpu-qreg.log" 2>&1 || failed+=("$phase (f32)")
        grep -E "^-- |^(attention|drafter|gemm)\." "$out/wgpu-qreg.log" | cut -c1-140 ;;
    wgpu-coop)
        # The tensor-core GEMM (opt-in: operands rounded to f16) against the shipped one, on
        # the GEMM bench and the drafter step it would speed up, alternated twice; an adapter
        # that cannot run it says what it lacks in the log.
        for round in 1 2; do
            for g in matmul128 matmul_coop; do
                echo "-- DFLASH_WGPU_GEMM=$g (round $round)" >> "$out/wgpu-coop.log"
                DFLASH_WGPU_GEMM=$g $D bench --backend wgpu --attention wgpu-tiled \
                    --only gemm,drafter.step.b1.throughput --out "/tmp/coop-$round.json" \
                    >> "$out/wgpu-coop.log" 2>&1 || failed+=("$phase ($g)")
            done
        done
        grep -E "^-- |^(gemm|drafter)\.|cooperative|lacks" "$out/wgpu-coop.log" | cut -c1-200 ;;
    wgpu-order)
        # Each order with the buffer pool (the default) and without it (DFLASH_WGPU_POOL=0:
        # every tensor a new wgpu buffer, as before the pool), and the drafter step both ways.
        for round in 1 2; do
            for pool in 1 0; do
                for only in attention.dflash.ctx4096 gemm.f32.8192,attention.dflash.ctx4096; do
                    echo "-- $only (round $round, pool $pool)" >> "$out/wgpu-order.log"
                    DFLASH_WGPU_POOL=$pool $D bench --backend wgpu --attention wgpu-tiled \
                        --only "$only" --out /tmp/order.json >> "$out/wgpu-order.log" 2>&1 \
                        || failed+=("$phase")
                done
            done
        done
        for pool in 1 0; do
            echo "-- drafter.step.b1.throughput (pool $pool)" >> "$out/wgpu-order.log"
            DFLASH_WGPU_POOL=$pool $D bench --backend wgpu --attention wgpu-tiled \
                --only drafter.step.b1.throughput --out /tmp/order.json \
                >> "$out/wgpu-order.log" 2>&1 || failed+=("$phase")
        done
        # Device time per kernel in each order (DFLASH_WGPU_PROFILE): the same kernel times
        # with a slower wall time put the loss on the host side, slower kernels on the device.
        for only in attention.dflash.ctx4096 gemm.f32.8192,attention.dflash.ctx4096; do
            echo "-- profiled: $only" >> "$out/wgpu-order.log"
            DFLASH_WGPU_PROFILE=1 $D bench --backend wgpu --attention wgpu-tiled --only "$only" \
                --out /tmp/order.json >> "$out/wgpu-order.log" 2>&1 || failed+=("$phase")
        done
        grep -E "^-- |^(attention|gemm|drafter)\.|attn_|wgpu profile" "$out/wgpu-order.log" | cut -c1-140 ;;
    wgpu-coop-attn)
        log="$out/wgpu-coop-attn.log"
        # The driver's cooperative matrices on each pattern the forward uses (strides, a
        # workgroup variable before the tiles, an accumulator zeroed in a loop), printed.
        (cd .wgputest && ./coop_probe --nocapture --test-threads 1) > "$log" 2>&1 \
            || failed+=("$phase (probe)")
        (cd .wgputest && ./attention --nocapture --test-threads 1 coop) >> "$log" 2>&1 \
            || failed+=("$phase (test)")
        for round in 1 2; do
            for c in 0 1; do
                echo "-- DFLASH_WGPU_ATTN_COOP=$c (round $round)" >> "$log"
                DFLASH_WGPU_ATTN_COOP=$c $D bench --backend wgpu --attention wgpu-tiled \
                    --only attention.dflash.ctx4096,drafter.step.b1.throughput \
                    --out /tmp/coop-attn.json >> "$log" 2>&1 || failed+=("$phase ($c)")
            done
        done
        echo "-- DFLASH_WGPU_ATTN_COOP=1, profiled" >> "$log"
        DFLASH_WGPU_ATTN_COOP=1 DFLASH_WGPU_PROFILE=1 $D bench --backend wgpu \
            --attention wgpu-tiled --only attention.dflash.ctx4096.fwd \
            --out /tmp/coop-attn.json >> "$log" 2>&1 || failed+=("$phase (profile)")
        grep -E "^-- |^attention\.|^drafter\.|wgpu profile|^  attn|test result|panicked|FAILED|skipped|failed|worst" \
            "$log" | cut -c1-160 | head -60 ;;
    wgpu-latency)
        for round in 1 2; do
            # cuda-simple: the smoke shapes' head dim 16 is below cuda-flash's.
            for be in "wgpu wgpu-tiled" "cuda cuda-simple"; do
                read -r name kernel <<< "$be"
                echo "-- $name, smoke scale (round $round)" >> "$out/wgpu-latency.log"
                $D bench --backend "$name" --attention "$kernel" --scale smoke \
                    --only attention.dflash.ctx4096.fwd --runs 21 --out /tmp/latency.json \
                    >> "$out/wgpu-latency.log" 2>&1 || failed+=("$phase")
            done
        done
        echo "-- wgpu ctx4096, profiled" >> "$out/wgpu-latency.log"
        DFLASH_WGPU_PROFILE=1 $D bench --backend wgpu --attention wgpu-tiled \
            --only attention.dflash.ctx4096.fwd --runs 11 --out /tmp/latency.json \
            >> "$out/wgpu-latency.log" 2>&1 || failed+=("$phase")
        grep -E "^-- |^attention\.|wgpu profile|^ " "$out/wgpu-latency.log" | cut -c1-140 | head -60 ;;
    wgpu-stats)
        rm -rf /tmp/pstats
        DFLASH_WGPU_PIPELINE_STATS=/tmp/pstats $D bench --backend wgpu --attention wgpu-tiled \
            --only gemm,attention.dflash.ctx4096,drafter.step.b1.throughput --warmup 0 --runs 1 \
            --out /tmp/pstats.json > "$out/wgpu-stats.log" 2>&1 || failed+=("$phase")
        # Each GEMM kernel compiles only when it runs: one short GEMM run per variant, so
        # the driver's register counts of all of them are read in one call.
        for g in matmul128_db matmul128_w matmul128_n matmul_coop; do
            DFLASH_WGPU_GEMM=$g DFLASH_WGPU_PIPELINE_STATS=/tmp/pstats/$g $D bench --backend wgpu \
                --attention wgpu-tiled --only gemm.f32.8192 --warmup 0 --runs 1 \
                --out /tmp/pstats-$g.json >> "$out/wgpu-stats.log" 2>&1 || failed+=("$phase ($g)")
        done
        tar -czf "$out/wgpu-stats.tar.gz" -C /tmp pstats 2>/dev/null || true
        grep -E "pipeline stats" "$out/wgpu-stats.log" | cut -c1-200 | sort -u | head -60 ;;
    ab)
        if [ ! -x .ab/dflash-base ]; then
            echo "no base binary staged (stage.sh --ab-base REV)"; failed+=("$phase"); continue
        fi
        # Word-split on purpose: AB_ARGS is a list of bench arguments.
        # shellcheck disable=SC2206
        args=(${AB_ARGS:---backend wgpu --attention wgpu-tiled --only gemm,attention.dflash.ctx4096,drafter.step.b1.throughput})
        echo "-- base is $(cat .ab/base-rev 2>/dev/null || echo '?'); args: ${args[*]}" >> "$out/ab.log"
        for round in 1 2; do
            for bin in .ab/dflash-base "$D"; do
                echo "-- $bin (round $round)" >> "$out/ab.log"
                timeout 280 "$bin" bench "${args[@]}" --out "/tmp/ab-$round.json" \
                    >> "$out/ab.log" 2>&1 || failed+=("$phase ($bin)")
            done
        done
        grep -E "^-- |^[a-z0-9]+\.[a-z0-9.]+ " "$out/ab.log" | cut -c1-140 ;;
    gemm-twin)
        python3 lab/wgpu/gemm_twin.py > "$out/gemm-twin.log" 2>&1 || failed+=("$phase")
        cat "$out/gemm-twin.log" | tail -5 ;;
    wgpu-train|wgpu-coop-train)
        gemm=; [ "$phase" = wgpu-coop-train ] && gemm=matmul_coop
        # Word-split on purpose: no GEMM switch at all for wgpu-train.
        # shellcheck disable=SC2086
        env ${gemm:+DFLASH_WGPU_GEMM=$gemm} $D train --config configs/default.toml \
            --set backend.name='"wgpu"' --set backend.attention='"wgpu-tiled"' \
            --set run.dir="\"/tmp/$phase-runs\"" > "$out/$phase.log" 2>&1 || failed+=("$phase")
        grep -E "adapter|tau|^run_dir" "$out/$phase.log" | cut -c1-200 ;;
    wgpu-train-d128)
        log="$out/$phase.log"; : > "$log"
        for run in "shipped" "f32 0"; do
            read -r label coop <<< "$run"
            echo "-- $label: DFLASH_WGPU_ATTN_COOP=${coop:-unset}" >> "$log"
            # shellcheck disable=SC2086
            env ${coop:+DFLASH_WGPU_ATTN_COOP=$coop} \
                $D train --config configs/default.toml \
                --set backend.name='"wgpu"' --set backend.attention='"wgpu-tiled"' \
                --set drafter.head_dim=128 --set run.dir="\"/tmp/$phase-runs-$label\"" \
                >> "$log" 2>&1 || failed+=("$phase ($label)")
        done
        grep -E "^-- |attention forward|step +[0-9]+.*loss|tau|trained" "$log" | cut -c1-160 | tail -40 ;;
    plan)
        $D plan --config configs/default.toml --set backend.name='"cuda"' \
            --set backend.attention='"cuda-flash"' --json "$out/plan.json" \
            > "$out/plan.log" 2>&1 || failed+=("$phase")
        grep -E "tok/s|best" "$out/plan.log" | cut -c1-200 ;;
    multi-gpu)
        $D bench --backend cuda --attention cuda-flash --warmup 1 --runs 1 \
            --only e2e.8b.1gpu,e2e.8b.2gpu,e2e.8b.2gpu.dp \
            --out "$out/multi.json" > "$out/multi.log" 2>&1 || failed+=("$phase")
        table "$out/multi.log"; grep -E "skipped|NCCL|gradients summed" "$out/multi.log" | cut -c1-200 ;;
    *)
        echo "unknown phase $phase" >&2; failed+=("$phase") ;;
    esac
done
[ "${#failed[@]}" -eq 0 ] || { echo "FAILED: ${failed[*]}" >&2; exit 1; }
echo "all phases passed"
