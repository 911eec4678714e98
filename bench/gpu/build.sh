#!/usr/bin/env bash
# Builds what bench/gpu/verify.sh runs on a GPU machine, which has no Rust toolchain:
# the release `tandem`, the gpu_ops test binaries `parity` and `cuda_backend` and the
# Python package's wheel, stripped, into bench/gpu/bin/ (git-ignored, ~20 MB: carry it
# to the device), with
# bench/gpu/bin/BUILD naming the commit they were built from.
#
#   bash bench/gpu/build.sh
#
# The CUDA libraries are loaded at run time (cudarc's dynamic loading), so nothing
# CUDA is needed here; the GPU machine's are in /usr/local/cuda-13.0/targets/
# x86_64-linux/lib, which verify.sh puts on LD_LIBRARY_PATH.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=bench/gpu/bin
mkdir -p "$bin"

cargo build --release -p runtime --bin tandem
cp target/release/tandem "$bin/tandem.tmp"
mv "$bin/tandem.tmp" "$bin/tandem"
for t in parity cuda_backend; do
    # cargo prints `Executable tests/<t>.rs (target/release/deps/<t>-<hash>)`.
    exe=$(cargo test --release -p gpu_ops --test "$t" --no-run 2>&1 |
        sed -n "s/.*Executable .*(\(target\/release\/deps\/$t-[0-9a-f]*\)).*/\1/p" | tail -1)
    if [ -z "$exe" ] || [ ! -x "$exe" ]; then
        echo "build.sh: cargo test --no-run printed no executable for gpu_ops test $t" >&2
        exit 1
    fi
    cp "$exe" "$bin/$t.tmp"
    mv "$bin/$t.tmp" "$bin/$t"
done
strip "$bin/tandem" "$bin/parity" "$bin/cuda_backend"

# The Python package as a wheel (abi3: any CPython from 3.9), for part 13. The GPU
# machine has no network: verify.sh unpacks it (a wheel is a zip) onto PYTHONPATH.
wheel_venv=$(mktemp -d)
python3 -m venv "$wheel_venv/venv"
"$wheel_venv/venv/bin/pip" install --quiet maturin
rm -f "$bin"/tandem-*.whl
"$wheel_venv/venv/bin/maturin" build --release --strip --compatibility linux \
    -m python/Cargo.toml -o "$bin"
rm -rf "$wheel_venv"

commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
dirty=$(git status --porcelain --untracked-files=no 2>/dev/null | grep -c . || true)
echo "$commit$([ "$dirty" -eq 0 ] || echo " + $dirty changed files"), built $(date -u +%FT%TZ) with $(rustc --version)" \
    >"$bin/BUILD"
ls -la "$bin"
du -sh "$bin"
