#!/usr/bin/env bash
# Issue 23's GPU check: the all-GPU batch path (products-scale R-MAT, SAGE 3×256
# [25,10,5] b1024, 188 batches) against the PyTorch + PyG peer in the same run,
# the host synchronizations per 8 batches from the trace's `host.syncs` counter,
# and ncu over ~8 batches. Predictions: docs/performance.md, "All-GPU batch path
# (issue 23)".
#
# Here (x86-64, with the Rust toolchain):
#   bash bench/gpu/issue23.sh build    # release tandem + parity/cuda_backend tests, stripped, into .gpu/
# Then one device `run` carrying `.gpu` (each part ≤ 10 min; `all` ≈ 7 min on an H200):
#   bash bench/gpu/issue23.sh check    # parity (multi-tensor Adam, deferred loss, queued sampling) + cuda_backend
#   bash bench/gpu/issue23.sh peer     # default / before / fastest vs the peer, 3 epochs each
#   bash bench/gpu/issue23.sh syncs    # traced default run: host syncs per 8 batches, loss reads
#   bash bench/gpu/issue23.sh ncu      # kernels and launches per batch over ~8 batches (fast config)
#   bash bench/gpu/issue23.sh all      # the four in order
#   bash bench/gpu/issue23.sh gemm     # TANDEM_GEMM=cublas|lt-inplace|lt-nosplit: parity, epochs, split-K launches (≈ 5 min)
# Outputs under $OUT (default ./gpu-out): issue23-*.txt, issue23-default.trace.json.gz.
set -euo pipefail
cd "$(dirname "$0")/../.."
part="${1:?usage: issue23.sh build|check|peer|syncs|ncu|gemm|all}"
out="${OUT:-gpu-out}"
mkdir -p "$out"
bin=.gpu
export LD_LIBRARY_PATH="/usr/local/cuda-13.0/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
data=/tmp/products.tds
graph=(--vertices 2400000 --edges 62000000 --classes 47 --split 0.08,0.02,0.05 --seed 1 --dim 100)
# The model of the 2026-11-26 runs; no placement and no speed knob: what a user
# gets by default (auto → gpu-sample-gpu-gather, sample_ahead on, loss_lag 8 on CUDA).
model=(--quiet-config --set "data.path=\"$data\"" --set device.kind='"cuda"'
       --set model.kind='"sage"' --set model.layers=3 --set model.hidden=256
       --set model.dropout=0.5 --set 'train.fanouts=[25,10,5]' --set train.batch_size=1024
       --set train.lr=0.003 --set train.eval_every=0 --set orchestration.cpu_workers=12)
# The 2026-11-26 default (no sampling ahead, every loss read at once).
before=(--set orchestration.policy='"gpu-sample-gpu-gather"' --set device.sample_ahead=false
        --set device.loss_lag=1)
# The fastest: TF32 products (opt-in: it changes numerics).
fastest=(--set orchestration.policy='"gpu-sample-gpu-gather"' --set model.precision='"tf32"')

stage() { echo; echo "== $1 ($(date -u +%T))"; }
products() {
    [ -f "$data" ] || timeout 60 "$bin/tandem" generate rmat "${graph[@]}" -o "$data" | tail -1
}
epoch_s() { sed -n 's/.*mean epoch time \([0-9.]*\) s.*/\1/p' "$1"; }
train() { # name, args...: 3 epochs, the epoch lines and the mean into $out/issue23-train-NAME.txt
    local name="$1"
    shift
    stage "train $name"
    timeout 90 "$bin/tandem" train "${model[@]}" --set train.epochs=3 "$@" \
        > "$out/issue23-train-$name.txt" 2>&1 || echo "rc=$?"
    grep -E '^ +[0-9]+ |auto|mean epoch|sampled ahead|rror' "$out/issue23-train-$name.txt" | tail -6
}

