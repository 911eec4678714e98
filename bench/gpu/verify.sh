#!/usr/bin/env bash
# The GPU verification suite: every check still owed to a GPU, in parts ordered by
# what matters most. Each part is one device command of at most 10 minutes; part 1
# finishes in under 9 minutes on an H100.
#
# The GPU machine has no Rust toolchain and no network. On the development machine:
#   bash bench/gpu/build.sh            # release tandem + parity/cuda_backend tests, stripped, into bench/gpu/bin/
# then one device command per part, carrying `bench/gpu/bin`:
#   bash bench/gpu/verify.sh 1         # writes $OUT/record-part1.md (predicted | measured | ok?)
# and commit that file as docs/records/<date>-<card>-verify-1.md.
#
# Parts (docs/gpu-validation.md says what each checks and why):
#   1  CUDA tests; the default products run against the PyTorch + PyG program; 512
#      bf16 columns at cache 250 MB and 0: layer against the best step-based
#      placement, `auto`; host synchronizations (trace) and launches (ncu)
#   2  regime table: 512 columns, bf16 rows, cache 5% and 0 (six policies each)
#   3  papers100M-sized R-MAT, fp32 rows, in memory, placement fitted to the device
#   4  the layer path's variants (super-batch 2, bound 11, loss read per batch, PCIe
#      hotness) with traces; the CPU hot kernel on the GPU machine's cores
#   5  regime table: 512 columns, f32 rows, cache 5% and 0
#   6  regime table: 100 columns, f32 and bf16 rows, cache 1, 20%, 5%, 0
#   7  regime table: 512 columns, f32 and bf16 rows, cache 1 and 20%
#   8  the all-GPU batch path's pieces: `tandem bench backend`, the three GEMM paths
#      (TANDEM_GEMM), NCCL on one rank, the default run on the GPU and on the host
#   9  papers100M-sized R-MAT, bf16 rows, in memory, placement fitted to the device
#   10 half the papers100M size, the default placement
#   11 half the papers100M size, trained from a store on the local disk
#   12 link prediction on the products-scale R-MAT with an edge split: one epoch of
#      Tandem's link task against the PyTorch + PyG link program
#   13 the loader for a model of the user's own: the device loader (sampling and
#      gather on the GPU, through its feature cache) against the host loader, same seeds;
#      from Python (the wheel): DLPack batches checked on a torch side stream, and a PyG
#      GraphSAGE fed by device="cuda" against the same model fed by the host loader
#   table DIR...   the markdown table of the measured files under DIRs (several parts)
#
# Environment:
#   DEVICE  cuda (default) or host: `host` dry-runs on the host backend, skipping
#           what needs a GPU (ncu, NCCL, the peer program, TANDEM_GEMM) with a reason
#   SCALE   full (default on cuda) or small (default on host): small graphs, so a dry
#           run of a part takes minutes on two cores
#   OUT     output folder (default ./verify-out); the device tool sets it
#   BIN     folder of the carried binaries (default bench/gpu/bin); without
#           $BIN/tandem a dry run uses target/release/tandem
#   WORK    folder for generated data (default: a fresh folder under /tmp)
#   GUARD   seconds the part may run (default 520 for part 1, 570 for the others;
#           scaled by 4 when SCALE=small): a step that would start past it is skipped
#           and recorded as skipped
# Predictions: bench/gpu/predictions.tsv. Each part appends its measurements to
# $OUT/measured-partN.tsv and writes $OUT/record-partN.md; logs are under $OUT/partN/.
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
part="${1:-}"
case "$part" in
[1-9] | 1[0-3] | table) ;;
*)
    sed -n '2,45p' "$0" | sed 's/^# \{0,1\}//' >&2
    echo "usage: bash bench/gpu/verify.sh 1..13 | table DIR..." >&2
    exit 2
    ;;
esac

py() { python3 "$root/bench/gpu/verify.py" "$@"; }
preds="$root/bench/gpu/predictions.tsv"

