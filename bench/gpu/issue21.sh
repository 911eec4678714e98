#!/usr/bin/env bash
# Issue 21's GPU check: the reorganised runtime (session -> placement -> executor
# -> engine) and the models written once (gpu_ops/src/model/) on a real GPU, in
# one command that fits the device tool's 10-minute limit (~5 min on an H100).
#
# Here (x86-64, with the Rust toolchain):
#   bash bench/gpu/issue10.sh build        # release tandem + parity/cuda_backend binaries in .gpu/
# Then one device `run`, carrying `.gpu`:
#   bash bench/gpu/issue21.sh check        # CUDA tests, the default run, products x 4 placements
# (VERTICES=… EDGES=… shrink the graph for a dry run here, where every CUDA
# step reports that there is no CUDA device.)
# It writes $OUT/issue21.txt (or ./gpu-out/issue21.txt when $OUT is unset).
#
# What it checks, against ../shared/gpu-runs/2026-11-26/RESULTS.md (H200; compare
# ratios on another card):
# - parity cuda:: and cuda_backend pass (the generic layers, sparse ops refused
#   on CUDA with Unsupported, the model step against the host backend);
# - `tandem train --device cuda` on the default graph reaches ~0.89 test accuracy;
# - products (100 columns, SAGE 3x256 [25,10,5] b1024): gpu-sample-gpu-gather,
#   the fast configuration (sample_ahead + tf32), the layer executor (hot 0.1)
#   and the default `auto` train 3 epochs each at test accuracy ~0.98; epoch
#   times near 0.22 / 0.16 / ~1.0 / auto's choice (2026-11-26, H200).
set -euo pipefail
cd "$(dirname "$0")/../.."
part="${1:?usage: issue21.sh check}"
out="${OUT:-gpu-out}"
mkdir -p "$out"
bin=.gpu
cuda_lib=/usr/local/cuda-13.0/targets/x86_64-linux/lib
export LD_LIBRARY_PATH="$cuda_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
graph=(--vertices "${VERTICES:-2400000}" --edges "${EDGES:-62000000}" --dim 100 --classes 47 --split 0.08,0.02,0.05 --seed 1)
model=(--set device.kind='"cuda"' --set model.kind='"sage"' --set model.layers=3
       --set model.hidden=256 --set model.dropout=0.5 --set 'train.fanouts=[25,10,5]'
       --set train.batch_size=1024 --set train.lr=0.003 --set train.eval_every=0
       --set orchestration.cpu_workers=12 --set train.epochs=3)

# One products run: its name, then overrides; prints the run's last lines.
products_run() {
    local name="$1"
    shift
    echo "== products: $name"
    "$bin/tandem" train --quiet-config --set 'data.path="/tmp/products.tds"' "${model[@]}" "$@" \
        2>&1 | grep -E "^device|^orchestration|auto|^ +[0-9]+ |^test acc|rror" || true
}

case "$part" in
check)
    {
        echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo 'no nvidia-smi')"
        echo "== parity cuda::"
        "$bin/parity" cuda:: 2>&1 | grep -E "^test result|FAILED|panicked" || true
        echo "== cuda_backend"
        "$bin/cuda_backend" 2>&1 | grep -E "^test result|FAILED|panicked" || true
        echo "== default run on CUDA"
        "$bin/tandem" train --device cuda --quiet-config 2>&1 | grep -E "^device|^test acc|rror" || true
        [ -f /tmp/products.tds ] || "$bin/tandem" generate rmat "${graph[@]}" -o /tmp/products.tds >/dev/null
        products_run gpu-sample-gpu-gather --set orchestration.policy='"gpu-sample-gpu-gather"'
        products_run "fast (sample_ahead + tf32)" --set orchestration.policy='"gpu-sample-gpu-gather"' \
            --set device.sample_ahead=true --set model.precision='"tf32"'
        products_run "layer (hot 0.1)" --set orchestration.policy='"layer"' \
            --set orchestration.hot_ratio=0.1
        products_run "auto (default policy)"
    } 2>&1 | tee "$out/issue21.txt"
    ;;
*)
    echo "unknown part: $part" >&2
    exit 2
    ;;
esac
