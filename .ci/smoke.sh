#!/usr/bin/env bash
# The release binary's smoke path — BPE training, encoding, a few training steps,
# evaluation, greedy generation — on a generated corpus, printing one figure per line
# (`name value`, into OUT_DIR/figures.txt) so that runs on different CPUs can be compared (`.ci/smoke.sh compare`);
# in fp32 (`--precision fp32`): `auto` would pick bf16 on CPUs with native bf16 products only.
#
#   .ci/smoke.sh run OUT_DIR [RUNNER ...] -- BINARY   e.g. RUNNER = qemu-x86_64 -cpu Haswell
#   .ci/smoke.sh compare TOLERANCE A.txt B.txt        losses within TOLERANCE (relative), text equal
set -euo pipefail

if [ "${1:-}" = compare ]; then
    tolerance=$2
    a=$3
    b=$4
    # Losses within the relative tolerance; everything else (ISA aside) exactly equal.
    paste -d' ' "$a" "$b" | awk -v tol="$tolerance" -v a="$a" -v b="$b" '
        $1 != $3 { print "smoke compare: line " NR " is " $1 " in " a " but " $3 " in " b; bad = 1; next }
        $1 == "isa" { next }
        $1 ~ /loss|norm/ {
            d = $2 - $4; if (d < 0) d = -d
            m = $2 < 0 ? -$2 : $2
            if (d > tol * m) { print "smoke compare: " $1 " " $2 " (" a ") vs " $4 " (" b ")"; bad = 1 }
            next
        }
        $2 != $4 { print "smoke compare: " $1 " differs: " $2 " vs " $4; bad = 1 }
        END { exit bad }'
    lines_a=$(wc -l < "$a")
    lines_b=$(wc -l < "$b")
    [ "$lines_a" = "$lines_b" ] || { echo "smoke compare: $lines_a lines in $a, $lines_b in $b"; exit 1; }
    echo "smoke compare: $a and $b agree ($lines_a figures, losses within $tolerance)"
    exit 0
fi

[ "${1:-}" = run ] || { echo "usage: $0 run OUT_DIR [RUNNER ...] -- BINARY | $0 compare TOL A B" >&2; exit 2; }
out=$2
shift 2
runner=()
while [ "$1" != -- ]; do
    runner+=("$1")
    shift
done
tinylm=("${runner[@]}" "$2")
rm -rf "$out"
mkdir -p "$out"

# A small corpus of repeated sentences in documents, generated (no data files).
for i in $(seq 200); do
    echo "once upon a time a little cat named tom $((i % 7)) found a red ball in the garden."
    echo "the dog and the cat played together all day, and they were happy $((i % 5))."
    echo "<|endoftext|>"
done > "$out/corpus.txt"
head -n 60 "$out/corpus.txt" > "$out/val.txt"

# Runs a command with its stderr in a log; on failure shows the log and stops.
logged() {
    local log=$1
    shift
    "$@" 2> "$log" || { echo "smoke: failed: $* (log $log):" >&2; cat "$log" >&2; exit 1; }
}

logged "$out/bpe.log" "${tinylm[@]}" bpe train --input "$out/corpus.txt" --vocab-size 320 \
    --special-token '<|endoftext|>' --out "$out/tok" --threads 2
logged "$out/encode.log" "${tinylm[@]}" bpe encode --tokenizer "$out/tok" \
    --input "$out/corpus.txt" --out "$out/train.npy" --threads 2
logged "$out/encode_val.log" "${tinylm[@]}" bpe encode --tokenizer "$out/tok" \
    --input "$out/val.txt" --out "$out/val.npy" --threads 1
logged "$out/train.log" "${tinylm[@]}" train --train-data "$out/train.npy" \
    --val-data "$out/val.npy" --tokenizer "$out/tok" --out-dir "$out/run" --vocab-size 320 \
    --context-length 32 --d-model 32 --num-layers 2 --num-heads 4 --d-ff 96 --batch-size 4 \
    --steps 24 --lr-max 1e-2 --lr-min 1e-3 --warmup-steps 2 --eval-interval 12 \
    --eval-batches 0 --log-interval 1 --seed 0 --threads 2 --precision fp32 > /dev/null
logged "$out/eval.log" "${tinylm[@]}" eval --checkpoint "$out/run/checkpoint.safetensors" \
    --data "$out/val.npy" --threads 2 --precision fp32 > "$out/eval.txt"
logged "$out/generate.log" "${tinylm[@]}" generate \
    --checkpoint "$out/run/checkpoint.safetensors" --prompt "once upon" --max-tokens 24 \
    --temperature 0 --threads 2 --precision fp32 > "$out/generate.txt"
logged "$out/bench.log" "${tinylm[@]}" bench --vocab-size 64 --context-length 8 --d-model 16 \
    --num-layers 1 --num-heads 2 --d-ff 32 --batch-size 1 --steps 1 --threads 1 --no-peak --precision fp32 \
    > "$out/bench.txt"

# The figures: merges, token counts, per-step losses and gradient norms (compared
# with a relative tolerance), final evaluation, generated text.
{
    echo "isa $(sed -n 's/^matrix products: gemm.s \(.*\) kernels.*/\1/p' "$out/bench.txt" | tr ' ' _)"
    echo "merges $(($(wc -l < "$out/tok/merges.txt")))"
    echo "train_bytes $(wc -c < "$out/train.npy")"
    echo "val_bytes $(wc -c < "$out/val.npy")"
    sed -n 's/.*"step":\([0-9]*\),.*"train_loss":\([-0-9.e]*\).*/step\1_train_loss \2/p' "$out/run/log.jsonl"
    sed -n 's/.*"step":\([0-9]*\),.*"val_loss":\([-0-9.e][-0-9.e]*\).*/step\1_val_loss \2/p' "$out/run/log.jsonl"
    sed -n 's/.*"step":\([0-9]*\),.*"grad_norm":\([-0-9.e]*\).*/step\1_grad_norm \2/p' "$out/run/log.jsonl"
    sed -n 's/.*val_loss \([-0-9.e]*\).*/eval_loss \1/p' "$out/eval.txt"
    echo "generated $(tr -s ' \n\t' '___' < "$out/generate.txt")"
} > "$out/figures.txt"