if [ "$part" = table ]; then
    shift
    [ $# -gt 0 ] || { echo "usage: verify.sh table DIR... (folders holding measured-part*.tsv)" >&2; exit 2; }
    files=() ; parts=() ; head=""
    for d in "$@"; do
        for f in "$d"/measured-part*.tsv; do
            [ -f "$f" ] || continue
            files+=("$f")
            p=${f##*measured-part}; parts+=("${p%.tsv}")
        done
        [ -n "$head" ] || { [ -f "$d/header.txt" ] && head="$d/header.txt"; }
    done
    [ ${#files[@]} -gt 0 ] || { echo "no measured-part*.tsv under $*" >&2; exit 2; }
    tmp=$(mktemp)
    { [ -n "$head" ] && grep -v '^parts=' "$head"; echo "parts=${parts[*]}"; } > "$tmp"
    py table "$preds" "${OUT:-verify-out}/record.md" "$tmp" "${files[@]}"
    rm -f "$tmp"
    exit 0
fi

DEVICE="${DEVICE:-cuda}"
case "$DEVICE" in cuda | host) ;; *) echo "DEVICE must be cuda or host, found '$DEVICE'" >&2; exit 2 ;; esac
SCALE="${SCALE:-$([ "$DEVICE" = host ] && echo small || echo full)}"
case "$SCALE" in full | small) ;; *) echo "SCALE must be full or small, found '$SCALE'" >&2; exit 2 ;; esac
OUT="${OUT:-verify-out}"
BIN="${BIN:-bench/gpu/bin}"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
logs="$OUT/part$part"
mkdir -p "$logs"
meas="$OUT/measured-part$part.tsv"
: >"$meas"
WORK="${WORK:-$(mktemp -d /tmp/verify.XXXXXX)}"
mkdir -p "$WORK"
export LD_LIBRARY_PATH="/usr/local/cuda-13.0/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

tandem="$BIN/tandem"
if [ ! -x "$tandem" ]; then
    if [ "$DEVICE" = host ] && [ -x target/release/tandem ]; then
        tandem=target/release/tandem
        echo "note: no $BIN/tandem; the dry run uses $tandem"
    else
        echo "no $BIN/tandem: run bash bench/gpu/build.sh on the development machine and carry $BIN" >&2
        exit 2
    fi
fi
tandem=$(cd "$(dirname "$tandem")" && pwd)/$(basename "$tandem")

dry=0
[ "$DEVICE" = cuda ] && [ "$SCALE" = full ] || dry=1
if [ "$SCALE" = full ]; then
    V=2400000 E=62000000 WORKERS=12 SLOW=1 LINKB=300 LOADB=200
    CACHE250=250000000 # 5% of the 512-column fp32 rows (10% of the bf16 rows)
    PAPERS=() HALF=(--half)
else
    V=40000 E=400000 WORKERS=1 SLOW=4 LINKB=20 LOADB=20
    CACHE250=$((V * 512 * 4 / 20))
    PAPERS=(--vertices 200000 --edges 2000000 --classes 16 --split 0.1,0.02,0.02)
    HALF=(--vertices 100000 --edges 1000000 --classes 16 --split 0.1,0.02,0.02)
fi
default_guard=570
[ "$part" = 1 ] && default_guard=520
guard=$((${GUARD:-$default_guard} * SLOW))
deadline=$((SECONDS + guard))
started=$SECONDS

# The products-scale graph of the 2026-11-23 and 2026-11-26 runs and its model
# (GraphSAGE 3x256, fanouts [25,10,5] in DGL order, batch 1024).
graph=(--vertices "$V" --edges "$E" --classes 47 --split 0.08,0.02,0.05 --seed 1)
cfg=(--set "device.kind=\"$DEVICE\"" --set model.kind='"sage"'
       --set model.layers=3 --set model.hidden=256 --set model.dropout=0.5
       --set 'train.fanouts=[25,10,5]' --set train.batch_size=1024 --set train.lr=0.003
       --set train.eval_every=0 --set "orchestration.cpu_workers=$WORKERS")
