#!/usr/bin/env bash
# BPE training, whole process, side by side in one run: tinylm vs Hugging Face
# `tokenizers` and `rustbpe` on the 40 MB concatenation of ../shared/data/*.txt at
# vocab 10,000 with <|endoftext|>; then tinylm alone on tinystories_combined.txt
# (vocab 10,000) and cs336/corpus.en (vocab 500). Prints wall time, CPU time and peak RSS
# (the best of REPEAT runs, default 3) and tinylm's times as fractions of the others'.
#
#   PYTHON=.venv-bench/bin/python bench/bpe_train.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
REPEAT=${REPEAT:-3}
DATA=${DATA:-../shared/data}

cargo build --release -q -p tinylm-cli
TINYLM=${CARGO_TARGET_DIR:-target}/release/tinylm
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cat "$DATA"/*.txt > "$TMP/mix.txt"

# measure CMD...: the best wall time over REPEAT runs, with that run's CPU time
# (user + system) and peak RSS -> "wall_s cpu_s MiB".
measure() {
    local best="" cpu="" rss=""
    for _ in $(seq "$REPEAT"); do
        if ! /usr/bin/time -f "%e %U %S %M" -o "$TMP/time" "$@" > "$TMP/log" 2>&1; then
            cat "$TMP/log" >&2
            return 1
        fi
        read -r t user sys kb < "$TMP/time"
        if [ -z "$best" ] || awk "BEGIN{exit !($t < $best)}"; then
            best=$t cpu=$(awk "BEGIN{print $user + $sys}") rss=$((kb / 1024))
        fi
    done
    echo "$best $cpu $rss"
}

TRAIN=("$TINYLM" bpe train --special-token '<|endoftext|>' --out "$TMP/tok")

printf "machine: %s, %s cores; best of %s runs\n" "$(uname -m)" "$(nproc)" "$REPEAT"
row() { printf "%-36s %-14s %8s %8s %9s\n" "$@"; }
row "corpus (vocab)" trainer "wall s" "CPU s" "peak MiB"
mix="data/*.txt, $(($(stat -c %s "$TMP/mix.txt") / 1000000)) MB (10000)"
r=$(measure "${TRAIN[@]}" --input "$TMP/mix.txt" --vocab-size 10000)
read -r t_tinylm c_tinylm m <<< "$r"
row "$mix" tinylm "$t_tinylm" "$c_tinylm" "$m"
r=$(measure "$PYTHON" bench/bpe_train_ref.py rustbpe "$TMP/mix.txt" 10000)
read -r t_rust c_rust m <<< "$r"
row "$mix" rustbpe "$t_rust" "$c_rust" "$m"
r=$(measure "$PYTHON" bench/bpe_train_ref.py hf "$TMP/mix.txt" 10000)
read -r t_hf c_hf m <<< "$r"
row "$mix" "HF tokenizers" "$t_hf" "$c_hf" "$m"
for spec in "tinystories_combined.txt 10000" "cs336/corpus.en 500"; do
    set -- $spec
    r=$(measure "${TRAIN[@]}" --input "$DATA/$1" --vocab-size "$2")
    read -r t c m <<< "$r"
    row "$1 ($2)" tinylm "$t" "$c" "$m"
done
awk "BEGIN{printf \"wall: tinylm / rustbpe = %.2f (target <= 0.50), tinylm / HF = %.2f; CPU: %.2f and %.2f\n\", \
    $t_tinylm/$t_rust, $t_tinylm/$t_hf, $c_tinylm/$c_rust, $c_tinylm/$c_hf}"
