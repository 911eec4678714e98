#!/usr/bin/env bash
# Issue 12's GPU validation (docs/gpu-validation.md item 13): NCCL from Rust.
#
# Here (x86-64, with the Rust toolchain):
#   bash bench/gpu/issue10.sh build        # release tandem + parity/cuda_backend binaries in .gpu/
# Then one device `run`, carrying `.gpu`:
#   bash bench/gpu/issue12.sh nccl         # a one-rank NCCL communicator on the GPU
# Outputs go under $OUT (or ./gpu-out when $OUT is unset).
set -euo pipefail
cd "$(dirname "$0")/../.."
part="${1:?usage: issue12.sh nccl}"
out="${OUT:-gpu-out}"
mkdir -p "$out"
bin=.gpu
cuda_lib=/usr/local/cuda-13.0/targets/x86_64-linux/lib
export LD_LIBRARY_PATH="$cuda_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

case "$part" in
nccl)
    # PyTorch's environment ships NCCL as nvidia-nccl-cu13 with only
    # libnccl.so.2; cudarc loads libnccl.so, so link it in a directory of our own.
    so2=$(python3 - <<'PY'
import glob, os
import nvidia.nccl as n
for d in n.__path__:
    for f in glob.glob(os.path.join(d, "lib", "libnccl.so*")):
        print(f)
        raise SystemExit
PY
)
    link=$(mktemp -d)
    ln -s "$so2" "$link/libnccl.so"
    echo "NCCL: $so2" | tee "$out/nccl.txt"
    LD_LIBRARY_PATH="$link:$LD_LIBRARY_PATH" TANDEM_REQUIRE_NCCL=1 \
        "$bin/cuda_backend" --nocapture one_rank_nccl 2>&1 | tail -8 | tee -a "$out/nccl.txt"
    # Without the link the error names what is missing (one line).
    "$bin/tandem" train --device cuda --set dist.reduce='"nccl"' 2>&1 | tail -2 |
        tee -a "$out/nccl.txt" || true
    ;;
*)
    echo "unknown part: $part" >&2
    exit 2
    ;;
esac
