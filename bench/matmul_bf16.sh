#!/usr/bin/env bash
# bf16 matrix products, side by side in one run: tinylm's bf16 kernel and its f32
# products (`tinylm bench-matmul`: every product of a training step, f32 and bf16
# alternating inside the process) against PyTorch's `torch.matmul` on bf16 tensors
# (oneDNN; bench/torch_matmul.py, the same shapes and transposes), 2 threads, for the
# benchmark model (--preset bench-small, batch 16 x 128) and the TinyStories
# model (--preset tinystories, batch 8 x 256). tinylm and PyTorch alternate
# for ROUNDS rounds (default 3) of REPEAT timed calls per product (default 10); each
# figure is the best over all of them. The CPU and each side's instruction set first;
# then per model a table of GFLOP/s and the step's products as a whole (each product
# counted as often as a step runs it).
#
#   PYTHON=.venv-bench/bin/python bench/matmul_bf16.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
ROUNDS=${ROUNDS:-3}
REPEAT=${REPEAT:-10}
THREADS=${THREADS:-2}
CARGO_FLAGS=${CARGO_FLAGS:-}

cargo build --release -q -p tinylm-cli $CARGO_FLAGS
TINYLM=${CARGO_TARGET_DIR:-target}/release/tinylm
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
cpu_field() { sed -n "s/^$1[[:space:]]*: //p" /proc/cpuinfo | head -1; }
echo "CPU: $(cpu_field 'model name') (family $(cpu_field 'cpu family'), model $(cpu_field model))," \
    "$(grep -qw avx512_bf16 /proc/cpuinfo && echo AVX512_BF16 || echo 'no AVX512_BF16')"
"$PYTHON" -c 'import torch; print("PyTorch", torch.__version__, "CPU capability:", torch.backends.cpu.get_cpu_capability(), "oneDNN:", torch.backends.mkldnn.is_available())'
MODELS="bench-small:16 tinystories:8"
for round in $(seq "$ROUNDS"); do
    echo "round $round/$ROUNDS ..."
    for model in $MODELS; do
        name=${model%%:*}
        "$TINYLM" bench-matmul --preset "$name" --batch-size "${model##*:}" \
            --threads "$THREADS" --rounds "$REPEAT" > "$TMP/$name.tinylm.$round"
        "$PYTHON" bench/torch_matmul.py "$TMP/$name.tinylm.$round" --threads "$THREADS" \
            --repeat "$REPEAT" > "$TMP/$name.torch.$round"
    done
done
head -3 "$TMP/bench-small.tinylm.1" | tail -1

"$PYTHON" - "$TMP" "$MODELS" <<'PY'
import glob, json, re, sys
tmp, models = sys.argv[1], [m.split(":")[0] for m in sys.argv[2].split()]
row = re.compile(r"^  (\S+\s+\S+)\s+\(\s*(\d+) x\s+(\d+) x\s+(\d+)\)\s+(\d+)\s+([\d.]+)\s+([\d.]+)")
for model in models:
    best = {}  # name -> [shape, per_step, f32, bf16, torch]
    for path in glob.glob(f"{tmp}/{model}.tinylm.*"):
        for line in open(path, encoding="utf-8"):
            if m := row.match(line):
                name = " ".join(m.group(1).split())
                b = best.setdefault(name, [tuple(int(m.group(i)) for i in (2, 3, 4)), int(m.group(5)), 0, 0, 0])
                b[2], b[3] = max(b[2], float(m.group(6))), max(b[3], float(m.group(7)))
    for path in glob.glob(f"{tmp}/{model}.torch.*"):
        for line in open(path, encoding="utf-8"):
            r = json.loads(line)
            best[r["name"]][4] = max(best[r["name"]][4], r["gflops"])
    print(f"\n{model} (best of all rounds), GFLOP/s:")
    print("| product | m × k × n | per step | tinylm f32 | tinylm bf16 | PyTorch bf16 | tinylm bf16 / PyTorch | bf16 / f32 |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    totals = [0.0, 0.0, 0.0, 0.0]  # flops, then seconds per side
    for name, ((m, k, n), count, f32, bf16, torch) in best.items():
        print(f"| {name} | {m} × {k} × {n} | {count} | {f32:.1f} | {bf16:.1f} | {torch:.1f} | {bf16 / torch:.2f} | {bf16 / f32:.2f} |")
        flops = 2 * m * k * n * count * 1e-9
        totals[0] += flops
        for i, g in enumerate((f32, bf16, torch)):
            totals[i + 1] += flops / g
    f32, bf16, torch = (totals[0] / s for s in totals[1:])
    print(f"| all, weighted by count per step | | | {f32:.1f} | {bf16:.1f} | {torch:.1f} | {bf16 / torch:.2f} | {bf16 / f32:.2f} |")
PY
