#!/usr/bin/env bash
# BPE training under the GPT-4 split pattern, whole process, side by side in one run:
# tinylm `--pattern gpt4` vs rustbpe and Hugging Face `tokenizers` (both given tiktoken's
# cl100k_base pattern, the one tinylm's gpt4 is), plus tinylm `--pattern gpt2` to show the
# default did not regress. Vocabulary VOCAB (default 32,000) with <|endoftext|>.
#
# Corpora, generated into a temp dir (nothing committed):
#   mix  the concatenation of ../shared/data/*.txt (39.9 MB).
#   big  COPIES (default 6) repetitions of the mix, 239 MB: in repetition r
#        (0-based) the mix's blocks between blank lines ("\n\n") are shuffled with
#        Python's random.Random(r) and joined again by "\n\n", and each repetition ends
#        with <|endoftext|>. So no two repetitions are the same text, but the pre-token
#        counts are about COPIES times the mix's (only the words at block edges change):
#        it measures the counting pass at 6x the bytes with about the same merge work.
# Trainers:
#   tinylm gpt4 / gpt2   target/release/tinylm bpe train --pattern gpt4|gpt2
#   rustbpe              bench/bpe_train_ref.py --pattern gpt4 rustbpe: the documents
#                        between <|endoftext|> markers, streamed and cut into ~64 KiB
#                        pieces at exact pre-token boundaries (documents() there: the
#                        mix's documents are whole books), pattern passed explicitly (rustbpe's own default is close to cl100k's but not it);
#                        vocabulary VOCAB - 1 as it has no special token: the same merges
#   HF tokenizers        bench/bpe_train_ref.py --pattern gpt4 hf: BpeTrainer with
#                        Sequence[Split(Regex(cl100k), "isolated"), ByteLevel(use_regex=False)]
#                        on the same documents
# and, on the mix only, tinylm gpt2 at vocabulary 10,000 (docs/performance.md's setting).
# (The merges themselves: bench/bpe_merges_cmp.py compares tinylm's with rustbpe's.)
#
# Each round runs every trainer once, the order reversed every other round; a trainer's
# figures are its best wall time over REPEAT rounds (default 3; REPEAT_BIG for the big
# corpus, default REPEAT) with that run's CPU time (user + system) and peak RSS, from
# /usr/bin/time -f "%e %U %S %M". Then tinylm gpt4's ratios to the references.
#
#   PYTHON=.venv-bench/bin/python bench/bpe_patterns.sh
#   REPEAT_BIG=2 PYTHON=... bench/bpe_patterns.sh      # BIG=0 skips the big corpus
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
REPEAT=${REPEAT:-3}
REPEAT_BIG=${REPEAT_BIG:-$REPEAT}
VOCAB=${VOCAB:-32000}
COPIES=${COPIES:-6}
BIG=${BIG:-1}
DATA=${DATA:-../shared/data}

