#!/usr/bin/env bash
# Link prediction: Tandem's CPU trainer against DGL 1.1.3 (bench/peers/dgl_link.py)
# on the SBM link set, same model, fanouts, negatives, epochs and lr, ranked against
# identical evaluation negatives; both back to back in one run, 2 threads each.
# Prints each side's mean epoch time (training loop only, epochs 1..), the ratio and
# the final test metrics.
#
#   PY=/work/venv-dgl/bin/python bench/peers/link_compare.sh DATA_DIR [NAME]
#
# DATA_DIR holds NAME.tds and NAME_npy/ (NAME defaults to sbm_link; the commands
# are at the top of bench/configs/sbm_link.toml). Env: TANDEM (default target/release/tandem), PY
# (default python3: the DGL venv's, see bench/peers/README.md), EPOCHS (default 5),
# EVAL (1: evaluate every epoch; default 0: only after the last), KEEP (a folder to
# keep the logs in; default: a temporary one, removed).
set -euo pipefail
cd "$(dirname "$0")/../.."
data="${1:?usage: link_compare.sh DATA_DIR [NAME] (DATA_DIR holding NAME.tds and NAME_npy/)}"
name="${2:-sbm_link}"
TANDEM="${TANDEM:-target/release/tandem}"
PY="${PY:-python3}"
E="${EPOCHS:-5}"
EVAL="${EVAL:-0}"
cfg=bench/configs/sbm_link.toml
[ -s "$data/$name.tds" ] || { echo "no $data/$name.tds (see $cfg)" >&2; exit 2; }
[ -d "$data/${name}_npy" ] || { echo "no $data/${name}_npy (see $cfg)" >&2; exit 2; }
if [ -n "${KEEP:-}" ]; then out="$KEEP"; mkdir -p "$out"; else out="$(mktemp -d)"; fi
every=0
[ "$EVAL" = 1 ] && every=1
# CPU seconds (user + system) of each whole run (setup, the epochs, the evaluations):
# the work each did, which other jobs on the machine change less than wall time.
TIMEFORMAT="# cpu %U %S wall %R"
echo "# load before: $(cut -d' ' -f1-3 /proc/loadavg)"
{ time "$TANDEM" train --config "$cfg" --quiet-config \
  --set "data.path=\"$data/$name.tds\"" --set "train.epochs=$E" --set "train.eval_every=$every" \
  2>&1 | tee "$out/tandem.log" ; } 2> "$out/tandem.time"
echo "# load between: $(cut -d' ' -f1-3 /proc/loadavg)"
{ time "$PY" bench/peers/dgl_link.py --data "$data/${name}_npy" --layers 2 --hidden 128 \
  --fanouts 10,10 --batch-size 1024 --negatives 1 --lr 0.003 --dropout 0.5 \
  --epochs "$E" --eval-every "$every" --eval-negatives 100 --seed 0 --threads 2 \
  --json "$out/dgl.json" 2>&1 | tee "$out/dgl.log" ; } 2> "$out/dgl.time"
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
t=$(sed -n 's/.*mean epoch time \([0-9.]*\) s.*/\1/p' "$out/tandem.log")
d=$(sed -n 's/.*mean epoch (train only, excl. epoch 0): \([0-9.]*\)s.*/\1/p' "$out/dgl.log")
tm=$(grep -E '^ +test: ' "$out/tandem.log" | tail -1 | sed 's/^ *test: //')
dm=$(sed -n 's/.*final test \(.*\); best val.*/\1/p' "$out/dgl.log")
awk -v t="$t" -v d="$d" -v n="$name" 'BEGIN {
  printf "%s: mean epoch time tandem %.3f s, dgl %.3f s, dgl/tandem = %.2fx\n", n, t, d, d / t }'
echo "$name: final test: tandem $tm; dgl $dm"
awk -v n="$name" '/^# cpu/ { c[FILENAME] = $3 + $4; w[FILENAME] = $6 }
  END { for (f in c) if (f ~ /tandem/) { tc = c[f]; tw = w[f] } else { dc = c[f]; dw = w[f] }
        printf "%s: whole runs: tandem %.1f cpu-s (%.1f s wall), dgl %.1f cpu-s (%.1f s wall), cpu dgl/tandem = %.2fx\n",
          n, tc, tw, dc, dw, dc / tc }' "$out/tandem.time" "$out/dgl.time"
[ -n "${KEEP:-}" ] || rm -rf "$out"
