#!/usr/bin/env bash
# Issue 11's GPU validation (docs/gpu-validation.md items 9, 11 and 12), in parts
# that each fit the device tool's 10-minute limit per command.
#
# Here (x86-64, with the Rust toolchain):
#   bash bench/gpu/issue10.sh build        # release tandem + parity/cuda_backend binaries in .gpu/
# Then one device `run` per part, carrying `.gpu`:
#   bash bench/gpu/issue11.sh tests        # parity (both feature dtypes, widen_bf16, gemm_tf32)
#   bash bench/gpu/issue11.sh backend      # bench backend: f32 vs bf16 gathers, fp32 vs tf32 GEMM
#   bash bench/gpu/issue11.sh epochs       # products epochs: f32/bf16 rows x fp32/tf32, two cache sizes
#   bash bench/gpu/issue11.sh ncu          # per-kernel table over a few SAGE batches
#   bash bench/gpu/issue11.sh syncs        # items 14-18: per-batch slices and host syncs
#   bash bench/gpu/issue11.sh peer         # Tandem vs the PyTorch + PyG program, same run
#   bash bench/gpu/issue11.sh ahead        # item 19: device.sample_ahead off vs on, same run
#   bash bench/gpu/issue11.sh all          # tests + backend + ahead + peer in one command (~5 min)
# Every part writes its outputs under $OUT (or ./gpu-out when $OUT is unset).
set -euo pipefail
cd "$(dirname "$0")/../.."
part="${1:?usage: issue11.sh tests|backend|epochs|ncu|syncs|peer|ahead|all}"
out="${OUT:-gpu-out}"
mkdir -p "$out"
bin=.gpu
cuda_lib=/usr/local/cuda-13.0/targets/x86_64-linux/lib
export LD_LIBRARY_PATH="$cuda_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# The products-scale graph and model of ../shared/gpu-runs/2026-11-23/RESULTS.md.
graph=(--vertices 2400000 --edges 62000000 --dim 100 --classes 47 --split 0.08,0.02,0.05 --seed 1)
model=(--set device.kind='"cuda"' --set model.kind='"sage"' --set model.layers=3
       --set model.hidden=256 --set model.dropout=0.5 --set 'train.fanouts=[25,10,5]'
       --set train.batch_size=1024 --set train.lr=0.003
       --set orchestration.policy='"gpu-sample-gpu-gather"')
products() {
    [ -f /tmp/products.tds ] || "$bin/tandem" generate rmat "${graph[@]}" -o /tmp/products.tds
}

# The mean `device sample` / `device step` slices and the per-batch host syncs
# (and other copy counts) of a trace, after epoch 0's evaluation.
summarize() {
    python3 - "$1" <<'PY'
import json, sys, collections
events = json.load(open(sys.argv[1]))
events = events["traceEvents"] if isinstance(events, dict) else events
slices = [e for e in events if e.get("ph") == "X"]
# Skip epoch 0 (NVRTC and cuBLAS start-up): start after its evaluation.
evals = sorted(e["ts"] + e["dur"] for e in slices if e["name"] == "eval")
start = evals[0] if evals else 0
acc = collections.defaultdict(list)
for e in slices:
    if e["ts"] >= start:
        acc[e["name"]].append(e)
for name in ["device sample", "device step"]:
    xs = acc.get(name, [])
    if xs:
        print(f"{name}: {len(xs)} slices, mean {sum(x['dur'] for x in xs) / len(xs) / 1e3:.3f} ms")
for name in ["device sample", "device step"]:
    xs = acc.get(name, [])
    for arg in ["host_syncs", "zero_fills", "uploads", "downloads"]:
        vals = [x["args"][arg] for x in xs if arg in x.get("args", {})]
        if vals:
            print(f"{name} {arg} per slice: mean {sum(vals) / len(vals):.2f}, max {max(vals)}")
PY
}

case "$part" in
tests)
    "$bin/parity" cuda:: 2>&1 | tail -5 | tee "$out/parity.txt"
    "$bin/cuda_backend" 2>&1 | tail -5 | tee "$out/cuda_backend.txt"
    ;;
backend)
    "$bin/tandem" bench backend --device cuda 2>&1 | tee "$out/bench-backend.txt"
    ;;
epochs)
    products
    # 915.5 MiB of f32 features: a cache of 20% of them holds 40% of the rows as bf16.
    for cache in 1000000000 192000000; do
        for rows in f32 bf16; do
            for prec in fp32 tf32; do
                name="cache${cache}-${rows}-${prec}"
                "$bin/tandem" train --set 'data.path="/tmp/products.tds"' "${model[@]}" \
                    --set device.cache_bytes="$cache" --set device.feature_dtype="\"$rows\"" \
                    --set model.precision="\"$prec\"" --set train.epochs=3 \
                    --trace "$out/$name.json" 2>&1 | tail -3 | tee "$out/$name.txt"
                gzip -f "$out/$name.json"
            done
        done
    done
    ;;
