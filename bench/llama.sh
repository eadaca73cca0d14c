# What the benchmarks against llama.cpp share (bench/generate.sh, bench/serve.sh),
# sourced with PYTHON, DATA, THREADS, WORK and TINYLM set:
#
# - llama_build TARGET...: llama.cpp's tools (llama-completion, llama-server) built
#   (CMake, GGML_NATIVE) from the sources that the pinned llama-cpp-python ships on
#   PyPI (the version in bench/requirements.txt), once, into WORK; sets LLAMA_BIN.
# - bench_model NAME: the model NAME (134m or quickstart) in WORK/NAME — made once —
#   with its tokenizer, its `tinylm export gguf` files (f32, bf16, q8_0) and its
#   weights in bf16 (`tinylm export weights`); sets MODEL_DIR, MODEL_TOK,
#   MODEL_CONTEXT and MODEL_DESC:
#   - 134m: d_model 768, 12 layers, 12 heads, d_ff 2048, vocabulary 32,000 (a BPE
#     tokenizer trained on all of DATA's text), context 512; its weights are the
#     initial ones after one training step (speed does not depend on them);
#   - quickstart: `tinylm quickstart --minutes 0.5` (d_model 192, 4 layers, d_ff
#     512, vocabulary 2,048, context 128).
# - prompt_of TOKENIZER OUT PARAGRAPH TOKENS: the shortest start of DATA's
#   TinyStories validation text from paragraph number PARAGRAPH on whose encoding
#   is TOKENS tokens, written to OUT.
# - describe_machine: the CPU (lscpu's model name and the vector features that
#   matter here), its cores and the load average.

llama_version=$(sed -n 's/^llama-cpp-python==//p' bench/requirements.txt)

llama_build() {
    local dir="$WORK/llama.cpp-$llama_version" target missing=()
    LLAMA_BIN="$dir/build/bin"
    for target in "$@"; do
        [ -x "$LLAMA_BIN/$target" ] || missing+=("$target")
    done
    [ "${#missing[@]}" -eq 0 ] && return
    echo "== building llama.cpp's ${missing[*]} from llama-cpp-python $llama_version's sources (a few minutes)"
    local src="$dir/llama_cpp_python-$llama_version/vendor/llama.cpp"
    if [ ! -d "$src" ]; then
        rm -rf "$dir" && mkdir -p "$dir"
        "$PYTHON" -m pip download --quiet --no-deps --no-binary llama-cpp-python \
            "llama-cpp-python==$llama_version" -d "$dir"
        tar xzf "$dir/llama_cpp_python-$llama_version.tar.gz" -C "$dir"
    fi
    # On a CPU with AMX, GGML_NATIVE builds ggml's AMX kernels, whose Q8_0 product
    # stops with an illegal instruction (tilezero, no tile configuration loaded) on
    # the Intel Xeon (family 6, model 207) of docs/performance.md: they are left
    # out, so llama.cpp runs its AVX-512 kernels there, as everywhere else.
    local cmake flags=""
    grep -qw amx_int8 /proc/cpuinfo && flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    cmake=$(command -v "$(dirname "$PYTHON")/cmake" || command -v cmake)
    "$cmake" -S "$src" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
        -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
        -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
        -DLLAMA_BUILD_SERVER=ON > "$dir/cmake.log" 2>&1 || { tail -30 "$dir/cmake.log" >&2; exit 1; }
    "$cmake" --build "$dir/build" -j "$(nproc)" --target "${missing[@]}" > "$dir/build.log" 2>&1 \
        || { tail -30 "$dir/build.log" >&2; exit 1; }
}

