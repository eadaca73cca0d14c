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
# Models (MODELS, default "134m quickstart"; made by bench/llama.sh): the 134M
# model (256 new tokens) and the quickstart's (66 new tokens, which fill its
# context).
#
# llama.cpp is built (bench/llama.sh) from the sources that llama-cpp-python ships
# on PyPI (the version in bench/requirements.txt), once, into WORK (default
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

. bench/llama.sh
llama_build llama-completion
LLAMA_COMPLETION="$LLAMA_BIN/llama-completion"

specs=()
for model in $MODELS; do
    bench_model "$model"
    dir=$MODEL_DIR tok=$MODEL_TOK desc=$MODEL_DESC
    case $model in
    134m) new=256 ;;
    quickstart) new=$((MODEL_CONTEXT - PROMPT_TOKENS)) ;; # which fill its context
    esac
    # The first paragraph whose prompt tinylm continues greedily for all NEW tokens
    # (a trained model may end a story early with <|endoftext|>; llama.cpp, greedy
    # on the same weights, follows).
    for paragraph in $(seq 0 49); do
        prompt_of "$tok" "$dir/prompt.txt" "$paragraph" "$PROMPT_TOKENS"
        "$TINYLM" generate --checkpoint "$dir/run/checkpoint.safetensors" --prompt "$(cat "$dir/prompt.txt")" \
            --max-tokens "$new" --temperature 0 --threads "$THREADS" --precision fp32 --verbose \
            2> "$dir/probe.txt" > /dev/null
        grep -q "/ $((new - 1)) tokens after the first" "$dir/probe.txt" && break
    done
    specs+=(--model "$model:$dir/run/checkpoint.safetensors:$dir/weights-bf16.safetensors:$dir/model:$dir/prompt.txt:$new:$desc")
done

describe_machine
echo "llama.cpp: $("$LLAMA_COMPLETION" --version 2>&1 | grep -m1 version) (llama-cpp-python $llama_version's sources)"
cc -O3 -march=native -pthread bench/read_bandwidth.c -o "$WORK/read_bandwidth"
"$PYTHON" bench/generate_compare.py --tinylm "$TINYLM" --llama-completion "$LLAMA_COMPLETION" \
    --rounds "$ROUNDS" --threads "$THREADS" --read-bandwidth "$WORK/read_bandwidth" "${specs[@]}"
