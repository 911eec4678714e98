#!/usr/bin/env bash
# Epoch time of Tandem's CPU trainer against DGL 1.1.3 on the same data and
# configuration, measured back to back in one run; prints both and the ratio.
#
#   bench/peers/compare.sh wordnet-sage   DATA_DIR
#   bench/peers/compare.sh wordnet-gcn    DATA_DIR
#   bench/peers/compare.sh rmat1m-sage    DATA_DIR
#
# DATA_DIR holds wordnet.tds + wordnet_npy/ (tandem import wordnet; tandem export)
# or rmat1m.tds + rmat1m_npy/ (see bench/configs/rmat1m_sage.toml for the command).
# Env: TANDEM (default target/release/tandem), PY (default python3 of the DGL venv,
# see bench/peers/README.md), EPOCHS (default 11 for WordNet, 3 for rmat1m).
# Both use 2 threads and time the training loop only (sampling, gather, forward,
# backward, step), mean over epochs 1.. (epoch 0 excluded).
set -euo pipefail
cd "$(dirname "$0")/../.."
case_name="${1:?usage: compare.sh wordnet-sage|wordnet-gcn|rmat1m-sage DATA_DIR}"
data="${2:?usage: compare.sh CASE DATA_DIR}"
TANDEM="${TANDEM:-target/release/tandem}"
PY="${PY:-python3}"
case "$case_name" in
  wordnet-sage|wordnet-gcn)
    m="${case_name#wordnet-}"; ds=wordnet; layers=2; fan=10,10; E="${EPOCHS:-11}"
    cfg="bench/configs/wordnet_${m}.toml" ;;
  rmat1m-sage)
    m=sage; ds=rmat1m; layers=3; fan=25,10,5; E="${EPOCHS:-3}"
    cfg="bench/configs/rmat1m_sage.toml" ;;
  *) echo "unknown case $case_name" >&2; exit 2 ;;
esac
out="$(mktemp -d)"
"$TANDEM" train --config "$cfg" --quiet-config \
  --set "data.path=\"$data/$ds.tds\"" --set "train.epochs=$E" --set train.eval_every=0 \
  --set train.eval_mode=\"full\" \
  | tee "$out/tandem.log"
"$PY" bench/peers/dgl_train.py --data "$data/${ds}_npy" --model "$m" --layers "$layers" \
  --hidden 256 --fanouts "$fan" --batch-size 1024 --lr 0.003 --dropout 0.5 \
  --epochs "$E" --eval-every 0 --seed 0 --threads 2 --json "$out/dgl.json" \
  | tee "$out/dgl.log"
t=$(sed -n 's/.*mean epoch time \([0-9.]*\) s.*/\1/p' "$out/tandem.log")
d=$(sed -n 's/.*mean epoch (train only, excl. epoch 0): \([0-9.]*\)s.*/\1/p' "$out/dgl.log")
awk -v t="$t" -v d="$d" -v c="$case_name" 'BEGIN {
  printf "%s: mean epoch time tandem %.3f s, dgl %.3f s, dgl/tandem = %.2fx\n", c, t, d, d / t }'
rm -rf "$out"