prompt_of() {
    local tok=$1 out=$2 paragraph=$3 tokens=$4 tmp
    tmp=$(mktemp -d)
    "$PYTHON" -c 'import sys; i = int(sys.argv[2]); print("\n\n".join(open(sys.argv[1], encoding="utf-8").read().split("\n\n")[i:i + 8]).strip(), end="")' \
        "$DATA/tinystories_v1_valid_head_794k.txt" "$paragraph" > "$tmp/story.txt"
    "$TINYLM" bpe encode --tokenizer "$tok" --input "$tmp/story.txt" --out "$tmp/story.npy" 2> /dev/null
    for n in $(seq "$tokens" $((tokens + 8))); do
        "$PYTHON" -c 'import numpy as np, sys; np.save(sys.argv[2], np.load(sys.argv[1])[:int(sys.argv[3])])' \
            "$tmp/story.npy" "$tmp/ids.npy" "$n"
        "$TINYLM" bpe decode --tokenizer "$tok" --input "$tmp/ids.npy" > "$out"
        "$TINYLM" bpe encode --tokenizer "$tok" --input "$out" --out "$tmp/check.npy" 2> /dev/null
        if [ "$("$PYTHON" -c 'import numpy as np, sys; print(len(np.load(sys.argv[1])))' "$tmp/check.npy")" = "$tokens" ]; then
            rm -rf "$tmp"
            return
        fi
    done
    echo "no prefix of the text encodes to $tokens tokens" >&2
    exit 1
}

bench_model() {
    local model=$1
    MODEL_DIR="$WORK/$model"
    case $model in
    134m)
        if [ ! -f "$MODEL_DIR/run/checkpoint.safetensors" ]; then
            echo "== the 134M model: a tokenizer of 32,000 tokens, one training step"
            mkdir -p "$MODEL_DIR"
            cat "$DATA"/*.txt > "$MODEL_DIR/corpus.txt"
            "$TINYLM" bpe train --input "$MODEL_DIR/corpus.txt" --vocab-size 32000 \
                --special-token '<|endoftext|>' --out "$MODEL_DIR/tok" 2> /dev/null
            head -c 2000000 "$DATA/tinystories_combined.txt" > "$MODEL_DIR/train.txt"
            "$TINYLM" bpe encode --tokenizer "$MODEL_DIR/tok" --input "$MODEL_DIR/train.txt" \
                --out "$MODEL_DIR/train.npy" 2> /dev/null
            "$TINYLM" train --train-data "$MODEL_DIR/train.npy" --val-data "$MODEL_DIR/train.npy" \
                --tokenizer "$MODEL_DIR/tok" --out-dir "$MODEL_DIR/run" --vocab-size 32000 \
                --context-length 512 --d-model 768 --num-layers 12 --num-heads 12 --d-ff 2048 \
                --batch-size 1 --steps 1 --eval-interval 0 --eval-batches 1 --tensorboard false \
                --threads "$THREADS" > /dev/null 2>&1
            rm "$MODEL_DIR/corpus.txt"
        fi
        MODEL_TOK="$MODEL_DIR/tok" MODEL_CONTEXT=512
        MODEL_DESC="d_model 768, 12 layers, d_ff 2048, vocabulary 32,000 (134M parameters)"
        ;;
    quickstart)
        if [ ! -f "$MODEL_DIR/run/checkpoint.safetensors" ]; then
            echo "== the quickstart's model: tinylm quickstart --minutes 0.5"
            rm -rf "$MODEL_DIR/run"
            "$TINYLM" quickstart --minutes 0.5 --threads "$THREADS" --out "$MODEL_DIR/run" > /dev/null
        fi
        MODEL_TOK="$MODEL_DIR/run/tokenizer" MODEL_CONTEXT=128
        MODEL_DESC="the quickstart's: d_model 192, 4 layers, d_ff 512, vocabulary 2,048, context 128"
        ;;
    *) echo "unknown model $model (134m, quickstart)" >&2; exit 2 ;;
    esac
    local dtype
    for dtype in f32 bf16 q8_0; do
        "$TINYLM" export gguf --checkpoint "$MODEL_DIR/run/checkpoint.safetensors" --tokenizer "$MODEL_TOK" \
            --out "$MODEL_DIR/model-$dtype.gguf" --dtype "$dtype" 2> /dev/null
    done
    "$TINYLM" export weights --checkpoint "$MODEL_DIR/run/checkpoint.safetensors" --tokenizer "$MODEL_TOK" \
        --out "$MODEL_DIR/weights-bf16.safetensors" --dtype bf16 2> /dev/null
}

describe_machine() {
    local features
    features=$(grep -m1 -o -w -E 'avx2|avx512f|avx512_bf16|avx512_vnni|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ')
    echo "CPU: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p') (family $(lscpu | sed -n 's/^CPU family:[[:space:]]*//p'), model $(lscpu | sed -n 's/^Model:[[:space:]]*//p')); features: ${features% }"
    echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
}
