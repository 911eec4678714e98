#!/usr/bin/env bash
# Issue 22's GPU check: `policy = "auto"` on the 512-column products graph that made
# it exit on 2026-11-26 ("invalid 'initial split'", ../shared/gpu-runs/2026-11-26/
# RESULTS.md), against the step-based placement it must not lose to; fp32 and bf16
# rows, cache 250 MB (5% of the features). ~4 min on an H200.
#
# Here: bash bench/gpu/issue10.sh build; then one device `run` carrying `.gpu`:
#   bash bench/gpu/issue22.sh check     # $OUT/issue22.txt
#   bash bench/gpu/issue22.sh trace     # $OUT/auto-epoch0.{txt,trace.json.gz}
# ($OUT defaults to ./gpu-out.)
set -euo pipefail
cd "$(dirname "$0")/../.."
part="${1:?usage: issue22.sh check|trace}"
out="${OUT:-gpu-out}"
mkdir -p "$out"
bin=.gpu
export LD_LIBRARY_PATH="/usr/local/cuda-13.0/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
graph=(--vertices "${VERTICES:-2400000}" --edges "${EDGES:-62000000}" --dim 512 --classes 47 --split 0.08,0.02,0.05 --seed 1)
model=(--set device.kind='"cuda"' --set model.kind='"sage"' --set model.layers=3
       --set model.hidden=256 --set model.dropout=0.5 --set 'train.fanouts=[25,10,5]'
       --set train.batch_size=1024 --set train.lr=0.003 --set train.eval_every=0
       --set orchestration.cpu_workers=12 --set train.epochs=2
       --set device.cache_bytes=250000000)
fast=(--set device.sample_ahead=true --set model.precision='"tf32"')
bf16=(--set device.feature_dtype='"bf16"')

wide_run() {
    local name="$1"
    shift
    echo "== 512 columns: $name ($(date -u +%T))"
    timeout 100 "$bin/tandem" train --quiet-config --set 'data.path="/tmp/wide.tds"' "${model[@]}" "$@" \
        2>&1 | grep -E "^ +[0-9]+ |auto|^test acc|rror" || echo "rc=$?"
}

case "$part" in
check)
    {
        echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo 'no nvidia-smi')"
        [ -f /tmp/wide.tds ] || timeout 60 "$bin/tandem" generate rmat "${graph[@]}" -o /tmp/wide.tds >/dev/null
        wide_run "gpu-sample-gpu-gather fp32" --set orchestration.policy='"gpu-sample-gpu-gather"'
        wide_run "auto fp32"
        wide_run "gpu-sample-gpu-gather bf16 fast" --set orchestration.policy='"gpu-sample-gpu-gather"' "${fast[@]}" "${bf16[@]}"
        wide_run "auto bf16 fast" "${fast[@]}" "${bf16[@]}"
        wide_run "layer bf16 fast hot 0.005" --set orchestration.policy='"layer"' \
            --set orchestration.hot_ratio=0.005 "${fast[@]}" "${bf16[@]}"
    } 2>&1 | tee "$out/issue22.txt"
    ;;
trace)
    # Where `auto`'s first epoch goes (its probes are `auto probe` slices, scoring
    # the hot set `layer setup`): one epoch, bf16 rows, traced.
    [ -f /tmp/wide.tds ] || timeout 60 "$bin/tandem" generate rmat "${graph[@]}" -o /tmp/wide.tds >/dev/null
    timeout 120 "$bin/tandem" train --quiet-config --set 'data.path="/tmp/wide.tds"' "${model[@]}" \
        "${fast[@]}" "${bf16[@]}" --set train.epochs=1 --trace "$out/auto-epoch0.trace.json" 2>&1 |
        tail -40 | tee "$out/auto-epoch0.txt"
    gzip -f "$out/auto-epoch0.trace.json"
    ;;
*)
    echo "unknown part: $part" >&2
    exit 2
    ;;
esac