check() {
    stage "parity cuda:: (adam_all_and_the_deferred_loss_match_the_single_ops among them)"
    timeout 120 "$bin/parity" cuda:: 2>&1 | grep -E 'test result|FAILED|panicked' | head -12
    stage cuda_backend
    timeout 60 "$bin/cuda_backend" 2>&1 | grep -E 'test result|FAILED|panicked' | head -12
}

peer() {
    [ -f "$bin/torch_gpu_train.py" ] || { echo "no $bin/torch_gpu_train.py (run build)" >&2; exit 2; }
    products
    stage "torch peer"
    [ -d /tmp/products-npy ] || timeout 60 "$bin/tandem" export "$data" --format npy -o /tmp/products-npy | tail -1
    PYTHONUNBUFFERED=1 timeout 150 python3 "$bin/torch_gpu_train.py" --data /tmp/products-npy \
        --epochs 3 > "$out/issue23-peer.txt" 2>&1 || echo "rc=$?"
    tail -2 "$out/issue23-peer.txt"
    train default
    train before "${before[@]}"
    train fastest "${fastest[@]}"
    train fastest-bf16 "${fastest[@]}" --set device.feature_dtype='"bf16"'
    local p
    p=$(sed -n 's/.*torchgpu epoch_s=\([0-9.]*\).*/\1/p' "$out/issue23-peer.txt")
    stage ratios
    for n in default before fastest fastest-bf16; do
        python3 -c "import sys; t, p = map(float, sys.argv[2:]); print(f'{sys.argv[1]:>13}: {t:.3f} s/epoch, {p / t:.2f}x the peer ({p:.3f} s)')" \
            "$n" "$(epoch_s "$out/issue23-train-$n.txt")" "$p" || echo "$n: no time"
    done | tee "$out/issue23-ratios.txt"
    echo "targets: default >= 10x, fastest >= 14x" | tee -a "$out/issue23-ratios.txt"
}

