#!/usr/bin/env bash
# Encoding under the GPT-4 split pattern, side by side in one run: tinylm vs Python tiktoken
# on the same ranks and the same pattern, on tinystories_combined.txt and on the 40 MB
# concatenation of ../shared/data/*.txt, with <|endoftext|> as a special token everywhere.
#
# Tokenizers:
#   cl100k   the published cl100k_base ranks, as the Rust crate tiktoken-rs 0.12.1 ships them
#            (~/.cargo/registry/src/*/tiktoken-rs-0.12.1/assets/cl100k_base.tiktoken).
#            tiktoken: tiktoken.Encoding with openai_public.cl100k_base()'s pattern and
#            special tokens (<|endoftext|> = 100257), ranks loaded from that file.
#            tinylm: bpe encode --tiktoken FILE --pattern gpt4 --special-token '<|endoftext|>=100257'.
#   o200k    the same for o200k_base (--pattern o200k, <|endoftext|> = 199999); O200K=0 skips it.
#   tl32k    a 32,000-token tokenizer trained here by tinylm on the mix (bpe train --pattern
#            gpt4 --special-token '<|endoftext|>'), exported with `bpe export --format
#            tiktoken`; tiktoken: that file's ranks, cl100k's pattern, <|endoftext|> at its
#            tinylm id; tinylm: bpe encode --tokenizer DIR --pattern gpt4.
# Encoders (rows):
#   tiktoken 1     enc.encode(text, allowed_special={"<|endoftext|>"}), one thread.
#   tiktoken all   how tiktoken parallelizes: the text split at <|endoftext|> into documents,
#                  enc.encode_batch(docs, num_threads=os.cpu_count(), ...), the results joined
#                  with <|endoftext|>'s id between them (split + batch + join timed). Its
#                  parallelism is the documents': only tinystories_combined.txt has
#                  <|endoftext|>, so the mix is 5,809 documents of which the first is 31.8 MB
#                  (every file before tinystories_combined.txt) and the last 3.2 MB.
#   tinylm 1       bpe encode --threads 1.
#   tinylm all     bpe encode with its default threads (all cores; it cuts the text itself).
# Every id array is compared with tiktoken 1's (bench/encode_ref.py same).
#
# Each round runs the four encoders once, the order reversed every other round (the machine
# is shared and noisy); an encoder's figures are, over REPEAT rounds (default 3): the best
# encode throughput (the encode call alone, as each tool reports it), the best whole-process
# wall time and CPU time (user + system; start, load the ranks, read, encode, write the
# .npy) and the largest peak RSS, from /usr/bin/time -f "%e %M %U %S". Then tinylm's ratios
# to tiktoken at one thread and at all threads (target >= 2x), and tinylm at all threads
# against the faster of tiktoken's two rows (its batch can be slower than one thread).
#
#   PYTHON=/work/venv-bench/bin/python bench/encode_patterns.sh
#   REPEAT=5 O200K=0 PYTHON=... bench/encode_patterns.sh
#   ENCODERS="tiktoken-1 tinylm-1" PYTHON=... bench/encode_patterns.sh   # some rows only
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
REPEAT=${REPEAT:-3}
O200K=${O200K:-1}
DATA=${DATA:-../shared/data}
ASSETS=$(ls -d ~/.cargo/registry/src/*/tiktoken-rs-0.12.1/assets | head -1)
[ -n "$ASSETS" ] || { echo "tiktoken-rs-0.12.1's assets not found under ~/.cargo/registry/src" >&2; exit 1; }

cargo build --release -q -p tinylm-cli
TINYLM=${CARGO_TARGET_DIR:-target}/release/tinylm
LOAD0=$(cut -d' ' -f1-3 /proc/loadavg)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cat "$DATA"/*.txt > "$TMP/mix.txt"

# The 32k tokenizer: trained once on the mix, exported for tiktoken.
"$TINYLM" bpe train --input "$TMP/mix.txt" --vocab-size 32000 --special-token '<|endoftext|>' \
    --pattern gpt4 --out "$TMP/tl32k" 2> "$TMP/train.log" || { cat "$TMP/train.log" >&2; exit 1; }
TRAIN_LINE=$(tail -1 "$TMP/train.log")
"$TINYLM" bpe export --tokenizer "$TMP/tl32k" --format tiktoken --out "$TMP/tl32k.tiktoken" > "$TMP/export.log" 2>&1 \
    || { cat "$TMP/export.log" >&2; exit 1; }
TL32K_EOT=$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1], encoding="utf-8"))["<|endoftext|>"])' "$TMP/tl32k/vocab.json")

TOKENIZERS=(cl100k)
[ "$O200K" = 1 ] && TOKENIZERS+=(o200k)
TOKENIZERS+=(tl32k)
ENCODERS=(${ENCODERS:-tiktoken-1 tiktoken-all tinylm-1 tinylm-all})

# command_of TOKENIZER ENCODER INPUT OUT: the command line.
command_of() {
    local tok=$1 enc=$2 input=$3 out=$4 tt tl
    case $tok in
        cl100k) tt=(cl100k_base "$ASSETS/cl100k_base.tiktoken")
                tl=(--tiktoken "$ASSETS/cl100k_base.tiktoken" --pattern gpt4 --special-token '<|endoftext|>=100257') ;;
        o200k)  tt=(o200k_base "$ASSETS/o200k_base.tiktoken")
                tl=(--tiktoken "$ASSETS/o200k_base.tiktoken" --pattern o200k --special-token '<|endoftext|>=199999') ;;
        tl32k)  tt=(cl100k_base "$TMP/tl32k.tiktoken")
                tl=(--tokenizer "$TMP/tl32k" --pattern gpt4) ;;
    esac
    local ref=("$PYTHON" bench/encode_ref.py tiktoken-ranks "${tt[@]}" "$input" "$out")
    local ours=("$TINYLM" bpe encode "${tl[@]}" --input "$input" --out "$out")
    case $enc in
        tiktoken-1) echo "${ref[@]@Q}" 1 ;;
        tiktoken-all) echo "${ref[@]@Q}" all ;;
        tinylm-1) echo "${ours[@]@Q}" --threads 1 ;;
        tinylm-all) echo "${ours[@]@Q}" ;;
    esac
    [ "$tok" = tl32k ] && [[ $enc == tiktoken-* ]] && echo "$TL32K_EOT"
    return 0
}

declare -A MBS WALL CPU RSS
# run_once TOKENIZER ENCODER INPUT: one timed run, keeping the best figures.
run_once() {
    local tok=$1 enc=$2 input=$3 key="$1 $2" t kb user sys mbs cpu bytes
    bytes=$(stat -c %s "$input")
    if ! eval "/usr/bin/time -f '%e %M %U %S' -o '$TMP/time' $(command_of "$tok" "$enc" "$input" "$TMP/$tok-$enc.npy" | tr '\n' ' ')" \
        > "$TMP/log" 2>&1; then
        echo "$key failed:" >&2
        cat "$TMP/log" >&2
        return 1
    fi
    read -r t kb user sys < "$TMP/time"
    cpu=$(awk "BEGIN{printf \"%.2f\", $user + $sys}")
    # tinylm reports "(N MB/s)"; encode_ref.py prints the encode call's seconds first.
    mbs=$(sed -n 's/.*(\([0-9.]*\) MB\/s).*/\1/p' "$TMP/log")
    [ -n "$mbs" ] || mbs=$(awk -v b="$bytes" 'NR==1 {printf "%.1f", b / 1e6 / $1}' "$TMP/log")
    echo "  $key $(basename "$input"): encode $mbs MB/s, $t s wall, $cpu s CPU, $((kb / 1024)) MiB" >&2
    if [ -z "${WALL[$key]:-}" ] || awk "BEGIN{exit !($t < ${WALL[$key]})}"; then WALL[$key]=$t; fi
    if [ -z "${CPU[$key]:-}" ] || awk "BEGIN{exit !($cpu < ${CPU[$key]})}"; then CPU[$key]=$cpu; fi
    if [ -z "${MBS[$key]:-}" ] || awk "BEGIN{exit !($mbs > ${MBS[$key]})}"; then MBS[$key]=$mbs; fi
    if [ -z "${RSS[$key]:-}" ] || [ "$kb" -gt "${RSS[$key]}" ]; then RSS[$key]=$kb; fi
}

