#!/usr/bin/env bash
# Generation against llama.cpp on the same weights, side by side in one run
# (bench/generate_compare.py): `tinylm generate` on a checkpoint (f32, bf16, q8_0)
# and on its `tinylm export weights` file in bf16, and llama.cpp's
# `llama-completion` on that checkpoint's `tinylm export gguf` files (f32, bf16,
# q8_0), greedy, a 62-token prompt,
# 2 threads, alternating for ROUNDS rounds (default 3): time to the first new token
# (whole process), load time, prompt and generation tokens/s, and the bytes of
# weights each generation reads a second beside the machine's read bandwidth
# (bench/read_bandwidth.c, measured in every round). The prompt is taken
# from the TinyStories validation text, from the first paragraph on which tinylm
# continues for all the new tokens without ending the story.
#
# Models (MODELS, default "134m quickstart"):
# - 134m: d_model 768, 12 layers, 12 heads, d_ff 2048, vocabulary 32,000 (a BPE
#   tokenizer trained on all of DATA's text), context 512; its weights are the
#   initial ones after one training step (speed does not depend on them);
#   256 new tokens;
# - quickstart: `tinylm quickstart --minutes 0.5` (d_model 192, 4 layers, d_ff 512,
#   vocabulary 2,048, context 128); 66 new tokens, which fill its context.
#
# llama.cpp is built here (CMake, GGML_NATIVE) from the sources that llama-cpp-python
# ships on PyPI (the version in bench/requirements.txt), once, into WORK (default
# target/bench-generate, kept between runs with the models).
#
#   python3 -m venv .venv-bench && .venv-bench/bin/pip install -r bench/requirements.txt
#   PYTHON=.venv-bench/bin/python bench/generate.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
DATA=${DATA:-../shared/data}
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-2}
MODELS=${MODELS:-134m quickstart}
WORK=${WORK:-target/bench-generate}
PROMPT_TOKENS=62

cargo build --release -q -p tinylm-cli
TINYLM=$(realpath "${CARGO_TARGET_DIR:-target}")/release/tinylm
mkdir -p "$WORK"
WORK=$(realpath "$WORK")

# llama.cpp from llama-cpp-python's source distribution (vendor/llama.cpp).
version=$(sed -n 's/^llama-cpp-python==//p' bench/requirements.txt)
llama_dir="$WORK/llama.cpp-$version"
LLAMA_COMPLETION="$llama_dir/build/bin/llama-completion"
if [ ! -x "$LLAMA_COMPLETION" ]; then
    echo "== building llama.cpp from llama-cpp-python $version's sources (a few minutes)"
    rm -rf "$llama_dir" && mkdir -p "$llama_dir"
    "$PYTHON" -m pip download --quiet --no-deps --no-binary llama-cpp-python \
        "llama-cpp-python==$version" -d "$llama_dir"
    tar xzf "$llama_dir/llama_cpp_python-$version.tar.gz" -C "$llama_dir"
    src="$llama_dir/llama_cpp_python-$version/vendor/llama.cpp"
    cmake=$(command -v "$(dirname "$PYTHON")/cmake" || command -v cmake)
    "$cmake" -S "$src" -B "$llama_dir/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_SERVER=OFF > "$llama_dir/cmake.log"
    "$cmake" --build "$llama_dir/build" -j "$(nproc)" --target llama-completion > "$llama_dir/build.log"
fi

# prompt_of TOKENIZER OUT PARAGRAPH: the shortest start of the validation text from
# paragraph number PARAGRAPH on whose encoding is PROMPT_TOKENS tokens (a decoded
# prefix of its ids, re-encoded).
prompt_of() {
    local tok=$1 out=$2 paragraph=$3 tmp
    tmp=$(mktemp -d)
    "$PYTHON" -c 'import sys; i = int(sys.argv[2]); print("\n\n".join(open(sys.argv[1], encoding="utf-8").read().split("\n\n")[i:i + 8]).strip(), end="")' \
        "$DATA/tinystories_v1_valid_head_794k.txt" "$paragraph" > "$tmp/story.txt"
    "$TINYLM" bpe encode --tokenizer "$tok" --input "$tmp/story.txt" --out "$tmp/story.npy" 2> /dev/null
    for n in $(seq "$PROMPT_TOKENS" $((PROMPT_TOKENS + 8))); do
        "$PYTHON" -c 'import numpy as np, sys; np.save(sys.argv[2], np.load(sys.argv[1])[:int(sys.argv[3])])' \
            "$tmp/story.npy" "$tmp/ids.npy" "$n"
        "$TINYLM" bpe decode --tokenizer "$tok" --input "$tmp/ids.npy" > "$out"
        "$TINYLM" bpe encode --tokenizer "$tok" --input "$out" --out "$tmp/check.npy" 2> /dev/null
        if [ "$("$PYTHON" -c 'import numpy as np, sys; print(len(np.load(sys.argv[1])))' "$tmp/check.npy")" = "$PROMPT_TOKENS" ]; then
            rm -rf "$tmp"
            return
        fi
    done
    echo "no prefix of the text encodes to $PROMPT_TOKENS tokens" >&2
    exit 1
}