model=(--quiet-config "${cfg[@]}")
gsgg=(--set orchestration.policy='"gpu-sample-gpu-gather"')
csgg=(--set orchestration.policy='"cpu-sample-gpu-gather"')
layer=(--set orchestration.policy='"layer"')
bf16=(--set device.feature_dtype='"bf16"')
# TF32 products and sampling ahead: what `model.precision = "auto"` and the
# defaults give a SAGE run on CUDA, spelled out so that every run says it.
fast=(--set device.sample_ahead=true --set model.precision='"tf32"')

{
    echo "date=$(date -u +%FT%TZ)"
    echo "device=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1 || true)"
    echo "host=$(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
    echo "build=$(cat "$BIN/BUILD" 2>/dev/null || echo "unknown (no $BIN/BUILD; $tandem)")"
    echo "DEVICE=$DEVICE"
    echo "SCALE=$SCALE"
    echo "dry=$dry"
    echo "parts=$part"
    echo "command=bash bench/gpu/verify.sh $part"
} >"$OUT/header.txt"
sed -i "s/^device=$/device=${DEVICE} backend (no nvidia-smi)/" "$OUT/header.txt"
echo "== part $part: DEVICE=$DEVICE SCALE=$SCALE guard ${guard} s; out $OUT; data $WORK"
grep -E '^(date|device|build)=' "$OUT/header.txt" | sed 's/^/   /'

# ---------------------------------------------------------------- helpers

# step NAME LIMIT CMD...: runs CMD with its output in $logs/NAME.log, under LIMIT
# seconds (times SLOW) and what is left of the part's guard; prints the log's tail.
step() {
    local name=$1 limit=$(($2 * SLOW))
    shift 2
    local left=$((deadline - SECONDS))
    if [ "$left" -le 5 ]; then
        echo "== $name: skipped (the part's ${guard} s guard is spent)"
        echo "skipped: the part's guard is spent" >"$logs/$name.log"
        return 125
    fi
    [ "$limit" -le "$left" ] || limit=$left
    echo "== $name ($(date -u +%T), $((SECONDS - started)) s in, limit ${limit} s)"
    local rc=0
    timeout -k 10 "$limit" "$@" >"$logs/$name.log" 2>&1 || rc=$?
    grep -E "^ +[0-9]+ |auto\"? chose|mean epoch|test accuracy|test result|rror|torchgpu|wrote|skipped" "$logs/$name.log" |
        tail -n 6 | cut -c1-200 | sed 's/^/   /'
    [ "$rc" -eq 0 ] || echo "   rc=$rc$([ "$rc" -eq 124 ] && echo ' (past its time limit)')"
    return "$rc"
}

# skip ID REASON: records a measurement that was not taken, and why.
skip() {
    echo "   skipped $1: $2"
    py note "$meas" "$1" skipped "$2" >/dev/null
}

# generate FILE DIM: the products-scale R-MAT with DIM feature columns (once).
generate() {
    [ -s "$1" ] || step "generate-$2" 90 "$tandem" generate rmat "${graph[@]}" --dim "$2" -o "$1"
}

# train NAME DATA EPOCHS [OVERRIDES...]: one `tandem train`, measured as NAME.
train() {
    local name=$1 data=$2 epochs=$3
    shift 3
    step "$name" 120 "$tandem" train "${model[@]}" --set "data.path=\"$data\"" \
        --set "train.epochs=$epochs" "$@"
    py train "$meas" "$name" "$logs/$name.log" >/dev/null
}

