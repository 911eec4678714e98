#!/usr/bin/env bash
# Issue 22 item 6's GPU check: `tandem bench orchestration --regimes` on the
# products-scale graph over feature widths {100, 512} × device-cache fractions
# {1, 0.2, 0.05, 0} × feature rows {f32, bf16}, every run with TF32 products and
# sampling ahead (`model.precision = "tf32"`, `device.sample_ahead = true`: the
# "fast" settings of ../shared/gpu-runs/2026-11-26/RESULTS.md), 2 epochs per run.
# Six policies per regime; 16 regimes in three parts that each fit the device
# tool's 10-minute limit on one H100 or H200 (2026-11-26, H200: one 100-column
# regime took ~40 s with its graph; a 512-column run 3–8 s per GPU-gather policy,
# more for the CPU-gather ones):
#
# Here: bash bench/gpu/issue10.sh build; then one device `run` per part carrying `.gpu`:
#   bash bench/gpu/regimes.sh w100     # 100 columns, cache 1, 0.2, 0.05, 0 (8 regimes)
#   bash bench/gpu/regimes.sh w512a    # 512 columns, cache 1, 0.2 (4 regimes)
#   bash bench/gpu/regimes.sh w512b    # 512 columns, cache 0.05, 0 (4 regimes)
# Each part writes $OUT/regimes-<part>.txt (tables, progress lines, exit codes) and
# $OUT/regimes-<part>.jsonl (one JSON line per run, with `row_dtype` and `precision`);
# $OUT defaults to ./gpu-out. A part runs one bench per cache fraction, each under
# what is left of the part's guard (GUARD seconds, default 560), so a slow fraction
# loses only its own regimes; the rest are skipped and the .txt says so.
#
# Overrides (environment): ROWS=bf16 (one row dtype; the files get a `-bf16` suffix:
# run a part once per dtype when it does not fit), GUARD, VERTICES / EDGES (a smaller
# graph), HOTNESS=pcie (rank hot vertices by PCIe bytes saved per CPU µs,
# `orchestration.hotness = "pcie"`; files get a `-pcie` suffix), BOUND=11 (the
# staleness bound at which hot rows kept across super-batches pay, docs/performance.md;
# files get a `-b11` suffix), SUPER=2 (`orchestration.super_batch`: at the default bound
# 7, super-batches of 2 let a hot row serve three of them, 28–32% fewer CPU rows,
# docs/performance.md; files get a `-n2` suffix), LAG=1 (`device.loss_lag`: 1 reads every
# batch's loss before its step, the layer path's old per-batch synchronization; the
# default 0 is 8 on CUDA, one read per super-batch on the layer path without a
# synchronization; files get a `-lag1` suffix), DEVICE=host (the host backend: a dry run without a GPU; with the default
# `cuda` such a run ends in "no CUDA device"), BIN (where `tandem` is, default .gpu).
set -euo pipefail
cd "$(dirname "$0")/../.."
part="${1:?usage: regimes.sh w100|w512a|w512b}"
out="${OUT:-gpu-out}"
mkdir -p "$out"
bin="${BIN:-.gpu}"
export LD_LIBRARY_PATH="/usr/local/cuda-13.0/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
graph=(--vertices "${VERTICES:-2400000}" --edges "${EDGES:-62000000}" --classes 47 --split 0.08,0.02,0.05 --seed 1)
model=(--set "device.kind=\"${DEVICE:-cuda}\"" --set model.kind='"sage"' --set model.layers=3
       --set model.hidden=256 --set model.dropout=0.5 --set 'train.fanouts=[25,10,5]'
       --set train.batch_size=1024 --set train.lr=0.003 --set train.eval_every=0
       --set orchestration.cpu_workers=12)
fast=(--set device.sample_ahead=true --set model.precision='"tf32"')
[ -z "${HOTNESS:-}" ] || fast+=(--set "orchestration.hotness=\"$HOTNESS\"")
[ -z "${BOUND:-}" ] || fast+=(--set "orchestration.staleness_bound=$BOUND")
[ -z "${SUPER:-}" ] || fast+=(--set "orchestration.super_batch=$SUPER")
[ -z "${LAG:-}" ] || fast+=(--set "device.loss_lag=$LAG")
rows="${ROWS:-f32,bf16}"
guard="${GUARD:-560}"

case "$part" in
w100) dim=100 fractions=(1 0.2 0.05 0) ;;
w512a) dim=512 fractions=(1 0.2) ;;
w512b) dim=512 fractions=(0.05 0) ;;
*)
    echo "unknown part: $part (expected w100, w512a or w512b)" >&2
    exit 2
    ;;
esac
tag="$part${ROWS:+-${ROWS//,/-}}${HOTNESS:+-$HOTNESS}${BOUND:+-b$BOUND}${SUPER:+-n$SUPER}${LAG:+-lag$LAG}"
txt="$out/regimes-$tag.txt"
jsonl="$out/regimes-$tag.jsonl"
parts=$(mktemp -d)
trap 'rm -rf "$parts"' EXIT
deadline=$((SECONDS + guard))

{
    echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo 'no nvidia-smi')"
    echo "== part $part: dim $dim, cache ${fractions[*]}, rows $rows, tf32 + sample_ahead, 2 epochs; guard ${guard} s"
    for f in "${fractions[@]}"; do
        left=$((deadline - SECONDS))
        if [ "$left" -le 10 ]; then
            echo "== dim $dim, cache $f: skipped (the part's ${guard} s guard is spent)"
            continue
        fi
        echo "== dim $dim, cache $f, rows $rows ($(date -u +%T), ${left} s left)"
        rc=0
        timeout -k 10 "$left" "$bin/tandem" bench orchestration --regimes "${graph[@]}" \
            "${model[@]}" "${fast[@]}" --epochs 2 --dims "$dim" --cache-fractions "$f" \
            --row-dtypes "$rows" --json "$parts/$f.jsonl" 2>&1 || rc=$?
        [ "$rc" -eq 0 ] || echo "== dim $dim, cache $f: rc=$rc (124: past the guard)"
    done
    # The fractions' JSON lines, in table order, in one file.
    : >"$jsonl"
    for f in "${fractions[@]}"; do
        [ ! -f "$parts/$f.jsonl" ] || cat "$parts/$f.jsonl" >>"$jsonl"
    done
    echo "== $(date -u +%T) done: $(wc -l <"$jsonl") JSON lines in $jsonl"
} 2>&1 | tee "$txt"
