#!/usr/bin/env bash
# Issue 24's GPU check: a papers100M-sized R-MAT (111M vertices, 1.6B edges drawn,
# 128 columns, 172 classes, 1.2M training vertices) trained on one GPU, SAGE 3×256
# [15,10,5] batch 1024; predictions in docs/performance.md ("Scale (issue 24)").
# Each part is one device command of at most 10 minutes.
#
# Here: bash bench/gpu/issue10.sh build; then one device `run` per part carrying `.gpu`:
#   bash bench/gpu/issue24.sh full      # fp32 rows, graph in memory      ~7–9 min
#   bash bench/gpu/issue24.sh bf16      # bf16 rows, graph in memory      ~7–9 min
#   bash bench/gpu/issue24.sh half      # half size, default placement    ~4–5 min
#   bash bench/gpu/issue24.sh half-store  # half size through a 36 GB store on local disk ~6 min
# Output: $OUT/issue24-<part>.txt and .json ($OUT defaults to ./gpu-out).
#
# Why in memory: the fp32 arrays are ~70 GB (features 111M × 128 × 4 = 56.9 GB,
# topology 8 × 111M + 4 × ~2.9G stored edges ≈ 12.5 GB), more than the machine's
# 64 GB disk; RAM (128 GB) holds them once (generation peaks at ~1× the arrays;
# the features are registered with CUDA in place, not copied to pinned memory).
# The device (`--fit-device`, printed as "placement:"): the topology goes on it
# (11–12.5 GB) and the feature cache takes what is left minus a 12 GB reserve for the
# batch working set (sampled blocks, gathered rows, activations, twice with
# sample_ahead) and the CUDA context: on an H100 (~79 GB free) ~54 GB ≈ 95% of the
# fp32 rows by degree; on an H200 every row.
set -euo pipefail
cd "$(dirname "$0")/../.."
part="${1:?usage: issue24.sh full|bf16|half|half-store}"
out="${OUT:-gpu-out}"
mkdir -p "$out"
bin=.gpu
export LD_LIBRARY_PATH="/usr/local/cuda-13.0/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

fast=(--set device.sample_ahead=true --set model.precision='"tf32"')
common=(--set device.kind='"cuda"' --set orchestration.cpu_workers=12)

run_scale() {
    local name="$1"
    shift
    {
        echo "== $name $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,memory.free --format=csv,noheader 2>/dev/null || echo 'no nvidia-smi')"
        # The benchmark reports its own peaks (VmHWM per phase, NVML for the device).
        timeout 570 "$bin/tandem" bench scale "$@" --json "$out/issue24-$name.json" 2>&1 || echo "rc=$?"
        df -h /tmp | tail -1
    } 2>&1 | tee "$out/issue24-$name.txt"
}

case "$part" in
full)
    run_scale full --fit-device "${common[@]}" "${fast[@]}" \
        --set orchestration.policy='"gpu-sample-gpu-gather"'
    ;;
bf16)
    run_scale bf16 --fit-device "${common[@]}" "${fast[@]}" \
        --set orchestration.policy='"gpu-sample-gpu-gather"' --set device.feature_dtype='"bf16"'
    ;;
half)
    # The defaults a user gets (policy auto, 4 GiB cache), half size.
    run_scale half --half "${common[@]}"
    ;;
half-store)
    # Through a store on the local disk (memory-mapped, registered in place).
    run_scale half-store --half --store /tmp/issue24-half.tds --fit-device "${common[@]}" \
        "${fast[@]}" --set orchestration.policy='"gpu-sample-gpu-gather"'
    rm -f /tmp/issue24-half.tds
    ;;
*)
    echo "unknown part: $part" >&2
    exit 2
    ;;
esac