specs=()
for model in $MODELS; do
    dir="$WORK/$model"
    case $model in
    134m)
        if [ ! -f "$dir/run/checkpoint.safetensors" ]; then
            echo "== the 134M model: a tokenizer of 32,000 tokens, one training step"
            mkdir -p "$dir"
            cat "$DATA"/*.txt > "$dir/corpus.txt"
            "$TINYLM" bpe train --input "$dir/corpus.txt" --vocab-size 32000 \
                --special-token '<|endoftext|>' --out "$dir/tok" 2> /dev/null
            head -c 2000000 "$DATA/tinystories_combined.txt" > "$dir/train.txt"
            "$TINYLM" bpe encode --tokenizer "$dir/tok" --input "$dir/train.txt" --out "$dir/train.npy" 2> /dev/null
            "$TINYLM" train --train-data "$dir/train.npy" --val-data "$dir/train.npy" --tokenizer "$dir/tok" \
                --out-dir "$dir/run" --vocab-size 32000 --context-length 512 --d-model 768 --num-layers 12 \
                --num-heads 12 --d-ff 2048 --batch-size 1 --steps 1 --eval-interval 0 --eval-batches 1 \
                --tensorboard false --threads "$THREADS" > /dev/null 2>&1
            rm "$dir/corpus.txt"
        fi
        tok="$dir/tok" new=256 desc="d_model 768, 12 layers, d_ff 2048, vocabulary 32,000 (134M parameters)"
        ;;
    quickstart)
        if [ ! -f "$dir/run/checkpoint.safetensors" ]; then
            echo "== the quickstart's model: tinylm quickstart --minutes 0.5"
            rm -rf "$dir/run"
            "$TINYLM" quickstart --minutes 0.5 --threads "$THREADS" --out "$dir/run" > /dev/null
        fi
        tok="$dir/run/tokenizer" new=$((128 - PROMPT_TOKENS))
        desc="the quickstart's: d_model 192, 4 layers, d_ff 512, vocabulary 2,048, context 128"
        ;;
    *) echo "unknown model $model (134m, quickstart)" >&2; exit 2 ;;
    esac
    for dtype in f32 bf16 q8_0; do
        "$TINYLM" export gguf --checkpoint "$dir/run/checkpoint.safetensors" --tokenizer "$tok" \
            --out "$dir/model-$dtype.gguf" --dtype "$dtype" 2> /dev/null
    done
    "$TINYLM" export weights --checkpoint "$dir/run/checkpoint.safetensors" --tokenizer "$tok" \
        --out "$dir/weights-bf16.safetensors" --dtype bf16 2> /dev/null
    # The first paragraph whose prompt tinylm continues greedily for all NEW tokens
    # (a trained model may end a story early with <|endoftext|>; llama.cpp, greedy
    # on the same weights, follows).
    for paragraph in $(seq 0 49); do
        prompt_of "$tok" "$dir/prompt.txt" "$paragraph"
        "$TINYLM" generate --checkpoint "$dir/run/checkpoint.safetensors" --prompt "$(cat "$dir/prompt.txt")" \
            --max-tokens "$new" --temperature 0 --threads "$THREADS" --precision fp32 --verbose \
            2> "$dir/probe.txt" > /dev/null
        grep -q "/ $((new - 1)) tokens after the first" "$dir/probe.txt" && break
    done
    specs+=(--model "$model:$dir/run/checkpoint.safetensors:$dir/weights-bf16.safetensors:$dir/model:$dir/prompt.txt:$new:$desc")
done

echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
cpu_field() { sed -n "s/^$1[[:space:]]*: //p" /proc/cpuinfo | head -1; }
echo "CPU: $(cpu_field 'model name') (family $(cpu_field 'cpu family'), model $(cpu_field model))," \
    "$(grep -qw avx512f /proc/cpuinfo && echo AVX-512F || echo 'no AVX-512')$(grep -qw avx512_bf16 /proc/cpuinfo && echo ', AVX512_BF16')"
echo "llama.cpp: $("$LLAMA_COMPLETION" --version 2>&1 | grep -m1 version) (llama-cpp-python $version's sources)"
cc -O3 -march=native -pthread bench/read_bandwidth.c -o "$WORK/read_bandwidth"
"$PYTHON" bench/generate_compare.py --tinylm "$TINYLM" --llama-completion "$LLAMA_COMPLETION" \
    --rounds "$ROUNDS" --threads "$THREADS" --read-bandwidth "$WORK/read_bandwidth" "${specs[@]}"
