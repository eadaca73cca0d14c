#!/usr/bin/env bash
# `tinylm export` against the tools it targets, on a model trained here for a few
# steps (untied and tied embeddings): transformers' logits and tokenizer, llama.cpp's
# logits and tokenizer (llama-cpp-python, built from source by pip) on the f32 GGUF
# (and printed for the f16, bf16 and q8_0 ones), each GGUF file read back by the
# `gguf` package. See bench/export_check.py.
#
#   python3 -m venv .venv-bench && .venv-bench/bin/pip install -r bench/requirements.txt
#   PYTHON=.venv-bench/bin/python bench/export_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
DATA=${DATA:-../shared/data}
THREADS=${THREADS:-2}

cargo build --release -q -p tinylm-cli
TINYLM=$(realpath "${CARGO_TARGET_DIR:-target}")/release/tinylm
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# A tokenizer (vocab 1024) and tokens from TinyStories.
head -c 2000000 "$DATA/tinystories_combined.txt" > "$TMP/corpus.txt"
"$TINYLM" bpe train --input "$TMP/corpus.txt" --vocab-size 1024 \
    --special-token '<|endoftext|>' --out "$TMP/tok" 2> /dev/null
"$TINYLM" bpe encode --tokenizer "$TMP/tok" --input "$TMP/corpus.txt" --out "$TMP/train.npy" 2> /dev/null
# Real text with special tokens for the tokenizer check: TinyStories stories joined by
# <|endoftext|>, and prose of another kind (Sherlock Holmes, war and peace).
"$PYTHON" - "$DATA" "$TMP/text.txt" <<'PY'
import sys
data, out = sys.argv[1], sys.argv[2]
read = lambda name: open(f"{data}/{name}", encoding="utf-8").read()
parts = [read("tinystories_v1_valid_head_794k.txt")[-30000:],
         read("gutenberg_sherlock_holmes_adventures.txt")[:30000],
         read("wikitext2_test.txt")[:30000]]
open(out, "w", encoding="utf-8").write("<|endoftext|>".join(parts))
PY
"$TINYLM" bpe encode --tokenizer "$TMP/tok" --input "$TMP/text.txt" --out "$TMP/text.npy" 2> /dev/null
"$PYTHON" -c "
import numpy as np, sys
ids = np.load('$TMP/train.npy')[:4 * 128].astype(np.int64).reshape(4, 128)
np.save('$TMP/ids.npy', ids)
"

for tie in false true; do
    run="$TMP/run-$tie"
    echo "== model: 4 layers, d_model 128, 4 heads, d_ff 352, context 128, tie_embeddings $tie"
    "$TINYLM" train --train-data "$TMP/train.npy" --val-data "$TMP/train.npy" --tokenizer "$TMP/tok" \
        --out-dir "$run" --vocab-size 1024 --context-length 128 --d-model 128 --num-layers 4 \
        --num-heads 4 --d-ff 352 --tie-embeddings "$tie" --batch-size 16 --steps 150 \
        --lr-max 3e-3 --warmup-steps 10 --eval-interval 0 --eval-batches 4 --threads "$THREADS" \
        > /dev/null 2>&1
    "$TINYLM" export hf --checkpoint "$run/checkpoint.safetensors" --out "$run/hf"
    ggufs=()
    for dtype in f32 f16 bf16 q8_0; do
        "$TINYLM" export gguf --checkpoint "$run/checkpoint.safetensors" --out "$run/model-$dtype.gguf" \
            --dtype "$dtype"
        ggufs+=(--gguf "$dtype=$run/model-$dtype.gguf")
    done
    "$TINYLM" forward --weights "$run/checkpoint.safetensors" --input "$TMP/ids.npy" \
        --logits-out "$run/logits.npy" --threads "$THREADS"
    "$PYTHON" bench/export_check.py --hf "$run/hf" "${ggufs[@]}" \
        --checkpoint "$run/checkpoint.safetensors" --ids "$TMP/ids.npy" --logits "$run/logits.npy" \
        --text "$TMP/text.txt" --text-ids "$TMP/text.npy" --threads "$THREADS" ${CHECK_ARGS:-}
done