syncs() {
    products
    stage "traced default run (2 epochs): host syncs per 8 batches"
    timeout 90 "$bin/tandem" train "${model[@]}" --set train.epochs=2 \
        --trace "$out/issue23-default.trace.json" > "$out/issue23-syncs-train.txt" 2>&1 || echo "rc=$?"
    python3 - "$out/issue23-default.trace.json" <<'EOF' | tee "$out/issue23-syncs.txt"
import json, sys, collections
d = json.load(open(sys.argv[1]))
ev = d["traceEvents"] if isinstance(d, dict) else d
# host.syncs (compute stream) and host.syncs.sampling (the sampling sibling):
# one cumulative sample per trained batch each (the step executor).
for name, what in (("host.syncs", "compute stream, target <= 1"), ("host.syncs.sampling", "sampling sibling, target <= 1: 8 batches queued, one read")):
    c = [e["args"] for e in ev if e.get("ph") == "C" and e.get("name") == name]
    vals = [float(next(iter(a.values()))) for a in c]
    n = len(vals)
    steady = vals[n // 2:]  # the second epoch
    w = [steady[i + 8] - steady[i] for i in range(len(steady) - 8)]
    print(f"{name}: {n} samples (batches); second epoch {len(steady)}")
    if w:
        print(f"  syncs per 8 batches (second epoch): max {max(w):.0f}, mean {sum(w) / len(w):.2f}  ({what})")
per = collections.defaultdict(list)
for e in ev:
    if e.get("ph") == "X" and e.get("name") in ("device step", "device sample", "loss read", "sample read"):
        per[e["name"]].append((e["dur"], e.get("args", {}).get("host_syncs", 0)))
for k, v in sorted(per.items()):
    durs = sorted(x[0] for x in v)
    print(f"{k:>14}: {len(v)} slices, median {durs[len(durs) // 2]:.0f} us, host_syncs total {sum(x[1] for x in v):.0f}")
EOF
    gzip -f "$out/issue23-default.trace.json"
}

ncu() {
    products
    stage "ncu, fastest config, ~8 batches' launches after 3000 (caches flushed: upper bounds)"
    # ~59 launches a batch now (86 on 2026-11-26; sampling 21 of them, 36 then; the
    # fused bias gradient took 4 more off the dense step).
    # Sampling ahead queues 8 batches at once (168 sampling launches together), so
    # the window holds ~8 batches (one group) and the counts are averages over it.
    timeout 240 /usr/local/cuda/bin/ncu --clock-control none --metrics gpu__time_duration.sum \
        --launch-skip 3000 --launch-count 520 --print-summary per-kernel \
        "$bin/tandem" train "${model[@]}" "${fastest[@]}" --set train.epochs=1 \
        > /tmp/issue23-ncu.log 2>&1 || echo "rc=$?"
    gzip -c /tmp/issue23-ncu.log > "$out/issue23-ncu.log.gz"
    python3 - /tmp/issue23-ncu.log <<'EOF' | tee "$out/issue23-ncu.txt"
import re, sys, collections
text = open(sys.argv[1]).read()
seq = re.findall(r'==PROF== Profiling "([^"]*)"', text)
starts = [i for i, n in enumerate(seq) if n == "gather_rows"]
per_batch = [b - a for a, b in zip(starts, starts[1:])]
print(f"launches profiled {len(seq)}; launches per batch (gather_rows to gather_rows): {per_batch} (~42 each, one gap also holds a queued group of 8 batches)")
samp = ("sample_count_scan", "sample_pick", "unique_insert", "unique_flag_scan", "unique_scatter", "scan_u32_tiles", "scan_u32_add", "scan_u64_tiles", "scan_u64_add")
if starts:
    nb = len(starts)
    print(f"over the window's {nb} batches: {len(seq) / nb:.1f} launches a batch (predicted 63), "
          f"{sum(seq.count(k) for k in samp) / nb:.1f} of them sampling (predicted 21: 5 + 7 + 9; 36 on 2026-11-26)")
if per_batch:
    print("one batch:", dict(collections.Counter(seq[starts[0]:starts[1]])))
tot, kern = 0.0, collections.Counter()
cur = None
for line in text.splitlines():
    m = re.match(r"  (.+?) \(\d+, \d+, \d+\)x\(.*Invocations (\d+)", line)
    if m:
        cur = (m.group(1), int(m.group(2)))
        continue
    m = re.match(r"\s+gpu__time_duration.sum\s+(\S+)\s+\S+\s+\S+\s+(\S+)", line)
    if m and cur:
        unit, avg = m.group(1), float(m.group(2).replace(",", ""))
        us = avg * {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}.get(unit, 1.0)
        kern[cur[0]] += us * cur[1]
        tot += us * cur[1]
        cur = None
b = max(len(seq) / (sum(per_batch) / len(per_batch)), 1) if per_batch else 5
print(f"kernel time {tot:.0f} us over {len(seq)} launches = {tot / b:.0f} us per batch (target <= 500)")
for k, v in kern.most_common(14):
    print(f"  {k[:60]:<60} {v / b:7.1f} us/batch")
EOF
}

# The GEMM path (gpu_ops/src/cuda/gemm_lt.rs): cublasSgemm (the default) against
# cuBLASLt with split-K reduced in place (no separate reduction kernel) or no
# split-K. For each: the CUDA parity tests (matmul against the host), 3 epochs of
# the fastest config, and ncu's kernel names over 2 batches (split-K reduction
# launches per batch; expected 6-7 with cublas, 0 with either lt path).
gemm() {
    products
    for path in cublas lt-inplace lt-nosplit; do
        export TANDEM_GEMM=$path
        stage "TANDEM_GEMM=$path: parity cuda::"
        timeout 120 "$bin/parity" cuda:: 2>&1 | grep -E 'test result|FAILED|panicked' | head -6
        train "fastest-gemm-$path" "${fastest[@]}"
        stage "TANDEM_GEMM=$path: ncu kernel names, 2 batches after 3000 launches"
        timeout 120 /usr/local/cuda/bin/ncu --clock-control none \
            --metrics gpu__time_duration.sum --launch-skip 3000 --launch-count 170 \
            "$bin/tandem" train "${model[@]}" "${fastest[@]}" --set train.epochs=1 \
            > "/tmp/issue23-gemm-$path.log" 2>&1 || echo "rc=$?"
        gzip -c "/tmp/issue23-gemm-$path.log" > "$out/issue23-gemm-$path.ncu.log.gz"
        python3 - "/tmp/issue23-gemm-$path.log" "$path" <<'EOF' | tee -a "$out/issue23-gemm.txt"
import re, sys, collections
text = open(sys.argv[1]).read()
seq = re.findall(r'==PROF== Profiling "([^"]*)"', text)
starts = [i for i, n in enumerate(seq) if n == "gather_rows"]
b = max(len(starts) - 1, 1)
window = seq[starts[0]:starts[-1]] if len(starts) > 1 else seq
# cuBLAS's GEMMs show as sm80_xmma_gemm_*, sm90_* or cutlass's `Kernel2`; its split-K
# reduction as splitKreduce_kernel (2026-11-26 log).
is_gemm = lambda n: re.search(r"gemm|sm90|sm80|cutlass|xmma|^Kernel\d*$", n, re.I) and not re.search(r"splitk", n, re.I)
is_red = lambda n: re.search(r"splitk|reduce", n, re.I) and not n.startswith("xent")
gemm = [n for n in window if is_gemm(n)]
red = [n for n in window if is_red(n)]
us = collections.Counter()
# One duration section per profiled launch (no --print-summary), in launch order.
durs = re.findall(r"gpu__time_duration.sum\s+(\S+)\s+([\d.,]+)", text)
scale = {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
for name, (unit, v) in zip(seq, durs):
    us["gemm" if is_gemm(name) else "reduce" if is_red(name) else "other"] += float(v.replace(",", "")) * scale.get(unit, 1.0)
n = max(len(seq) / max(len(window) / b, 1), 1)
print(f"{sys.argv[2]:>11}: {len(window) / b:.1f} launches/batch, GEMM {len(gemm) / b:.1f}, split-K reductions {len(red) / b:.1f}; "
      f"per batch GEMM {us['gemm'] / n:.0f} us, reductions {us['reduce'] / n:.0f} us, other {us['other'] / n:.0f} us")
print("   reduction kernels:", dict(collections.Counter(red)))
EOF
    done
    unset TANDEM_GEMM
    for path in cublas lt-inplace lt-nosplit; do
        echo "TANDEM_GEMM=$path: $(epoch_s "$out/issue23-train-fastest-gemm-$path.txt") s/epoch"
    done | tee -a "$out/issue23-gemm.txt"
}

case "$part" in
build)
    cargo build --release -p runtime --bin tandem
    mkdir -p "$bin"
    cp target/release/tandem "$bin/tandem"
    for t in parity cuda_backend; do
        exe=$(cargo test --release -p gpu_ops --test "$t" --no-run 2>&1 |
              sed -n "s/.*Executable .*(\(target\/release\/deps\/$t-[0-9a-f]*\)).*/\1/p" | tail -1)
        cp "$exe" "$bin/$t"
    done
    strip "$bin"/tandem "$bin"/parity "$bin"/cuda_backend
    if [ -f ../shared/peers/torch_gpu_train.py ]; then
        cp ../shared/peers/torch_gpu_train.py "$bin/"
    fi
    ls -la "$bin"
    ;;
check) check 2>&1 | tee "$out/issue23-check.txt" ;;
peer) peer ;;
syncs) syncs ;;
ncu) ncu ;;
gemm) gemm ;;
all)
    { echo "== $(date -u +%FT%TZ) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo 'no nvidia-smi')"
      check; peer; syncs; ncu; } 2>&1 | tee "$out/issue23-all.txt"
    ;;
*)
    echo "unknown part: $part" >&2
    exit 2
    ;;
esac
