#!/usr/bin/env bash
# Training-step throughput (forward + backward + AdamW), side by side in one run:
# `tinylm bench` against PyTorch (bench/torch_model.py: eager with a hand-written
# attention, fused SDPA, torch.compile) on the benchmark model — vocab 4,096,
# context 128, d_model 256, 4 layers, 8 heads, d_ff 704, batch 16 x 128, 2 threads.
# The two alternate for ROUNDS rounds (default 3) so machine load hits both alike;
# each figure is the best over the rounds. Then one full `tinylm bench` report
# (time per kernel kind, the matrix-product peak, the step as a share of it). The
# CPU (model, AVX-512 or not) and the instruction set of each side come first.
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

cargo build --release -q -p tinylm-cli $CARGO_FLAGS
TINYLM=${CARGO_TARGET_DIR:-target}/release/tinylm
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
cpu_field() { sed -n "s/^$1[[:space:]]*: //p" /proc/cpuinfo | head -1; }
echo "CPU: $(cpu_field 'model name') (family $(cpu_field 'cpu family'), model $(cpu_field model))," \
    "$(grep -qw avx512f /proc/cpuinfo && echo AVX-512F || echo 'no AVX-512')"
"$TINYLM" bench --threads 1 --steps 1 --batch-size 1 --seq-len 8 --no-peak | grep '^matrix products'
"$PYTHON" -c 'import torch; print("PyTorch", torch.__version__, "CPU capability:", torch.backends.cpu.get_cpu_capability())'
for round in $(seq "$ROUNDS"); do
    echo "round $round/$ROUNDS ..."
    "$TINYLM" bench --threads "$THREADS" --steps 20 --no-peak > "$TMP/tinylm.$round"
    "$PYTHON" bench/torch_model.py --bench --threads "$THREADS" --steps 10 --repeat 3 \
        >> "$TMP/torch.jsonl"
done

"$PYTHON" - "$TMP" "$ROUNDS" <<'PY'
import glob, json, re, sys
tmp, rounds = sys.argv[1], int(sys.argv[2])
rows = {}
gflop = None
for path in sorted(glob.glob(f"{tmp}/tinylm.*")):
    text = open(path).read()
    gflop = float(re.search(r"([\d.]+) GFLOP per step", text).group(1))
    ms = float(re.search(r"best\s+([\d.]+) ms", text).group(1))
    cpu = re.search(r"/ \d+ threads = ([\d.]+) ms", text)
    best = rows.get("tinylm")
    if best is None or ms < best[0]:
        rows["tinylm"] = (ms, float(cpu.group(1)) if cpu else None)
for line in open(f"{tmp}/torch.jsonl"):
    r = json.loads(line)
    best = rows.get(r["variant"])
    if best is None or r["ms_per_step"] < best[0]:
        rows[r["variant"]] = (r["ms_per_step"], None)
tokens = 16 * 128
ours = rows["tinylm"][0]
print(f"\nbest of {rounds} rounds, {gflop} GFLOP per step (6·N·tokens + attention):")
print(f"| {'implementation':<22} | {'ms/step':>8} | {'tokens/s':>9} | {'GFLOP/s':>7} | {'tinylm speed-up':>15} |")
print(f"|{'-'*24}|{'-'*10}:|{'-'*11}:|{'-'*9}:|{'-'*17}:|")
for name, (ms, _) in sorted(rows.items(), key=lambda kv: -kv[1][0]):
    print(f"| {name:<22} | {ms:>8.1f} | {tokens / ms * 1e3:>9.0f} | {gflop / ms * 1e3:>7.1f} | {ms / ours:>14.2f}x |")
cpu = rows["tinylm"][1]
if cpu:
    print(f"tinylm CPU time per step / threads: {cpu:.1f} ms ({tokens / cpu * 1e3:.0f} tokens/s on otherwise idle cores)")
PY

echo
"$TINYLM" bench --threads "$THREADS" --steps 20
