#!/usr/bin/env bash
# Encoding with GPT-2's tokenizer, side by side in one run: tinylm (1 thread, the
# parallel file encoder on 2 threads, the streaming encoder) vs Python tiktoken
# (gpt2, single thread) and Hugging Face tokenizers (single thread, TinyStories only:
# it runs at ~1 MB/s), on tinystories_combined.txt and on the 40 MB concatenation of
# ../shared/data/*.txt, with <|endoftext|> as a special token everywhere. Every id
# array is compared with tiktoken's. Prints, best of REPEAT runs (default 3): the
# encode throughput (the encode call alone, as each tool reports it), the whole
# process (start, load the tokenizer, read, encode, write the .npy) and its peak RSS.
#
#   PYTHON=.venv-bench/bin/python bench/encode.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
REPEAT=${REPEAT:-3}
DATA=${DATA:-../shared/data}
VOCAB=$DATA/cs336/gpt2_vocab.json
MERGES=$DATA/cs336/gpt2_merges.txt

cargo build --release -q -p tinylm-cli
TINYLM=${CARGO_TARGET_DIR:-target}/release/tinylm
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cat "$DATA"/*.txt > "$TMP/mix.txt"
: > "$TMP/empty.txt"

# measure OUT.npy BYTES CMD...: runs CMD REPEAT times; prints
# "best-encode-MB/s best-wall-s best-cpu-s peak-KiB" (CPU = user + system, steadier than
# wall time on a shared machine).
# The encode MB/s comes from CMD's own report: tinylm's "(N MB/s)", or encode_ref.py's seconds.
measure() {
    local out=$1 bytes=$2
    shift 2
    local best_t="" best_cpu="" best_mbs=0 rss=0
    for _ in $(seq "$REPEAT"); do
        if ! /usr/bin/time -f "%e %M %U %S" -o "$TMP/time" "$@" > "$TMP/log" 2>&1; then
            cat "$TMP/log" >&2
            return 1
        fi
        read -r t kb user sys < "$TMP/time"
        local mbs cpu
        cpu=$(awk "BEGIN{printf \"%.2f\", $user + $sys}")
        if [ -z "$best_cpu" ] || awk "BEGIN{exit !($cpu < $best_cpu)}"; then best_cpu=$cpu; fi
        mbs=$(sed -n 's/.*(\([0-9.]*\) MB\/s).*/\1/p' "$TMP/log")
        if [ -z "$mbs" ]; then
            mbs=$(awk -v b="$bytes" 'NR==1 {printf "%.1f", b / 1e6 / $1}' "$TMP/log")
        fi
        if [ -z "$best_t" ] || awk "BEGIN{exit !($t < $best_t)}"; then best_t=$t; fi
        if awk "BEGIN{exit !($mbs > $best_mbs)}"; then best_mbs=$mbs; fi
        if [ "$kb" -gt "$rss" ]; then rss=$kb; fi
    done
    echo "$best_mbs $best_t $best_cpu $rss"
}

row() { # corpus encoder threads bytes out.npy CMD...
    local corpus=$1 name=$2 threads=$3 bytes=$4 out=$5
    shift 5
    read -r mbs t cpu rss < <(measure "$out" "$bytes" "$@")
    local same="-"
    if [ -f "$TMP/tiktoken.npy" ]; then same=$("$PYTHON" bench/encode_ref.py same "$TMP/tiktoken.npy" "$out"); fi
    local whole
    whole=$(awk -v b="$bytes" -v t="$t" 'BEGIN {printf "%.1f", b / 1e6 / t}')
    printf "| %-22s | %-24s | %7s | %10s | %8s | %10s | %6s | %8s | %-4s |\n" "$corpus" "$name" "$threads" "$mbs" "$t" "$whole" "$cpu" "$((rss / 1024))" "$same"
    echo "$mbs $rss $cpu $t" > "$TMP/last"
}

printf "machine: %s, %s cores, %s; best of %s runs\n\n" "$(uname -m)" "$(nproc)" \
    "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)" "$REPEAT"
printf "| %-22s | %-24s | %7s | %10s | %8s | %10s | %6s | %8s | %-4s |\n" corpus encoder threads "encode MB/s" "wall s" "wall MB/s" "CPU s" "peak MiB" "ids = tiktoken"
printf "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n"
for corpus in tinystories_combined.txt mix; do
    if [ "$corpus" = mix ]; then input=$TMP/mix.txt; label="40 MB mix"; else input=$DATA/$corpus; label=$corpus; fi
    bytes=$(stat -c %s "$input")
    rm -f "$TMP/tiktoken.npy"
    row "$label" "tiktoken (Python)" 1 "$bytes" "$TMP/tt.npy" \
        "$PYTHON" bench/encode_ref.py tiktoken "$VOCAB" "$MERGES" "$input" "$TMP/tt.npy"
    mv "$TMP/tt.npy" "$TMP/tiktoken.npy"
    read -r tiktoken_mbs _ tiktoken_cpu tiktoken_t < "$TMP/last"
    if [ "$corpus" != mix ]; then
        row "$label" "HF tokenizers (Python)" 1 "$bytes" "$TMP/hf.npy" \
            "$PYTHON" bench/encode_ref.py hf "$VOCAB" "$MERGES" "$input" "$TMP/hf.npy"
    fi
    ENCODE=("$TINYLM" bpe encode --vocab "$VOCAB" --merges "$MERGES" --input "$input")
    row "$label" "tinylm" 1 "$bytes" "$TMP/t1.npy" "${ENCODE[@]}" --out "$TMP/t1.npy" --threads 1
    read -r one_mbs _ one_cpu one_t < "$TMP/last"
    row "$label" "tinylm" 2 "$bytes" "$TMP/t2.npy" "${ENCODE[@]}" --out "$TMP/t2.npy" --threads 2
    read -r two_mbs _ < "$TMP/last"
    row "$label" "tinylm --stream" 1 "$bytes" "$TMP/ts.npy" "${ENCODE[@]}" --out "$TMP/ts.npy" --stream
    read -r _ stream_kib _ _ < "$TMP/last"
    ratios+=("$label: tinylm 1 thread vs tiktoken: encode $(awk "BEGIN{printf \"%.1f\", $one_mbs / $tiktoken_mbs}")x, whole process $(awk "BEGIN{printf \"%.1f\", $tiktoken_t / $one_t}")x (CPU $(awk "BEGIN{printf \"%.1f\", $tiktoken_cpu / $one_cpu}")x); tinylm 2 threads / 1 thread: encode $(awk "BEGIN{printf \"%.2f\", $two_mbs / $one_mbs}")x")
done
read -r _ _ _ base < <(measure "$TMP/e.npy" 1 "$TINYLM" bpe encode --vocab "$VOCAB" --merges "$MERGES" --input "$TMP/empty.txt" --out "$TMP/e.npy" --stream)
echo
printf "%s\n" "${ratios[@]}"
echo "tinylm --stream peak RSS: $stream_kib KiB on the 40 MB mix, $base KiB on an empty input (process + tokenizer): the streaming encoder adds $((stream_kib - base)) KiB"
