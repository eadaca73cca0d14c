#!/usr/bin/env bash
# Writes the seed corpora, fuzz/corpus/<target>/, from the project's own files:
# `tinylm` trains tokenizers on the repository's mixed-script fixture, encodes it,
# trains two tiny models and exports one to Hugging Face's format; the
# configuration files are the documentation's examples. Each seed is small (at
# most 36 KiB), so that the fuzzer mutates them quickly. Run it again when a
# format changes:
#
#   cargo build --release -p tinylm-cli && bash fuzz/seeds.sh
set -euo pipefail
cd "$(dirname "$0")/.."
tinylm="${CARGO_TARGET_DIR:-target}/release/tinylm"
out=fuzz/corpus
text=crates/tinylm-bpe/tests/fixtures/mixed.txt
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The inputs that found faults (found-*) stay; every other seed is written again.
find "$out" -type f ! -name 'found-*' -delete 2>/dev/null || true
mkdir -p "$out"/{checkpoint,encode,gpt2_files,hf_import,npy,pattern,pretokenize,serve_request} \
    "$out"/{sweep,tiktoken,tokenizer_json,train_bpe,train_config,weights}
# What separates the files of one input (tinylm_fuzz::SEPARATOR).
sep=$'\n#~~~#\n'
quiet() { "$@" >/dev/null 2>&1 || { echo "failed: $*" >&2; exit 1; }; }

# Tokenizers: GPT-2's pattern (vocab.json, merges.txt, tokenizer.json), GPT-4's
# and a custom regex (tokenizer.json), and rank files.
eot=(--special-token '<|endoftext|>')
quiet "$tinylm" bpe train --input "$text" --vocab-size 300 "${eot[@]}" --out "$work/gpt2"
quiet "$tinylm" bpe train --input "$text" --vocab-size 280 "${eot[@]}" --pattern gpt4 --out "$work/gpt4"
quiet "$tinylm" bpe train --input "$text" --vocab-size 270 "${eot[@]}" \
    --pattern '\p{L}+|\p{N}|[^\p{L}\p{N}]+' --out "$work/custom"
for name in gpt2 gpt4 custom; do
    cp "$work/$name/tokenizer.json" "$out/tokenizer_json/$name"
done
{ cat "$work/gpt2/vocab.json"; printf '%s' "$sep"; cat "$work/gpt2/merges.txt"; } \
    > "$out/gpt2_files/trained"
for name in gpt2 gpt4; do
    quiet "$tinylm" bpe export --tokenizer "$work/$name" --format tiktoken --out "$work/$name.tiktoken"
done
{ cat "$work/gpt4.tiktoken"; printf '%s' "$sep"; printf '<|endoftext|>\n'; } > "$out/tiktoken/gpt4"
{ cat "$work/gpt2.tiktoken"; printf '%s' "$sep"; printf '<|endoftext|>=299\n<|fim|>=302\n'; } \
    > "$out/tiktoken/gpt2-specials"

# Token files: the text encoded (uint16, cut), and others as NumPy writes them.
quiet "$tinylm" bpe encode --tokenizer "$work/gpt2" --input "$text" --out "$work/tokens.npy"
head -c 1200 "$work/tokens.npy" > "$out/npy/uint16-cut"
python3 - "$out/npy" <<'PY'
import struct, sys
def npy(descr, shape, values, fmt, version=1):
    """An .npy file: format 1.0 (a 2-byte header length) or 2.0 (4 bytes)."""
    dims = ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "")
    header = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (descr, dims)
    start = 10 if version == 1 else 12
    header += " " * (63 - (start + len(header)) % 64) + "\n"
    length = struct.pack("<H" if version == 1 else "<I", len(header))
    body = b"".join(struct.pack(fmt, v) for v in values)
    return b"\x93NUMPY" + bytes([version, 0]) + length + header.encode() + body
seeds = {
    "int64": npy("<i8", [6], [0, 1, 2, 299, 5, 7], "<q"),
    "float32-2d": npy("<f4", [2, 3], [0.5, -1, 2, 3, 4, 1e9], "<f"),
    "uint32-v2": npy("<u4", [5], [1, 2, 3, 4, 5], "<I", version=2),
    "int32-empty": npy("<i4", [0], [], "<i"),
}
for name, data in seeds.items():
    open(sys.argv[1] + "/" + name, "wb").write(data)
PY

# Two tiny models, trained two steps on the tokens: a checkpoint with the AdamW
# moments (and its Hugging Face export), and one with tied embeddings and
# post-norm.
run_toml() {
    cat <<EOF
train_data = "$work/tokens.npy"
out_dir = "$work/$1"
batch_size = 2
steps = 2
eval_interval = 0
log_interval = 1
tensorboard = false

[model]
vocab_size = 300
context_length = 8
d_model = 4
num_layers = 1
num_heads = 2
d_ff = 8
EOF
}
run_toml run > "$work/run.toml"
{ run_toml tied; printf 'tie_embeddings = true\nnorm = "post"\n'; } > "$work/tied.toml"
quiet "$tinylm" train --config "$work/run.toml" --tokenizer "$work/gpt2"
quiet "$tinylm" train --config "$work/tied.toml"
cp "$work/run/checkpoint.safetensors" "$out/checkpoint/trained"
cp "$work/tied/checkpoint.safetensors" "$out/checkpoint/tied-post-norm"
quiet "$tinylm" export hf --checkpoint "$work/run/checkpoint.safetensors" --out "$work/hf"
{ cat "$work/hf/config.json"; printf '%s' "$sep"; cat "$work/hf/model.safetensors"; printf '%s' "$sep"
    cat "$work/hf/tokenizer.json"; } > "$out/hf_import/exported"
{ cat "$work/hf/config.json"; printf '%s' "$sep"; cat "$work/hf/model.safetensors"; } \
    > "$out/hf_import/no-tokenizer"

