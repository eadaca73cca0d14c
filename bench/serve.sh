#!/usr/bin/env bash
# `tinylm serve` against llama.cpp's `llama-server` on the same weights, side by side
# in one run (bench/serve.py): f32, bf16 and q8_0, on the 134M model and the
# quickstart's (made by bench/llama.sh, shared with bench/generate.sh), CLIENTS
# streaming clients (default 8) and one, greedy, MAX_TOKENS tokens each (default
# 96), THREADS threads each (default 2), best of ROUNDS alternating rounds
# (default 3); beside them tinylm with --api-key while /metrics is read once a
# second. The prompt of each request is a number and the start of the TinyStories
# validation text (62 tokens, or fewer where the context would not hold them and
# the new tokens: 24 for the quickstart's). The run names the CPU, its load and
# the commit.
#
# llama-server is built (bench/llama.sh) from the sources that llama-cpp-python
# ships on PyPI (the version in bench/requirements.txt), once, into WORK (default
# target/bench-generate, shared with bench/generate.sh, with the models).
#
#   python3 -m venv .venv-bench && .venv-bench/bin/pip install -r bench/requirements.txt
#   PYTHON=.venv-bench/bin/python bench/serve.sh
#   MODELS=quickstart PRECISIONS=f32 ROUNDS=5 PYTHON=.venv-bench/bin/python bench/serve.sh
#
# GUARDS_ONLY=1: tinylm with and without --api-key and /metrics alone (no
# llama-server), each round's ratio and their median: the guards' cost.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
DATA=${DATA:-../shared/data}
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-2}
CLIENTS=${CLIENTS:-8}
MAX_TOKENS=${MAX_TOKENS:-96}
MODELS=${MODELS:-134m quickstart}
PRECISIONS=${PRECISIONS:-f32,bf16,q8_0}
WORK=${WORK:-target/bench-generate}
PROMPT_TOKENS=62

cargo build --release -q -p tinylm-cli
TINYLM=$(realpath "${CARGO_TARGET_DIR:-target}")/release/tinylm
mkdir -p "$WORK"
WORK=$(realpath "$WORK")

. bench/llama.sh
llama_build llama-server

specs=()
for model in $MODELS; do
    bench_model "$model"
    # The prompt and the new tokens fit the context (the quickstart's: 24 + 96 of 128).
    tokens=$((MODEL_CONTEXT - MAX_TOKENS - 8 < PROMPT_TOKENS ? MODEL_CONTEXT - MAX_TOKENS - 8 : PROMPT_TOKENS))
    prompt_of "$MODEL_TOK" "$MODEL_DIR/serve-prompt.txt" 0 "$tokens"
    specs+=(--model "$model:$MODEL_DIR/run/checkpoint.safetensors:$MODEL_DIR/weights-bf16.safetensors:$MODEL_DIR/model:$MODEL_DIR/serve-prompt.txt:$MODEL_CONTEXT:$MODEL_DESC")
done

describe_machine
echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- crates || echo ' (with changes)')"
echo "llama-server: $("$LLAMA_BIN/llama-server" --version 2>&1 | grep -m1 version) (llama-cpp-python $llama_version's sources)"
"$PYTHON" bench/serve.py --tinylm "$TINYLM" --llama-server "$LLAMA_BIN/llama-server" \
    --rounds "$ROUNDS" --threads "$THREADS" --clients "$CLIENTS" --max-tokens "$MAX_TOKENS" \
    --precisions "$PRECISIONS" ${GUARDS_ONLY:+--guards-only} "${specs[@]}"
