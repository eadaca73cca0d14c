#!/usr/bin/env bash
# Data parallelism on one machine, in one run: the benchmark model's training step
# (`tinylm bench`: vocab 4,096, context 128, d_model 256, 4 layers, batch 16 x 128)
# as one process of THREADS threads against `mpirun -np RANKS` ranks of one thread
# each, every rank bound to its own core and taking batch / RANKS sequences, the
# gradient all-reduced over the ranks every step. The two alternate for ROUNDS
# rounds (default 3) so machine load hits both alike; each side's figure is its
# best round's median step. Then the ratio of the two tokens/s (the target: the
# ranks keep at least 90% of the one process's), the gradient all-reduce's time,
# bandwidth and share of the step, and the all-reduce alone on buffers of 4 KiB to
# 256 MiB. The CPU comes first.
#
#   bench/distributed.sh                     # 2 ranks x 1 thread vs 1 process x 2 threads
#   RANKS=4 bench/distributed.sh             # on a machine with 4 cores
#   MPIRUN_FLAGS="--mca btl self,vader" bench/distributed.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
RANKS=${RANKS:-2}
THREADS=${THREADS:-$RANKS}
STEPS=${STEPS:-10}
BATCH=${BATCH:-16}
MPIRUN=${MPIRUN:-mpirun}
read -ra mpirun_flags <<<"${MPIRUN_FLAGS:-}"

cargo build --release -q -p tinylm-cli --features mpi
TINYLM=${CARGO_TARGET_DIR:-target}/release/tinylm
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# One rank per core, each bound to it; Open MPI refuses root without a flag.
launch=("$MPIRUN" -np "$RANKS" --bind-to core "${mpirun_flags[@]}")
if "$MPIRUN" --version 2>/dev/null | grep -q "Open MPI" && [ "$(id -u)" = 0 ]; then
    launch+=(--allow-run-as-root)
fi

echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
cpu_field() { sed -n "s/^$1[[:space:]]*: //p" /proc/cpuinfo | head -1; }
echo "CPU: $(cpu_field 'model name') (family $(cpu_field 'cpu family'), model $(cpu_field model))"
echo "MPI: $("$MPIRUN" --version 2>/dev/null | head -1); launch: ${launch[*]}"
for round in $(seq "$ROUNDS"); do
    echo "round $round/$ROUNDS ..."
    "$TINYLM" bench --batch-size "$BATCH" --threads "$THREADS" --steps "$STEPS" --no-peak \
        >"$TMP/one.$round"
    "${launch[@]}" "$TINYLM" bench --batch-size "$BATCH" --threads 1 --steps "$STEPS" \
        >"$TMP/ranks.$round"
done

python3 - "$TMP" "$ROUNDS" "$RANKS" "$THREADS" <<'PY'
import re, sys
tmp, rounds, ranks, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
def median_step(text):
    m = re.search(r"median\s+([\d.]+) ms\s+(\d+) tokens/s", text)
    return float(m.group(1)), int(m.group(2))
one, many = [], []
for r in range(1, rounds + 1):
    a = open(f"{tmp}/one.{r}").read()
    b = open(f"{tmp}/ranks.{r}").read()
    one.append(median_step(a))
    ar = re.search(r"all-reduce alone \(\d+ f32 values, ([\d.]+) MB\)", b)
    ar_med = re.search(r"median\s+([\d.]+) ms\s+algorithm bandwidth\s+([\d.]+) GB/s\s+bus bandwidth\s+([\d.]+)", b)
    share = re.search(r"share of the step: ([\d.]+)%", b)
    many.append(median_step(b) + (float(ar.group(1)), float(ar_med.group(1)), float(ar_med.group(3)), float(share.group(1))))
    print(f"round {r}: 1 x {threads} threads {one[-1][1]:>6} tokens/s, {ranks} ranks x 1 thread "
          f"{many[-1][1]:>6} tokens/s ({100 * many[-1][1] / one[-1][1]:.0f}%), all-reduce "
          f"{many[-1][3]:.1f} ms = {many[-1][5]:.1f}% of the step")
o = min(one)
m = min(many)
print(f"\neach side's best of {rounds} rounds (a round's figure: its median step):")
print(f"| {'run':<34} | {'ms/step':>8} | {'tokens/s':>8} |")
print(f"|{'-'*36}|{'-'*9}:|{'-'*9}:|")
print(f"| {'1 process x ' + str(threads) + ' threads':<34} | {o[0]:>8.1f} | {o[1]:>8} |")
print(f"| {'mpirun -np ' + str(ranks) + ' x 1 thread (bound)':<34} | {m[0]:>8.1f} | {m[1]:>8} |")
ratio = m[1] / o[1]
print(f"{ranks} ranks keep {100 * ratio:.1f}% of the one process's tokens/s "
      f"(target >= 90%: {'met' if ratio >= 0.9 else 'NOT met'})")
print(f"gradient all-reduce ({m[2]:.1f} MB) in that run: median {m[3]:.2f} ms, "
      f"bus bandwidth {m[4]:.2f} GB/s, {m[5]:.1f}% of the step")
PY

echo
echo "all-reduce alone, $RANKS ranks:"
"${launch[@]}" "$TINYLM" bench-allreduce --threads 1