# Weights-only files with a model config: PyTorch's (the test fixtures) and the
# tiny model's weights without their metadata's config.
for dtype in f32 bf16; do
    { printf '%s' '{"vocab_size": 16, "context_length": 8, "d_model": 8, "num_layers": 1, "num_heads": 2, "d_ff": 16}'
        printf '%s' "$sep"; cat "crates/tinylm/tests/fixtures/torch_$dtype.safetensors"; } \
        > "$out/weights/torch-$dtype"
done
{ sed -n '/^\[model\]/,$p' "$work/run.toml" | tail -n +2 \
    | sed -e 's/ = /": /' -e 's/^/"/' | paste -sd, | sed -e 's/^/{/' -e 's/$/}/'
    printf '%s' "$sep"; cat "$work/run/checkpoint.safetensors"; } > "$out/weights/checkpoint"

# Training configurations and sweeps: the documentation's examples.
cat > "$out/train_config/run.toml" <<'EOF'
train_data = "data/train.npy"
val_data = "data/valid.npy"
tokenizer = "tokenizer"
out_dir = "runs/tinystories"
batch_size = 32
steps = 5000
lr_max = 1e-3
lr_min = 1e-4
warmup_steps = 100
eval_interval = 500
time_budget_s = 600.0
schedule = "time"

[model]
vocab_size = 10000
context_length = 256
d_model = 512
num_layers = 4
num_heads = 16
d_ff = 1344
norm = "pre"
positional = "rope"
ffn = "swiglu"
tie_embeddings = false
EOF
cat > "$out/train_config/resume.toml" <<'EOF'
train_data = "t.npy"
resume = "runs/x/checkpoint.safetensors"
steps = 40
max_tokens = 100000
micro_batch_size = 8
zero = 1
EOF
{ printf 'train_data = "t.npy"\nsteps = 100\n[model]\nd_model = 64\nnum_heads = 4\nd_ff = 128\n'
    printf '%s' "$sep"; printf 'lr_max=1e-4,3e-4,1e-3\nbatch_size=8,16'
    printf '%s' "$sep"; printf 'baseline,no-norm,post-norm,nope,silu\nwide:d_model=96,num_heads=6'; } \
    > "$out/sweep/grid-and-variants"

# Split patterns and text: GPT-2's and GPT-4's regexes as published, others.
i=0
for regex in "'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+" \
    "'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++\$|\s*[\r\n]|\s+(?!\S)|\s" \
    '\p{L}+|\p{N}{1,3}+|[^\p{L}\p{N}]+' '(?<=a)b|.' '(\w+)\s*(?=\1)|\S+' o200k; do
    i=$((i + 1))
    { printf '%s' "$regex"; printf '%s' "$sep"; head -c 700 "$text"; } > "$out/pattern/regex-$i"
done

# Text for the scanners, the encoder and the trainer (the encoder's and the
# trainer's first two bytes pick the pattern and a chunk size).
split -b 700 -d "$text" "$work/piece-"
for piece in "$work"/piece-*; do
    name=$(basename "$piece")
    cp "$piece" "$out/pretokenize/$name"
    for choice in 0 1 2; do
        { printf "\\x0$choice\\x07"; cat "$piece"; } > "$out/encode/$name-$choice"
    done
    { printf '\x81\x0f'; cat "$piece"; } > "$out/train_bpe/$name"
done
# Request bodies of `tinylm serve`: completions as clients send them, every
# parameter, token prompts, a prompt scored alone, /tokenize and /detokenize.
serve="$out/serve_request"
printf '{"prompt": "the theme", "max_tokens": 5}' > "$serve/completion"
printf '%s' '{"model": "tiny", "prompt": ["the cat", "", "the"], "max_tokens": 8, "temperature": 0.8,
 "top_p": 0.95, "top_k": 40, "n": 2, "best_of": 2, "stream": true, "stream_options": {"include_usage": true},
 "stop": ["\n", "the"], "seed": -3, "echo": true, "logprobs": 3, "suffix": "", "logit_bias": {},
 "presence_penalty": 0, "frequency_penalty": 0.0, "ignore_eos": true, "user": "x"}' > "$serve/completion-all"
printf '{"prompt": [[116, 256, 257], [258, 32, 260]], "max_tokens": 3, "n": 3}' > "$serve/completion-tokens"
printf '{"prompt": "the the", "max_tokens": 0, "echo": true, "logprobs": 20}' > "$serve/completion-score"
printf '{"prompt": 5, "max_tokens": -1, "logprobs": true}' > "$serve/completion-wrong-types"
printf '%s' '{"content": "the theme \u00e9\ud83d\udc4b <|endoftext|>", "with_pieces": true}' > "$serve/tokenize"
printf '{"tokens": [116, 256, 258, 259, 195]}' > "$serve/detokenize"
printf '\x00\x03a<|endoftext|>b<|eot|><|eot|><|eot|>c<|eot' > "$out/encode/specials"
printf '\x00\x05ok\xff\xfe then text' > "$out/train_bpe/invalid-utf8"
du -sh "$out"
