#!/usr/bin/env bash
# tinylm vs PyTorch, the same training run: `tinylm quickstart` trains for MINUTES on
# 2 threads (tokenizer, encoding, last 5% of the stories held out for validation),
# then bench/torch_train.py repeats exactly its steps (same initial weights, batches,
# AdamW, schedule, clipping, validation windows) in PyTorch, eager and torch.compile,
# on 2 threads. Prints each run's steps, wall-clock, training tokens/s and validation
# losses, the wall-clock each needs to reach a common validation loss, and draws all
# loss curves on one SVG.
#
#   PYTHON=.venv-bench/bin/python bench/train_compare.sh [MINUTES] [OUT_DIR]
#
# CORPUS overrides the corpus (default ../shared/data/tinystories_combined.txt);
# VARIANTS the PyTorch variants (default "eager compile"); QUICKSTART_ARGS extra
# quickstart flags (e.g. "--model-config bench-small.json --vocab-size 4096", the file
# written by `tinylm info --preset bench-small --print-config`).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
MINUTES=${1:-2}
OUT=${2:-runs/train-compare-$(date -u +%Y%m%d-%H%M%S)}
CORPUS=${CORPUS:-../shared/data/tinystories_combined.txt}
VARIANTS=${VARIANTS:-eager compile}
read -r -a QUICKSTART_EXTRA <<< "${QUICKSTART_ARGS:-}"

cargo build --release -q -p tinylm-cli
mkdir -p "$OUT"
echo "== tinylm quickstart ($MINUTES min, 2 threads) -> $OUT/tinylm"
"${CARGO_TARGET_DIR:-target}"/release/tinylm quickstart --corpus "$CORPUS" --minutes "$MINUTES" --threads 2 \
    --save-init --out "$OUT/tinylm" "${QUICKSTART_EXTRA[@]}" | tee "$OUT/tinylm.txt"
tinylm_val=$(sed -n 's/.*validation loss \([0-9.]*\),.*/\1/p' "$OUT/tinylm.txt")
runs=("tinylm=$OUT/tinylm/log.jsonl:$tinylm_val")
for variant in $VARIANTS; do
    echo "== PyTorch $variant (2 threads) -> $OUT/torch-$variant"
    "$PYTHON" bench/torch_train.py --run "$OUT/tinylm" --variant "$variant" --threads 2 \
        --out "$OUT/torch-$variant" | tee "$OUT/torch-$variant.json"
    val=$("$PYTHON" -c 'import json,sys; print(json.load(open(sys.argv[1]))["val_loss_all"])' "$OUT/torch-$variant.json")
    runs+=("torch-$variant=$OUT/torch-$variant/log.jsonl:$val")
done
echo "== comparison (load average: $(cut -d' ' -f1-3 /proc/loadavg))"
"$PYTHON" bench/train_compare.py --plot "$OUT/loss_compare.svg" "${runs[@]}" | tee "$OUT/summary.txt"
