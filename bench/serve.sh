#!/usr/bin/env bash
# `tinylm serve` under load (bench/serve.py): the total tokens/s of CLIENTS
# streaming clients at once (default 8) against one client, same requests, and
# the time to the first streamed token on an idle server against `tinylm
# generate`'s prompt time, in alternating rounds (ROUNDS, default 3), on two
# models: the quickstart's (2.6M parameters, trained for MINUTES, default 0.5)
# and a ~95M-parameter one (GPT-2 small's shape, d_ff 2,304, the quickstart's
# 2,048-token vocabulary, context 256, one training step: its weights are all
# but random, which costs the same time). Each model's run names the CPU and
# the machine's load first. PRECISION (fp32, bf16 or auto, the default) is the
# server's and `tinylm generate`'s.
#
#   bench/serve.sh                       # all cores
#   THREADS=2 CLIENTS=8 bench/serve.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
CLIENTS=${CLIENTS:-8}
MAX_TOKENS=${MAX_TOKENS:-64}
MINUTES=${MINUTES:-0.5}
THREADS=${THREADS:-0}
PRECISION=${PRECISION:-auto}

cargo build --release -q -p tinylm-cli
TINYLM=${CARGO_TARGET_DIR:-target}/release/tinylm
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

echo "== making the models"
"$TINYLM" quickstart --minutes "$MINUTES" --out "$TMP/qs" --threads "$THREADS" > "$TMP/qs.log" 2>&1
"$TINYLM" train --train-data "$TMP/qs/train.npy" --tokenizer "$TMP/qs/tokenizer" \
    --out-dir "$TMP/m95" --preset gpt2-small --d-ff 2304 --vocab-size 2048 \
    --context-length 256 --steps 1 --eval-interval 0 --threads "$THREADS" > "$TMP/m95.log" 2>&1

for model in qs m95; do
    checkpoint="$TMP/$model/checkpoint.safetensors"
    python3 -c 'import json, sys; print("== model:", json.load(open(sys.argv[1]))["model"])' \
        "$TMP/$model/config.json"
    python3 bench/serve.py "$TINYLM" "$checkpoint" --clients "$CLIENTS" \
        --max-tokens "$MAX_TOKENS" --rounds "$ROUNDS" --threads "$THREADS" --precision "$PRECISION"
done