# regimes NAME DIM FRACTIONS ROWS HOT: `tandem bench orchestration --regimes`, one
# bench per cache fraction (a slow fraction loses only its own regimes).
regimes() {
    local name=$1 dim=$2 fractions=$3 rows=$4 hot=$5 f
    : >"$logs/$name.jsonl"
    for f in ${fractions//,/ }; do
        step "$name-$f" 560 "$tandem" bench orchestration --regimes "${graph[@]}" \
            "${cfg[@]}" "${fast[@]}" --set "orchestration.hot_ratio=$hot" --epochs 2 \
            --dims "$dim" --cache-fractions "$f" --row-dtypes "$rows" --json "$logs/$name-$f.jsonl"
        [ ! -f "$logs/$name-$f.jsonl" ] || cat "$logs/$name-$f.jsonl" >>"$logs/$name.jsonl"
    done
    py regimes "$meas" "$name" "$logs/$name.jsonl" >/dev/null
}

# scale NAME ARGS...: `tandem bench scale`, measured as NAME.
scale() {
    local name=$1
    shift
    step "$name" 570 "$tandem" bench scale "$@" --set "device.kind=\"$DEVICE\"" \
        --set "orchestration.cpu_workers=$WORKERS" --json "$logs/$name.json"
    py scale "$meas" "$name" "$logs/$name.json" >/dev/null
    df -h "$WORK" | tail -1 | sed 's/^/   disk: /'
}

gpu_only() { # ID WHAT: true on CUDA, else records the skip
    [ "$DEVICE" = cuda ] && return 0
    skip "$1" "$2 needs a GPU (DEVICE=$DEVICE)"
    return 1
}

# The CUDA test binaries, with `--nocapture` so that a case that skipped itself
# (no GPU, no library) is counted, not taken for a pass.
cuda_tests() {
    local t
    for t in parity cuda_backend; do
        if [ ! -x "$BIN/$t" ]; then
            skip "$1.$t" "no $BIN/$t (bash bench/gpu/build.sh builds it)"
            continue
        fi
        local filter=()
        [ "$t" = parity ] && filter=(cuda::)
        [ "$DEVICE" = cuda ] || echo "   DEVICE=$DEVICE: the CUDA cases skip themselves here; the count of skips is recorded"
        step "$t" 150 "$BIN/$t" "${filter[@]}" --nocapture
        if [ "$t" = parity ]; then
            # The CUDA paths that had never run when these predictions were written.
            py tests "$meas" "$1.$t" "$logs/$t.log" download_pinned_orders_on_its_stream \
                top_layers_read_ahead_equal_hop_by_hop queued_hops_equal_sample_hop \
                adam_all_and_the_deferred_loss_match_the_single_ops >/dev/null
        else
            py tests "$meas" "$1.$t" "$logs/$t.log" >/dev/null
        fi
    done
}

# ncu NAME DATA SKIP COUNT [OVERRIDES...]: kernels of one epoch after SKIP launches.
ncu_window() {
    local name=$1 data=$2 skip_n=$3 count=$4
    shift 4
    gpu_only "$name.launches" "ncu" || return 0
    if [ ! -x /usr/local/cuda/bin/ncu ]; then
        skip "$name.launches" "no /usr/local/cuda/bin/ncu"
        return 0
    fi
    step "$name" 240 /usr/local/cuda/bin/ncu --clock-control none --metrics gpu__time_duration.sum \
        --launch-skip "$skip_n" --launch-count "$count" --print-summary per-kernel \
        "$tandem" train "${model[@]}" --set "data.path=\"$data\"" --set train.epochs=1 "$@"
    py ncu "$meas" "$name" "$logs/$name.log" >/dev/null
    gzip -f "$logs/$name.log"
}

# The PyTorch + PyG program (bench/peers/torch_gpu_train.py) on DATA's export.
peer() {
    local name=$1 data=$2
    if [ "$DEVICE" != cuda ]; then
        skip "$name.epoch_s" "the PyTorch + PyG program runs on CUDA only (DEVICE=$DEVICE)"
        return 0
    fi
    if ! python3 -c 'import torch, torch_geometric' 2>/dev/null; then
        skip "$name.epoch_s" "python3 cannot import torch and torch_geometric"
        return 0
    fi
    [ -d "$WORK/npy" ] || step export 120 "$tandem" export "$data" --format npy -o "$WORK/npy"
    PYTHONUNBUFFERED=1 step "$name" 180 python3 bench/peers/torch_gpu_train.py --data "$WORK/npy" --epochs 3
    py peer "$meas" "$name" "$logs/$name.log" >/dev/null
}

finish() {
    echo "wall=$((SECONDS - started))" >>"$OUT/header.txt"
    py table "$preds" "$OUT/record-part$part.md" "$OUT/header.txt" "$meas"
    echo "== part $part done in $((SECONDS - started)) s: $OUT/record-part$part.md"
    # The markdown table, to read in the command's output.
    cat "$OUT/record-part$part.md"
    [ -n "${KEEP_WORK:-}" ] || rm -rf "$WORK"
}

# ---------------------------------------------------------------- parts

part1() {
    cuda_tests p1
    # (b) the default products-scale run against the PyTorch + PyG program.
    local p="$WORK/products.tds" w="$WORK/wide.tds" c
    generate "$p" 100
    peer p1.peer "$p"
    train p1.default "$p" 3
    train p1.fp32 "$p" 3 --set model.precision='"fp32"'
    py ratio "$meas" p1.default.vs_peer p1.peer.epoch_s p1.default.epoch_s >/dev/null
    py ratio "$meas" p1.fp32.vs_peer p1.peer.epoch_s p1.fp32.epoch_s >/dev/null
    py delta "$meas" p1.tf32_acc_delta p1.default.test_acc p1.fp32.test_acc >/dev/null
    # (e) host synchronizations per 8 steady batches (trace counters), launches per batch (ncu).
    step p1.syncs 120 "$tandem" train "${model[@]}" --set "data.path=\"$p\"" --set train.epochs=2 \
        --trace "$logs/p1.syncs.trace.json"
    [ -f "$logs/p1.syncs.trace.json" ] && py syncs "$meas" p1.syncs "$logs/p1.syncs.trace.json" >/dev/null
    # The placement `auto` chooses here, spelled out: under `auto` the window can
    # fall in its calibration (a CPU-sampling candidate's batches, no sampling
    # kernels), as it did on 2026-11-28.
    ncu_window p1.ncu "$p" 3000 520 "${gsgg[@]}"
    # (c, d) 512 columns, bf16 rows, cache 250 MB and 0: the step-based placements
    # that gather on the device (the CPU-gather ones lose by 3x or more in every
    # measured regime; part 2's regime table runs all six), layer at hot 0.02 with
    # the default staleness bound and with bound 11, and `auto`.
    generate "$w" 512
    for c in 250 0; do
        local cb=$CACHE250 tag="p1.w512.c$c"
        [ "$c" = 0 ] && cb=0
        local common=(--set "device.cache_bytes=$cb" "${fast[@]}" "${bf16[@]}")
        train "$tag.gsgg" "$w" 2 "${common[@]}" "${gsgg[@]}"
        train "$tag.csgg" "$w" 2 "${common[@]}" "${csgg[@]}"
        train "$tag.layer" "$w" 2 "${common[@]}" "${layer[@]}" --set orchestration.hot_ratio=0.02
        train "$tag.layer_b11" "$w" 2 "${common[@]}" "${layer[@]}" --set orchestration.hot_ratio=0.02 \
            --set orchestration.staleness_bound=11
        train "$tag.auto" "$w" 2 "${common[@]}"
        py best "$meas" "$tag.best_step_s" "$tag.gsgg.epoch_s" "$tag.csgg.epoch_s" >/dev/null
        py best "$meas" "$tag.best_fixed_s" "$tag.gsgg.epoch_s" "$tag.csgg.epoch_s" "$tag.layer.epoch_s" >/dev/null
        py ratio "$meas" "$tag.layer_vs_best" "$tag.best_step_s" "$tag.layer.epoch_s" >/dev/null
        py ratio "$meas" "$tag.layer_b11_vs_best" "$tag.best_step_s" "$tag.layer_b11.epoch_s" >/dev/null
        py ratio "$meas" "$tag.auto_vs_best" "$tag.auto.epoch_s" "$tag.best_fixed_s" >/dev/null
        py delta "$meas" "$tag.layer_acc_delta" "$tag.layer.test_acc" "$tag.gsgg.test_acc" >/dev/null
    done
    # (e) the layer path's accelerator thread, traced: cache 0, the default bound.
    step p1.w512.trace 120 "$tandem" train "${model[@]}" --set "data.path=\"$w\"" --set train.epochs=2 \
        --set device.cache_bytes=0 "${fast[@]}" "${bf16[@]}" "${layer[@]}" \
        --set orchestration.hot_ratio=0.02 --trace "$logs/p1.w512.trace.json"
    [ -f "$logs/p1.w512.trace.json" ] && py layer-trace "$meas" p1.w512.trace "$logs/p1.w512.trace.json" >/dev/null
    gzip -f "$logs"/*.trace.json 2>/dev/null
}

part2() { regimes p2.regimes 512 0.05,0 bf16 0.02; }
part5() { regimes p5.regimes 512 0.05,0 f32 0.02; }
part6() { regimes p6.regimes 100 1,0.2,0.05,0 f32,bf16 0.05; }
part7() { regimes p7.regimes 512 1,0.2 f32,bf16 0.02; }

part3() {
    # fp32 rows, in memory (the arrays, ~70 GB, exceed the 64 GB disk; RAM holds
    # them once), topology and cache fitted to the free device memory.
    scale p3.scale "${PAPERS[@]}" --fit-device "${fast[@]}" "${gsgg[@]}"
}
part9() { scale p9.scale "${PAPERS[@]}" --fit-device "${fast[@]}" "${gsgg[@]}" "${bf16[@]}"; }
part10() { scale p10.scale "${HALF[@]}"; }
part11() {
    scale p11.scale "${HALF[@]}" --store "$WORK/half.tds" --fit-device "${fast[@]}" "${gsgg[@]}"
    rm -f "$WORK/half.tds"
}

part4() {
    local w="$WORK/wide.tds" v
    generate "$w" 512
    local common=(--set device.cache_bytes=0 "${fast[@]}" "${bf16[@]}" "${layer[@]}"
                  --set orchestration.hot_ratio=0.02)
    train p4.gsgg "$w" 2 --set device.cache_bytes=0 "${fast[@]}" "${bf16[@]}" "${gsgg[@]}"
    # Each variant traced: hot rows computed and carried, host synchronizations.
    for v in default super2 super2_b11 b11 lag1 pcie; do
        local extra=()
        case $v in
        super2) extra=(--set orchestration.super_batch=2) ;;
        super2_b11) extra=(--set orchestration.super_batch=2 --set orchestration.staleness_bound=11) ;;
        b11) extra=(--set orchestration.staleness_bound=11) ;;
        lag1) extra=(--set device.loss_lag=1) ;;
        pcie) extra=(--set orchestration.hotness='"pcie"') ;;
        esac
        train "p4.$v" "$w" 2 "${common[@]}" "${extra[@]}" --trace "$logs/p4.$v.trace.json"
        py ratio "$meas" "p4.$v.vs_gsgg" p4.gsgg.epoch_s "p4.$v.epoch_s" >/dev/null
        [ -f "$logs/p4.$v.trace.json" ] && py layer-trace "$meas" "p4.$v.trace" "$logs/p4.$v.trace.json" >/dev/null
        grep -m1 -E 'uses per computed row' "$logs/p4.$v.log" | sed 's/^/   /'
        gzip -f "$logs/p4.$v.trace.json" 2>/dev/null
    done
    # The CPU hot kernel on this machine's cores (one worker, and twelve).
    local hot_small=()
    [ "$SCALE" = full ] || hot_small=(--vertices 100000 --edges 1000000 --rows 5000 --reps 2)
    for v in "512 bf16" "100 f32"; do
        set -- $v
        for th in $(printf '%s\n' 1 "$WORKERS" | sort -un); do
            step "p4.hot$1.t$th" 120 "$tandem" bench hot --dim "$1" --dtype "$2" --threads "$th" "${hot_small[@]}"
            py hot "$meas" "p4.hot$1.t$th" "$logs/p4.hot$1.t$th.log" >/dev/null
        done
    done
}

part8() {
    local backend_small=() g
    [ "$SCALE" = full ] || backend_small=(--vertices 200000 --edges 2000000 --rows 50000 --gemm 20000,128,256 --batches 5)
    step p8.backend 120 "$tandem" bench backend --device "$DEVICE" "${backend_small[@]}"
    py backend "$meas" p8.backend "$logs/p8.backend.log" >/dev/null
    # The default run on the device and on the host (accuracy within 1 point).
    step p8.sbm 90 "$tandem" train --quiet-config --device "$DEVICE"
    py train "$meas" p8.sbm "$logs/p8.sbm.log" >/dev/null
    step p8.sbm_host 120 "$tandem" train --quiet-config --device host
    py train "$meas" p8.sbm_host "$logs/p8.sbm_host.log" >/dev/null
    py delta "$meas" p8.sbm.acc_delta p8.sbm.test_acc p8.sbm_host.test_acc >/dev/null
    # The GEMM paths (gpu_ops/src/cuda/gemm_lt.rs): parity, epochs, split-K launches.
    local p="$WORK/products.tds"
    if [ "$DEVICE" != cuda ]; then
        for g in cublas lt_inplace lt_nosplit; do
            skip "p8.gemm_$g.parity" "TANDEM_GEMM selects cuBLAS paths: needs a GPU (DEVICE=$DEVICE)"
        done
    else
        generate "$p" 100
        for g in cublas lt-inplace lt-nosplit; do
            local id="p8.gemm_${g//-/_}"
            TANDEM_GEMM=$g step "$id.parity" 150 "$BIN/parity" cuda:: --nocapture
            py tests "$meas" "$id.parity" "$logs/$id.parity.log" >/dev/null
            TANDEM_GEMM=$g train "$id" "$p" 3 "${fast[@]}" "${gsgg[@]}"
            TANDEM_GEMM=$g ncu_window "$id.ncu" "$p" 3000 170 "${fast[@]}" "${gsgg[@]}"
        done
    fi
    # The batch path as it was on 2026-11-26 (no sampling ahead, every loss read at
    # once), for the same machine's ratio.
    generate "$p" 100
    train p8.before "$p" 3 "${gsgg[@]}" --set device.sample_ahead=false --set device.loss_lag=1 \
        --set model.precision='"fp32"'
    # Without a libnccl.so, `dist.reduce = "nccl"` is a one-line error naming it.
    if gpu_only p8.nccl_error "NCCL"; then
        step p8.nccl_error 60 "$tandem" train --quiet-config --device cuda --set dist.reduce='"nccl"'
        if grep -q 'libnccl' "$logs/p8.nccl_error.log"; then
            py note "$meas" p8.nccl_error named "$(grep -m1 -i 'error' "$logs/p8.nccl_error.log" | cut -c1-150)" >/dev/null
        else
            py note "$meas" p8.nccl_error "not named" "$(tail -1 "$logs/p8.nccl_error.log" | cut -c1-150)" >/dev/null
        fi
    fi
    # NCCL on one rank, through the PyTorch environment's libnccl.so.2.
    if gpu_only p8.nccl "NCCL"; then
        local so2 link
        so2=$(python3 -c 'import glob, os, nvidia.nccl as n; print([f for d in n.__path__ for f in glob.glob(os.path.join(d, "lib", "libnccl.so*"))][0])' 2>/dev/null || true)
        if [ -z "$so2" ]; then
            skip p8.nccl "no libnccl.so* in python3's nvidia.nccl"
        else
            link=$(mktemp -d)
            ln -s "$so2" "$link/libnccl.so"
            LD_LIBRARY_PATH="$link:$LD_LIBRARY_PATH" TANDEM_REQUIRE_NCCL=1 \
                step p8.nccl 90 "$BIN/cuda_backend" --nocapture one_rank_nccl
            py tests "$meas" p8.nccl "$logs/p8.nccl.log" >/dev/null
        fi
    fi
}

part12() {
    # The products graph with 2% of its edges held out (1% validation, 1% test): an
    # epoch is every training edge once, ~49k batches of 1024 positives on the full
    # graph, so Tandem trains one epoch (its time then includes the first batches'
    # one-time costs, a few ms in ~90 s) and the peer times two epochs of
    # $LINKB batches each, extrapolated (the second one counts). Both evaluate once,
    # full-graph, against the same drawn negatives (bench/peers/link_common.py).
    local l="$WORK/products_link.tds" link=(--set model.task='"link"' --set train.eval_mode='"full"')
    [ -s "$l" ] || step generate-link 120 "$tandem" generate rmat "${graph[@]}" --dim 100 \
        --edge-split 0.98,0.01,0.01 -o "$l"
    if [ "$DEVICE" != cuda ]; then
        skip p12.peer.epoch_s "the PyTorch + PyG link program runs on CUDA only (DEVICE=$DEVICE)"
    elif ! python3 -c 'import torch, torch_geometric' 2>/dev/null; then
        skip p12.peer.epoch_s "python3 cannot import torch and torch_geometric"
    else
        step export-link 150 "$tandem" export "$l" --format npy -o "$WORK/npy_link"
        PYTHONUNBUFFERED=1 step p12.peer 240 python3 bench/peers/torch_gpu_link.py \
            --data "$WORK/npy_link" --fanouts 25,10,5 --hidden 256 --batch-size 1024 \
            --epochs 2 --max-batches "$LINKB"
        py peer-link "$meas" p12.peer "$logs/p12.peer.log" >/dev/null
        rm -rf "$WORK/npy_link"
    fi
    step p12.default 300 "$tandem" train "${model[@]}" --set "data.path=\"$l\"" --set train.epochs=1 \
        "${link[@]}"
    py train "$meas" p12.default "$logs/p12.default.log" >/dev/null
    py ratio "$meas" p12.default.vs_peer p12.peer.epoch_s p12.default.epoch_s >/dev/null
}

part13() {
    # `tandem bench loader`: batches/s of the device loader (DeviceLoader: each hop
    # sampled on the GPU, rows gathered through its feature cache, every batch's
    # event waited for) against the host loader (tandem.NeighborLoader's data path,
    # all cores) on the same seeds; fanouts [15,10,5], batch 1024. Once with the
    # loader's default cache (the whole matrix fits an H100/H200), once with none.
    local p="$WORK/products.tds" c
    generate "$p" 100
    for c in default 0; do
        local id=p13.loader cache=()
        [ "$c" = default ] || { id=p13.loader_nocache; cache=(--cache-bytes 0); }
        step "$id" 240 "$tandem" bench loader --device "$DEVICE" --dataset "$p" \
            --fanouts 15,10,5 --batch-size 1024 --batches "$LOADB" "${cache[@]}"
        py loader "$meas" "$id" "$logs/$id.log" >/dev/null
    done
    # From Python: the wheel build.sh made, unpacked onto PYTHONPATH (no pip, no network).
    gpu_only p13.check "the Python device loader" || return 0
    local whl
    whl=$(ls "$BIN"/tandem-*.whl 2>/dev/null | head -1)
    if [ -z "$whl" ]; then
        skip p13.check "no wheel in $BIN (bash bench/gpu/build.sh builds it)"
        return 0
    fi
    rm -rf "$WORK/py"
    python3 -m zipfile -e "$whl" "$WORK/py"
    PYTHONPATH="$WORK/py" step p13.check 150 python3 bench/gpu/device_loader_check.py 40
    if grep -q '^device loader check: ok' "$logs/p13.check.log"; then
        py note "$meas" p13.check ok "$(grep -m1 '^device loader check' "$logs/p13.check.log" | cut -c1-150)" >/dev/null
    else
        py note "$meas" p13.check failed "$(grep -m1 -E 'Error|assert' "$logs/p13.check.log" | cut -c1-150)" >/dev/null
    fi
    [ -d "$WORK/npy" ] || step export 120 "$tandem" export "$p" --format npy -o "$WORK/npy"
    PYTHONPATH="$WORK/py" PYTHONUNBUFFERED=1 step p13.pyg 300 python3 bench/peers/pyg_loader.py \
        --data "$WORK/npy" --device cuda --skip dgl --loader-seeds train --threads 16 \
        --epochs 3 --eval-fanouts 15,10,5 --eval-limit 20000 --json "$logs/p13.pyg.json"
    py pyg-loader "$meas" p13.pyg "$logs/p13.pyg.json" >/dev/null
}

"part$part"
finish
