#!/usr/bin/env bash
# BPE training, whole process, side by side in one run: tinylm vs Hugging Face
# `tokenizers` and `rustbpe` on the 40 MB concatenation of ../shared/data/*.txt at
# vocab 10,000 with <|endoftext|>; then tinylm alone on tinystories_combined.txt
# (vocab 10,000) and cs336/corpus.en (vocab 500). Prints wall time and peak RSS, the
# best of REPEAT runs (default 3), and tinylm's time as a fraction of rustbpe's.
#
#   PYTHON=/work/benchenv/bin/python bench/bpe_train.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
REPEAT=${REPEAT:-3}
DATA=${DATA:-../shared/data}

cargo build --release -q -p tinylm-cli
TINYLM=target/release/tinylm
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cat "$DATA"/*.txt > "$TMP/mix.txt"

# measure NAME CMD...: best wall time and its peak RSS over REPEAT runs -> "seconds MiB".
measure() {
    local best="" rss=""
    for _ in $(seq "$REPEAT"); do
        if ! /usr/bin/time -f "%e %M" -o "$TMP/time" "$@" > "$TMP/log" 2>&1; then
            cat "$TMP/log" >&2
            return 1
        fi
        read -r t kb < "$TMP/time"
        if [ -z "$best" ] || awk "BEGIN{exit !($t < $best)}"; then best=$t; rss=$((kb / 1024)); fi
    done
    echo "$best $rss"
}

TRAIN=("$TINYLM" bpe train --special-token '<|endoftext|>' --out "$TMP/tok")

printf "machine: %s, %s cores; best of %s runs\n" "$(uname -m)" "$(nproc)" "$REPEAT"
printf "%-40s %-12s %10s %10s\n" "corpus (vocab)" "trainer" "wall s" "peak MiB"
mix="40 MB mix ($(($(stat -c %s "$TMP/mix.txt") / 1000000)) MB, 10000)"
r=$(measure "${TRAIN[@]}" --input "$TMP/mix.txt" --vocab-size 10000)
read -r t_tinylm m_tinylm <<< "$r"
printf "%-40s %-12s %10s %10s\n" "$mix" tinylm "$t_tinylm" "$m_tinylm"
r=$(measure "$PYTHON" bench/bpe_train_ref.py rustbpe "$TMP/mix.txt" 10000)
read -r t_rust m_rust <<< "$r"
printf "%-40s %-12s %10s %10s\n" "$mix" rustbpe "$t_rust" "$m_rust"
r=$(measure "$PYTHON" bench/bpe_train_ref.py hf "$TMP/mix.txt" 10000)
read -r t_hf m_hf <<< "$r"
printf "%-40s %-12s %10s %10s\n" "$mix" "HF tokenizers" "$t_hf" "$m_hf"
for spec in "tinystories_combined.txt 10000" "cs336/corpus.en 500"; do
    set -- $spec
    r=$(measure "${TRAIN[@]}" --input "$DATA/$1" --vocab-size "$2")
    read -r t m <<< "$r"
    printf "%-40s %-12s %10s %10s\n" "$1 ($2)" tinylm "$t" "$m"
done
awk "BEGIN{printf \"tinylm / rustbpe = %.2f, tinylm / HF = %.2f (target: <= 0.50 of rustbpe)\n\", $t_tinylm/$t_rust, $t_tinylm/$t_hf}"
