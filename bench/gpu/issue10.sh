#!/usr/bin/env bash
# Issue 10's GPU validation, in parts that each fit the device tool's 10-minute
# limit per command (docs/gpu-validation.md items 5–8).
#
# Here (x86-64, with the Rust toolchain):
#   bash bench/gpu/issue10.sh build        # release tandem + test binaries, stripped, into .gpu/
# Then one device `run` per part, carrying `.gpu` (the device machine has no
# Rust toolchain; CUDA 13.0 libraries are on it, see ../shared/FACTS.md):
#   bash bench/gpu/issue10.sh tests        # parity + cuda_backend test binaries, then default train
#   bash bench/gpu/issue10.sh trace        # products graph, layer path trace + report, bench hot
#   bash bench/gpu/issue10.sh regimes100   # regimes table, 100 columns (4 cache fractions)
#   bash bench/gpu/issue10.sh regimes512a  # 512 columns, cache 1 and 0.2
#   bash bench/gpu/issue10.sh regimes512b  # 512 columns, cache 0.05 and 0
# Every part writes its outputs under $OUT (or ./gpu-out when $OUT is unset).
set -euo pipefail
cd "$(dirname "$0")/../.."
part="${1:?usage: issue10.sh build|tests|trace|regimes100|regimes512a|regimes512b}"
out="${OUT:-gpu-out}"
mkdir -p "$out"
bin=.gpu
cuda_lib=/usr/local/cuda-13.0/targets/x86_64-linux/lib
export LD_LIBRARY_PATH="$cuda_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# The products-scale synthetic graph of ../shared/gpu-runs/2026-11-23/RESULTS.md.
graph=(--vertices 2400000 --edges 62000000 --classes 47 --split 0.08,0.02,0.05 --seed 1)
# The model of products_sage.toml (GraphSAGE 3×256, DGL fanouts, batch 1024).
model=(--set device.kind=cuda --set model.kind=sage --set model.layers=3
       --set model.hidden=256 --set model.dropout=0.5 --set 'train.fanouts=[25,10,5]'
       --set train.batch_size=1024 --set train.lr=0.003 --set train.eval_every=0
       --set orchestration.cpu_workers=12)

case "$part" in
build)
    cargo build --release -p runtime --bin tandem
    mkdir -p "$bin"
    cp target/release/tandem "$bin/tandem"
    # Test binaries: the last path cargo prints for each target.
    for t in parity cuda_backend; do
        exe=$(cargo test --release -p gpu_ops --test "$t" --no-run 2>&1 |
              sed -n "s/.*Executable .*(\(target\/release\/deps\/$t-[0-9a-f]*\)).*/\1/p" | tail -1)
        cp "$exe" "$bin/$t"
    done
    strip "$bin"/tandem "$bin"/parity "$bin"/cuda_backend
    # The PyTorch + PyG peer of the 2026-11-23 run, for issue11.sh's `peer` part
    # (the device machine sees only this checkout and what is carried).
    if [ -f ../shared/peers/torch_gpu_train.py ]; then
        cp ../shared/peers/torch_gpu_train.py "$bin/"
    fi
    ls -la "$bin"
    ;;
tests)
    "$bin/parity" cuda:: 2>&1 | tail -5 | tee "$out/parity.txt"
    "$bin/cuda_backend" 2>&1 | tail -5 | tee "$out/cuda_backend.txt"
    "$bin/tandem" train --device cuda --quiet-config 2>&1 | tail -4 | tee "$out/train-default.txt"
    ;;
trace)
    "$bin/tandem" generate rmat "${graph[@]}" --dim 100 -o /tmp/products.tds
    "$bin/tandem" train --set 'data.path="/tmp/products.tds"' "${model[@]}" \
        --set orchestration.policy='"gpu-sample-gpu-gather"' --set train.epochs=2 \
        --trace "$out/gpu-only.json" 2>&1 | tail -3 | tee "$out/gpu-only.txt"
    "$bin/tandem" train --set 'data.path="/tmp/products.tds"' "${model[@]}" \
        --set orchestration.policy='"layer"' --set orchestration.hot_ratio=0.1 \
        --set orchestration.on_late='"compute"' --set train.epochs=2 \
        --trace "$out/layer.json" 2>&1 | tail -6 | tee "$out/layer.txt"
    "$bin/tandem" report "$out/layer.json" > "$out/layer-report.txt"
    "$bin/tandem" train --set 'data.path="/tmp/products.tds"' "${model[@]}" \
        --set train.epochs=3 2>&1 | tail -8 | tee "$out/auto.txt"
    for d in 100 512; do
        for th in 1 12; do
            "$bin/tandem" bench hot --dim "$d" --threads "$th" 2>&1 | tail -6
        done
    done | tee "$out/bench-hot.txt"
    gzip -f "$out"/*.json
    ;;
regimes100)
    "$bin/tandem" bench orchestration --regimes "${graph[@]}" "${model[@]}" \
        --dims 100 --json "$out/regimes-100.jsonl" 2>&1 | tee "$out/regimes-100.txt"
    ;;
regimes512a)
    "$bin/tandem" bench orchestration --regimes "${graph[@]}" "${model[@]}" \
        --dims 512 --cache-fractions 1,0.2 --json "$out/regimes-512a.jsonl" 2>&1 |
        tee "$out/regimes-512a.txt"
    ;;
regimes512b)
    "$bin/tandem" bench orchestration --regimes "${graph[@]}" "${model[@]}" \
        --dims 512 --cache-fractions 0.05,0 --json "$out/regimes-512b.jsonl" 2>&1 |
        tee "$out/regimes-512b.txt"
    ;;
*)
    echo "unknown part: $part" >&2
    exit 2
    ;;
esac