cargo build --release -q -p tinylm-cli
TINYLM=${CARGO_TARGET_DIR:-target}/release/tinylm
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cat "$DATA"/*.txt > "$TMP/mix.txt"

# The command line of trainer NAME on corpus FILE.
command_of() {
    local name=$1 file=$2
    local train=("$TINYLM" bpe train --input "$file" --special-token '<|endoftext|>' --out "$TMP/tok")
    case $name in
        tinylm-gpt4) echo "${train[@]@Q}" --vocab-size "$VOCAB" --pattern gpt4 ;;
        tinylm-gpt2) echo "${train[@]@Q}" --vocab-size "$VOCAB" --pattern gpt2 ;;
        tinylm-gpt2-10k) echo "${train[@]@Q}" --vocab-size 10000 --pattern gpt2 ;;
        rustbpe) echo "$PYTHON" bench/bpe_train_ref.py --pattern gpt4 rustbpe "${file@Q}" $((VOCAB - 1)) ;;
        hf) echo "$PYTHON" bench/bpe_train_ref.py --pattern gpt4 hf "${file@Q}" "$VOCAB" ;;
    esac
}

declare -A WALL CPU RSS
# run_once NAME FILE: one timed run; keeps the best wall time (with its CPU and RSS).
run_once() {
    local name=$1 file=$2 t user sys kb
    if ! eval "/usr/bin/time -f '%e %U %S %M' -o '$TMP/time' $(command_of "$name" "$file")" \
        > "$TMP/log" 2>&1; then
        echo "$name failed:" >&2
        cat "$TMP/log" >&2
        return 1
    fi
    read -r t user sys kb < "$TMP/time"
    echo "  $name $(basename "$file"): $t s wall, $user + $sys s CPU, $((kb / 1024)) MiB" >&2
    if [ -z "${WALL[$name]:-}" ] || awk "BEGIN{exit !($t < ${WALL[$name]})}"; then
        WALL[$name]=$t CPU[$name]=$(awk "BEGIN{print $user + $sys}") RSS[$name]=$((kb / 1024))
    fi
}

# bench FILE ROUNDS NAME...: ROUNDS rounds, every other one in reverse order.
bench() {
    local file=$1 rounds=$2 r i
    shift 2
    local names=("$@")
    WALL=() CPU=() RSS=()
    for r in $(seq "$rounds"); do
        if [ $((r % 2)) -eq 1 ]; then
            for i in "${!names[@]}"; do run_once "${names[$i]}" "$file"; done
        else
            for ((i = ${#names[@]} - 1; i >= 0; i--)); do run_once "${names[$i]}" "$file"; done
        fi
    done
}

label() {
    case $1 in
        tinylm-gpt4) echo "**tinylm** | gpt4 | $VOCAB" ;;
        tinylm-gpt2) echo "tinylm | gpt2 | $VOCAB" ;;
        tinylm-gpt2-10k) echo "tinylm | gpt2 | 10000" ;;
        rustbpe) echo "rustbpe $("$PYTHON" -c 'import importlib.metadata as m; print(m.version("rustbpe"))') | gpt4 (cl100k) | $VOCAB" ;;
        hf) echo "HF tokenizers $("$PYTHON" -c 'import tokenizers; print(tokenizers.__version__)') | gpt4 (cl100k) | $VOCAB" ;;
    esac
}

ROWS=() RATIOS=()
# report CORPUS_LABEL NAME...: table rows, then tinylm gpt4's ratios.
report() {
    local corpus=$1 name
    shift
    for name in "$@"; do
        ROWS+=("| $corpus | $(label "$name") | ${WALL[$name]} | ${CPU[$name]} | ${RSS[$name]} |")
    done
    RATIOS+=("$(awk -v c="$corpus" \
        -v tw="${WALL[tinylm-gpt4]}" -v tc="${CPU[tinylm-gpt4]}" -v tm="${RSS[tinylm-gpt4]}" \
        -v rw="${WALL[rustbpe]}" -v rc="${CPU[rustbpe]}" -v rm="${RSS[rustbpe]}" \
        -v hw="${WALL[hf]}" -v hc="${CPU[hf]}" -v hm="${RSS[hf]}" 'BEGIN{
        printf "%s: tinylm gpt4 / rustbpe: wall %.3f (target <= 0.25, %s), peak %.3f (target <= 0.5, %s), CPU %.3f;", \
            c, tw/rw, (tw/rw <= 0.25 ? "met" : "MISSED"), tm/rm, (tm/rm <= 0.5 ? "met" : "MISSED"), tc/rc
        printf " tinylm gpt4 / HF: wall %.3f, peak %.3f, CPU %.3f\n", tw/hw, tm/hm, tc/hc }')")
}

mb() { echo $(($(stat -c %s "$1") / 1000000)); }
bench "$TMP/mix.txt" "$REPEAT" tinylm-gpt4 rustbpe hf tinylm-gpt2 tinylm-gpt2-10k
report "data/*.txt, $(mb "$TMP/mix.txt") MB" tinylm-gpt4 rustbpe hf tinylm-gpt2 tinylm-gpt2-10k
if [ "$BIG" = 1 ]; then
    "$PYTHON" - "$TMP/mix.txt" "$TMP/big.txt" "$COPIES" <<'EOF'
import random, sys
src, dst, copies = sys.argv[1], sys.argv[2], int(sys.argv[3])
with open(src, encoding="utf-8") as f:
    blocks = f.read().split("\n\n")
with open(dst, "w", encoding="utf-8") as f:
    for r in range(copies):
        order = blocks[:]
        random.Random(r).shuffle(order)
        f.write("\n\n".join(order))
        f.write("<|endoftext|>")
EOF
    bench "$TMP/big.txt" "$REPEAT_BIG" tinylm-gpt4 rustbpe hf tinylm-gpt2
    report "mix x$COPIES shuffled, $(mb "$TMP/big.txt") MB" tinylm-gpt4 rustbpe hf tinylm-gpt2
fi

printf "CPU: %s; %s cores; load average before: %s; best of %s runs (big corpus: %s)\n\n" \
    "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')" "$(nproc)" \
    "$LOAD0" "$REPEAT" "$REPEAT_BIG"
echo "| corpus | trainer | pattern | vocab | wall s | CPU s | peak MiB |"
echo "| --- | --- | --- | ---: | ---: | ---: | ---: |"
printf "%s\n" "${ROWS[@]}"
echo
printf "%s\n" "${RATIOS[@]}"
