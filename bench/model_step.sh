#!/usr/bin/env bash
# Training-step throughput (forward + backward + AdamW), side by side in one run:
# `tinylm bench` against PyTorch (bench/torch_model.py: eager with a hand-written
# attention, fused SDPA, torch.compile) on the benchmark model — vocab 4,096,
# context 128, d_model 256, 4 layers, 8 heads, d_ff 704, batch 16 x 128, 2 threads.
# tinylm in fp32 and in bf16 mixed precision, PyTorch in f32 and under bf16 CPU
# autocast (sdpa-bf16, compile-bf16). They alternate for ROUNDS rounds (default 3)
# so machine load hits all alike; each figure is the best over the rounds. Then one
# full `tinylm bench` report per precision (time per kernel kind, the
# matrix-product peak in that precision, the step as a share of it). The CPU
# (model, AVX-512 and AVX512_BF16 or not) and the instruction set of each side come
# first. PRECISIONS (default "fp32 bf16") and VARIANTS (PyTorch's) choose the rows.
#
#   PYTHON=.venv-bench/bin/python bench/model_step.sh
#
# The AVX2 figure on an AVX-512 CPU: build tinylm without its AVX-512 kernels,
#   CARGO_TARGET_DIR=target/avx2 CARGO_FLAGS=--no-default-features bench/model_step.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
ROUNDS=${ROUNDS:-3}
CARGO_FLAGS=${CARGO_FLAGS:-}
THREADS=${THREADS:-2}
PRECISIONS=${PRECISIONS:-fp32 bf16}
VARIANTS=${VARIANTS:-eager,sdpa,compile,sdpa-bf16,compile-bf16}

cargo build --release -q -p tinylm-cli $CARGO_FLAGS
TINYLM=${CARGO_TARGET_DIR:-target}/release/tinylm
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
cpu_field() { sed -n "s/^$1[[:space:]]*: //p" /proc/cpuinfo | head -1; }
echo "CPU: $(cpu_field 'model name') (family $(cpu_field 'cpu family'), model $(cpu_field model))," \
    "$(grep -qw avx512f /proc/cpuinfo && echo AVX-512F || echo 'no AVX-512')," \
    "$(grep -qw avx512_bf16 /proc/cpuinfo && echo AVX512_BF16 || echo 'no AVX512_BF16')"
for precision in $PRECISIONS; do
    "$TINYLM" bench --threads 1 --steps 1 --batch-size 1 --seq-len 8 --no-peak --precision "$precision" \
        | grep '^precision\|^matrix products'
done
"$PYTHON" -c 'import torch; print("PyTorch", torch.__version__, "CPU capability:", torch.backends.cpu.get_cpu_capability())'
for round in $(seq "$ROUNDS"); do
    echo "round $round/$ROUNDS ..."
    for precision in $PRECISIONS; do
        "$TINYLM" bench --threads "$THREADS" --steps 20 --no-peak --precision "$precision" \
            > "$TMP/tinylm-$precision.$round"
    done
    "$PYTHON" bench/torch_model.py --bench --threads "$THREADS" --steps 10 --repeat 3 \
        --variants "$VARIANTS" >> "$TMP/torch.jsonl"
done

"$PYTHON" - "$TMP" "$ROUNDS" <<'PY'
import glob, json, re, sys
tmp, rounds = sys.argv[1], int(sys.argv[2])
rows = {}
gflop = None
for path in sorted(glob.glob(f"{tmp}/tinylm-*")):
    text = open(path).read()
    name = "tinylm " + path.split("tinylm-")[1].split(".")[0]
    gflop = float(re.search(r"([\d.]+) GFLOP per step", text).group(1))
    ms = float(re.search(r"best\s+([\d.]+) ms", text).group(1))
    cpu = re.search(r"/ \d+ threads = ([\d.]+) ms", text)
    best = rows.get(name)
    if best is None or ms < best[0]:
        rows[name] = (ms, float(cpu.group(1)) if cpu else None)
for line in open(f"{tmp}/torch.jsonl"):
    r = json.loads(line)
    best = rows.get(r["variant"])
    if best is None or r["ms_per_step"] < best[0]:
        rows[r["variant"]] = (r["ms_per_step"], None)
tokens = 16 * 128
ours_name = "tinylm bf16" if "tinylm bf16" in rows else "tinylm fp32"
ours = rows[ours_name][0]
print(f"\nbest of {rounds} rounds, {gflop} GFLOP per step (6·N·tokens + attention):")
print(f"| {'implementation':<22} | {'ms/step':>8} | {'tokens/s':>9} | {'GFLOP/s':>7} | {ours_name + ' is':>16} |")
print(f"|{'-'*24}|{'-'*10}:|{'-'*11}:|{'-'*9}:|{'-'*17}:|")
for name, (ms, _) in sorted(rows.items(), key=lambda kv: -kv[1][0]):
    print(f"| {name:<22} | {ms:>8.1f} | {tokens / ms * 1e3:>9.0f} | {gflop / ms * 1e3:>7.1f} | {ms / ours:>15.2f}x |")
for name in ("tinylm fp32", "tinylm bf16"):
    cpu = rows.get(name, (None, None))[1]
    if cpu:
        print(f"{name} CPU time per step / threads: {cpu:.1f} ms ({tokens / cpu * 1e3:.0f} tokens/s on otherwise idle cores)")
if "tinylm bf16" in rows and "tinylm fp32" in rows:
    f32, b16 = rows["tinylm fp32"], rows["tinylm bf16"]
    line = f"tinylm bf16 against tinylm fp32: {f32[0] / b16[0]:.2f}x (wall)"
    if f32[1] and b16[1]:
        line += f", {f32[1] / b16[1]:.2f}x (CPU time)"
    print(line)
torch_best = min((v for k, v in rows.items() if k.startswith("torch") and k.endswith("bf16")),
                 default=None, key=lambda v: v[0])
if torch_best and "tinylm bf16" in rows:
    print(f"tinylm bf16 against PyTorch's best under bf16 autocast: {torch_best[0] / rows['tinylm bf16'][0]:.2f}x")
PY

for precision in $PRECISIONS; do
    echo
    "$TINYLM" bench --threads "$THREADS" --steps 20 --precision "$precision"
done