ncu)
    products
    /usr/local/cuda/bin/ncu --clock-control none --metrics gpu__time_duration.sum \
        --launch-skip 2000 --launch-count 600 --print-summary per-kernel \
        "$bin/tandem" train --set 'data.path="/tmp/products.tds"' "${model[@]}" \
        --set train.epochs=1 --set train.eval_every=0 2>&1 | gzip > "$out/ncu-sage.log.gz"
    # Expected 0 for SAGE (GCN source weights are made only for GCN).
    { zcat "$out/ncu-sage.log.gz" | grep -cE 'Profiling "block_(out_degree|src_weight)"' || true; } |
        tee "$out/gcn-weight-launches.txt"
    # Items 16 and 18: launches per kernel over the profiled batches. Expected: no
    # relu_forward / dropout_forward / relu_backward / dropout_backward, one
    # add_bias per batch (the top layer), two bias_act_dropout and two
    # dropout_act_backward per batch.
    for k in add_bias relu_forward dropout_forward relu_backward dropout_backward \
             bias_act_dropout dropout_act_backward sample_pick gather_rows; do
        printf '%s %s\n' "$k" "$(zcat "$out/ncu-sage.log.gz" | grep -c "Profiling \"$k\"" || true)"
    done | tee "$out/launch-counts.txt"
    ;;
syncs)
    products
    # Items 14-18 (docs/gpu-validation.md): 3 epochs with a trace; the mean slice
    # times and host synchronizations per batch of epochs 1-2.
    "$bin/tandem" train --set 'data.path="/tmp/products.tds"' "${model[@]}" \
        --set train.epochs=3 --trace "$out/syncs.json" 2>&1 | tail -5 | tee "$out/syncs.txt"
    summarize "$out/syncs.json" | tee "$out/syncs-summary.txt"
    gzip -f "$out/syncs.json"
    ;;
ahead)
    products
    # Item 19 (docs/gpu-validation.md): the same 3 epochs without and with
    # sampling ahead on a second stream; the ratio of the mean epoch times
    # (excluding epoch 0) and the accuracy of each.
    for ahead in false true; do
        "$bin/tandem" train --set 'data.path="/tmp/products.tds"' "${model[@]}" \
            --set train.epochs=3 --set device.sample_ahead=$ahead \
            --trace "$out/ahead-$ahead.json" > "$out/ahead-$ahead.txt" 2>&1
        grep -E "^ +[0-9]+ |mean epoch time|sampled ahead" "$out/ahead-$ahead.txt"
        summarize "$out/ahead-$ahead.json"
        gzip -f "$out/ahead-$ahead.json"
    done
    off=$(sed -n 's/.*mean epoch time \([0-9.]*\) s.*/\1/p' "$out/ahead-false.txt")
    on=$(sed -n 's/.*mean epoch time \([0-9.]*\) s.*/\1/p' "$out/ahead-true.txt")
    python3 -c "import sys; a, b = map(float, sys.argv[1:]); print(f'epoch s: sample_ahead off {a}, on {b}; on is {a / b:.2f}x faster')" \
        "$off" "$on" | tee "$out/ahead-ratio.txt"
    ;;
peer)
    # The issue's goal: Tandem's products epoch >= 10x the PyTorch + PyG program
    # (everything on the GPU; ../shared/peers/torch_gpu_train.py, staged into
    # .gpu by `issue10.sh build`) on the same graph, measured in the same run.
    [ -f "$bin/torch_gpu_train.py" ] || { echo "no $bin/torch_gpu_train.py (see issue10.sh build)" >&2; exit 2; }
    products
    [ -d /tmp/products-npy ] || "$bin/tandem" export --format npy -o /tmp/products-npy /tmp/products.tds
    python3 "$bin/torch_gpu_train.py" --data /tmp/products-npy --epochs 3 2>&1 | tail -2 |
        tee "$out/peer-torch.txt"
    "$bin/tandem" train --set 'data.path="/tmp/products.tds"' "${model[@]}" \
        --set train.epochs=3 2>&1 | tail -2 | tee "$out/peer-tandem.txt"
    torch_s=$(sed -n 's/.*torchgpu epoch_s=\([0-9.]*\).*/\1/p' "$out/peer-torch.txt")
    tandem_s=$(sed -n 's/.*mean epoch time \([0-9.]*\) s.*/\1/p' "$out/peer-tandem.txt")
    python3 -c "import sys; t, p = map(float, sys.argv[1:]); print(f'epoch s: tandem {t}, torch {p}; tandem is {p / t:.2f}x faster (goal >= 10x)')" \
        "$tandem_s" "$torch_s" | tee "$out/peer-ratio.txt"
    ;;
all)
    # One device command for a short lease: tests, backend, ahead (whose
    # sample_ahead=false run is the `syncs` measurement) and peer, every part's
    # text in all.txt (≤ 8 files come back: all.txt and the two traces). A failed
    # part is reported and the next one runs.
    products
    for p in tests backend ahead peer; do
        echo "=== $p ($(date +%T))"
        timeout 420 bash "$0" "$p" || echo "=== $p FAILED (exit $?)"
    done 2>&1 | tee "$out/all.txt"
    rm -f "$out"/parity.txt "$out"/cuda_backend.txt "$out"/bench-backend.txt \
        "$out"/ahead-*.txt "$out"/peer-*.txt
    ;;
*)
    echo "unknown part: $part" >&2
    exit 2
    ;;
esac