ROWS=() RATIOS=() SAME_ALL=yes
for corpus in tinystories_combined.txt mix; do
    if [ "$corpus" = mix ]; then input=$TMP/mix.txt; label="data/*.txt, $(awk -v b="$(stat -c %s "$input")" 'BEGIN{printf "%.1f", b / 1e6}') MB"
    else input=$DATA/$corpus; label=$corpus; fi
    bytes=$(stat -c %s "$input")
    for tok in "${TOKENIZERS[@]}"; do
        MBS=() WALL=() CPU=() RSS=()
        for r in $(seq "$REPEAT"); do
            if [ $((r % 2)) -eq 1 ]; then
                for enc in "${ENCODERS[@]}"; do run_once "$tok" "$enc" "$input"; done
            else
                for ((i = ${#ENCODERS[@]} - 1; i >= 0; i--)); do run_once "$tok" "${ENCODERS[$i]}" "$input"; done
            fi
        done
        for enc in "${ENCODERS[@]}"; do
            key="$tok $enc" same="(reference)"
            if [ "$enc" != tiktoken-1 ]; then
                same=$("$PYTHON" bench/encode_ref.py same "$TMP/$tok-tiktoken-1.npy" "$TMP/$tok-$enc.npy")
                [ "$same" = yes ] || SAME_ALL=no
            fi
            case $enc in *-1) threads=1 ;; *) threads="all ($(nproc))" ;; esac
            ROWS+=("$(printf "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" "$label" "$tok" "${enc%-*}" "$threads" \
                "${MBS[$key]}" "${WALL[$key]}" "$(awk -v b="$bytes" -v t="${WALL[$key]}" 'BEGIN {printf "%.1f", b / 1e6 / t}')" \
                "${CPU[$key]}" "$((RSS[$key] / 1024))" "$same")")
        done
        [ -n "${MBS[$tok tinylm-1]:-}" ] && RATIOS+=("$(awk -v c="$label" -v k="$tok" \
            -v m1="${MBS[$tok tinylm-1]}" -v r1="${MBS[$tok tiktoken-1]}" -v w1="${WALL[$tok tinylm-1]}" -v q1="${WALL[$tok tiktoken-1]}" \
            -v mn="${MBS[$tok tinylm-all]}" -v rn="${MBS[$tok tiktoken-all]}" -v wn="${WALL[$tok tinylm-all]}" -v qn="${WALL[$tok tiktoken-all]}" 'BEGIN{
            rb = (r1 > rn ? r1 : rn); qb = (q1 < qn ? q1 : qn)
            printf "%s, %s: tinylm / tiktoken encode MB/s at 1 thread %.2fx (%s), at all threads %.2fx (%s), tinylm all / tiktoken best %.2fx; whole process (tiktoken wall / tinylm wall) %.2fx, %.2fx, best / best %.2fx\n", \
                c, k, m1/r1, (m1/r1 >= 2 ? "target 2x met" : "target 2x MISSED"), mn/rn, (mn/rn >= 2 ? "target 2x met" : "target 2x MISSED"), mn/rb, q1/w1, qn/wn, qb/wn }')")
    done
done

printf "CPU: %s; %s cores; load average before: %s; best of %s runs; tiktoken %s (Python %s), tinylm %s\n" \
    "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //')" "$(nproc)" "$LOAD0" "$REPEAT" \
    "$("$PYTHON" -c 'import tiktoken; print(tiktoken.__version__)')" "$("$PYTHON" -c 'import platform; print(platform.python_version())')" \
    "$(git rev-parse --short HEAD)"
echo "tl32k: $TRAIN_LINE"
echo "tiktoken all threads = encode_batch over the documents between <|endoftext|> (tiktoken's own parallelism), joined with its id"
echo
echo "| corpus | tokenizer | encoder | threads | encode MB/s | wall s | wall MB/s | CPU s | peak MiB | ids = tiktoken 1 |"
echo "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |"
printf "%s\n" "${ROWS[@]}"
echo
printf "%s\n" "${RATIOS[@]}"
echo "all id arrays equal to tiktoken's: $SAME_ALL"
