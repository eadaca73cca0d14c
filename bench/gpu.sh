#!/usr/bin/env bash
# The CUDA backend on a GPU machine, in one script, in two halves:
#
#   bench/gpu.sh pack     # here (Rust, no GPU): the CUDA test binaries, the CLI with
#                         # --features cuda, a 10,000-token tokenizer and the embedded
#                         # TinyStories sample tokenized, into target/gpu-bin/; the
#                         # NCCL test binary with the libraries it needs in lib/:
#                         # Open MPI's and libnccl.so.2 of the nvidia-nccl-cu13 wheel
#   bench/gpu.sh          # on the GPU machine (no Rust needed): runs what was packed
#   BASE=DIR bench/gpu.sh # ... and times DIR/tinylm (another build's, e.g. the last
#                         # commit's, packed with BIN=DIR) beside it in bf16
#
# On the GPU machine it needs the NVIDIA driver (libcuda.so.1) and the CUDA 13
# libraries and headers: /usr/local/cuda (lib64: libnvrtc.so.13, libcublasLt.so.13;
# include: cuda_bf16.h), or a Python environment's nvidia/cu13 wheels
# (nvidia-cuda-nvrtc, nvidia-cuda-runtime, nvidia-cublas), found through $PYTHON; and
# PyTorch (with Triton, for torch.compile) for the reference. In order, each part
# with a time limit of its own, its output written to $OUT (else target/gpu-logs) as
# it finishes, so a run cut short still reports what it did:
#
#   1. correct: the NVRTC test, the numeric suite (every kernel against the CPU, the
#      whole model in fp32 and bf16 in every ablation, KV-cache decoding, a 200-step
#      run, checkpoints across devices), the memory accounting against the device's,
#      the training step's NCCL calls through the real libnccl.so.2 on one rank
#      (crates/tinylm/tests/nccl.rs: every loss and weight as without NCCL)
#   2. fast: the GPU's bf16 matrix-product rate; then at batch 32 and 128 x 256 on the
#      CS336 TinyStories model, alternating: `tinylm bench` in bf16 and fp32 (with
#      its per-kernel split), PyTorch eager fp32 and torch.compile + bf16 autocast +
#      fused attention, and tinylm bf16 again (the spread between its two runs)
#      and with ATTENTION="ARGS", bench/attention_gpu.py ARGS: the fused attention's
#      forward and backward alone beside PyTorch's, with variants of their tiles
#      (and the BASE build's kernels, which pack copies into DIR/kernels)
#   3. end to end, if 2 minutes of $GPU_BUDGET_S remain: `tinylm train --device cuda`
#      at batch 128 x 256 for what is left (at most $TRAIN_S, default 3 minutes)
#   4. each kernel's time under Nsight Compute (ncu), where the machine has it, in
#      what is left
#
# and last a table: tokens/s, the ratios to PyTorch's best, MFU against the measured
# bf16 rate, the projected time of the assignment's 327,680,000 tokens.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/gpu-bin}
BASE=${BASE:-}

if [ "${1:-}" = pack ]; then
    set -e
    mkdir -p "$BIN/data"
    for test in cuda cuda_nvrtc accounting; do
        exe=$(cargo test --release -p tinylm --features cuda --test "$test" --no-run 2>&1 |
            sed -n 's/.*Executable .*(\(.*\)).*/\1/p' | tail -1)
        cp "$exe" "$BIN/test-$test"
    done
    exe=$(cargo test --release -p tinylm --features nccl --test nccl --no-run 2>&1 |
        sed -n 's/.*Executable .*(\(.*\)).*/\1/p' | tail -1)
    cp "$exe" "$BIN/test-nccl"
    cargo build --release -q -p tinylm-cli --features cuda
    cp "${CARGO_TARGET_DIR:-target}/release/tinylm" "$BIN/tinylm"
    strip "$BIN"/test-* "$BIN/tinylm"
    # What test-nccl loads besides the system's C and C++ runtime (Open MPI's
    # libraries, which a GPU machine may lack), and NCCL from its wheel.
    mkdir -p "$BIN/lib"
    ldd "$BIN/test-nccl" | awk '$3 ~ /^\// && $1 !~ /^(libc|libm|libdl|librt|libpthread|libgcc_s|libstdc\+\+)\.so/ { print $3 }' |
        xargs -r cp -L -t "$BIN/lib"
    python3 -m pip download --quiet --no-deps --dest "$BIN/wheel" nvidia-nccl-cu13
    python3 - "$BIN" <<'PY'
import glob, sys, zipfile
wheel = zipfile.ZipFile(glob.glob(f"{sys.argv[1]}/wheel/nvidia_nccl_cu13-*.whl")[0])
name = next(n for n in wheel.namelist() if n.endswith("/libnccl.so.2"))
open(f"{sys.argv[1]}/lib/libnccl.so.2", "wb").write(wheel.read(name))
PY
    rm -r "$BIN/wheel"
    # The corpus tinylm embeds, 95% to train on and 5% to validate, tokenized with a
    # tokenizer of the TinyStories model's vocabulary.
    text="$BIN/data/tinystories.txt"
    zstd -qdcf crates/tinylm-corpus/data/tinystories.txt.zst >"$text"
    lines=$(wc -l <"$text")
    head -n $((lines * 95 / 100)) "$text" >"$BIN/data/train.txt"
    tail -n +$((lines * 95 / 100 + 1)) "$text" >"$BIN/data/val.txt"
    "$BIN/tinylm" bpe train --input "$BIN/data/train.txt" --vocab-size 10000 \
        --special-token '<|endoftext|>' --out "$BIN/data/tokenizer" >/dev/null
    for split in train val; do
        "$BIN/tinylm" bpe encode --tokenizer "$BIN/data/tokenizer" --special-token '<|endoftext|>' \
            --input "$BIN/data/$split.txt" --out "$BIN/data/$split.npy" >/dev/null
    done
    rm "$text" "$BIN/data/train.txt" "$BIN/data/val.txt"
    # The attention kernels this build compiles, for bench/attention_gpu.py --cu.
    mkdir -p "$BIN/kernels"
    cp crates/tinylm/src/kernels/cuda/{attention.cu,common.cuh} "$BIN/kernels/"
    du -sh "$BIN" && ls -la "$BIN" "$BIN/data"
    exit 0
fi

LOG=${OUT:-target/gpu-logs}
BUDGET=${GPU_BUDGET_S:-450}
mkdir -p "$LOG"
START=$SECONDS
left() { echo $((BUDGET - (SECONDS - START))); }
# `part NAME LIMIT_S COMMAND...`: the command, stopped after LIMIT_S seconds (or
# when the budget ends), its output appended to $LOG/NAME.log; a failure is noted
# and the next part runs.
status=0
part() {
    local name=$1 limit=$2
    shift 2
    [ "$limit" -gt "$(left)" ] && limit=$(left)
    if [ "$limit" -le 5 ]; then
        echo "== skipped (budget spent): $*" | tee -a "$LOG/$name.log"
        return
    fi
    echo "== [$((SECONDS - START)) s] $* (limit ${limit} s)" | tee -a "$LOG/$name.log"
    timeout -k 5 "$limit" "$@" >>"$LOG/$name.log" 2>&1
    local rc=$?
    if [ $rc -ne 0 ]; then
        status=1
        echo "== FAILED (exit $rc): $*" | tee -a "$LOG/$name.log"
        tail -n 30 "$LOG/$name.log"
    fi
}

# Libraries: the toolkit, else the Python environment's wheels.
py=${PYTHON:-python3}
lib_dirs=()
[ -d /usr/local/cuda/lib64 ] && lib_dirs+=(/usr/local/cuda/lib64)
while read -r dir; do
    [ -n "$dir" ] && lib_dirs+=("$dir")
done < <("$py" - <<'PY' 2>/dev/null || true
import glob, os
try:
    import nvidia
    for root in nvidia.__path__:
        for d in sorted(glob.glob(os.path.join(root, "*", "lib"))):
            print(d)
except ImportError:
    pass
PY
)
joined=$(IFS=:; echo "${lib_dirs[*]:-}")
export LD_LIBRARY_PATH="${joined}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [ -z "${TINYLM_CUDA_INCLUDE:-}" ] && [ ! -f /usr/local/cuda/include/cuda_bf16.h ]; then
    for dir in "${lib_dirs[@]:-}"; do
        if [ -f "$dir/../include/cuda_bf16.h" ]; then
            export TINYLM_CUDA_INCLUDE="$dir/../include"
            break
        fi
    done
fi
export TINYLM_CUDA_CACHE=${TINYLM_CUDA_CACHE:-/tmp/tinylm-ptx} PYTHONUNBUFFERED=1
{
    echo "== $(nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1)"
    echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2) x $(nproc)"
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
} | tee "$LOG/correct.log"

# The model's configuration file (PyTorch reads it too): MODEL, by default the
# TinyStories preset's as tinylm writes it.
if [ -z "${MODEL:-}" ]; then
    MODEL=$LOG/tinystories.json
    "$BIN/tinylm" info --preset tinystories --print-config >"$MODEL"
fi
echo "== 1. correct"
part correct 90 "$BIN/test-cuda_nvrtc"
part correct 150 "$BIN/test-cuda" --test-threads 1
part correct 60 "$BIN/test-accounting" --test-threads 1 --nocapture
part correct 60 env LD_LIBRARY_PATH="$BIN/lib:$LD_LIBRARY_PATH" "$BIN/test-nccl" --test-threads 1
part correct 20 "$BIN/tinylm" info --device cuda --precision bf16 --model-config "$MODEL" --batch-size 128

echo "== 2. fast"
part fast 60 "$py" bench/torch_model.py --matmul-peak
for batch in ${BATCHES:-32 128}; do
    for precision in bf16 fp32; do
        # The device's memory in use while it runs, against `tinylm info --device cuda`.
        nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 >/tmp/memory.csv 2>/dev/null &
        sampler=$!
        part fast 40 "$BIN/tinylm" bench --device cuda --precision "$precision" --model-config "$MODEL" \
            --batch-size "$batch" --steps 30 --no-peak
        kill $sampler 2>/dev/null
        echo "device memory in use, most while it ran (nvidia-smi): $(sort -n /tmp/memory.csv | tail -1) MiB" >>"$LOG/fast.log"
        "$BIN/tinylm" info --device cuda --precision "$precision" --model-config "$MODEL" --batch-size "$batch" \
            2>&1 | grep "GPU memory needed" >>"$LOG/fast.log"
    done
    part fast 150 "$py" bench/torch_model.py --bench --device cuda --config "$MODEL" --batch-size "$batch" \
        --variants eager,compile-bf16 --steps 20 --repeat 3 --warmup 3
    part fast 40 "$BIN/tinylm" bench --device cuda --precision bf16 --model-config "$MODEL" \
        --batch-size "$batch" --steps 30 --no-peak
    if [ -n "$BASE" ]; then
        for _ in 1 2; do
            part fast 40 "$BASE/tinylm" bench --device cuda --precision bf16 --model-config "$MODEL" \
                --batch-size "$batch" --steps 30 --no-peak
            part fast 40 "$BIN/tinylm" bench --device cuda --precision bf16 --model-config "$MODEL" \
                --batch-size "$batch" --steps 30 --no-peak
        done
    fi
done

if [ -n "${ATTENTION:-}" ]; then
    # $ATTENTION unquoted: split into the script's arguments; the BASE build's
    # attention kernels beside these, where it packed them.
    base_kernels=()
    [ -n "$BASE" ] && [ -f "$BASE/kernels/attention.cu" ] && base_kernels=(--cu "$BASE/kernels/attention.cu")
    part attention 75 "$py" bench/attention_gpu.py $ATTENTION ${base_kernels[@]+"${base_kernels[@]}"}
fi

echo "== 3. end to end"
if [ "$(left)" -ge 120 ]; then
    seconds=$(($(left) - 45))
    [ $seconds -gt "${TRAIN_S:-180}" ] && seconds=${TRAIN_S:-180}
    rm -rf /tmp/tinylm-train
    part train $((seconds + 40)) "$BIN/tinylm" train --device cuda --precision bf16 --model-config "$MODEL" \
        --train-data "$BIN/data/train.npy" --val-data "$BIN/data/val.npy" --tokenizer "$BIN/data/tokenizer" \
        --out-dir /tmp/tinylm-train --batch-size 128 --time-budget-s "$seconds" --schedule time \
        --eval-interval 0 --eval-batches 20 --checkpoint-interval 0 --log-interval 10 --tensorboard false
    cp /tmp/tinylm-train/log.jsonl "$LOG/train-log.jsonl" 2>/dev/null
    cp /tmp/tinylm-train/loss.svg "$LOG/train-loss.svg" 2>/dev/null
else
    echo "skipped: $(left) s of the budget left" | tee -a "$LOG/train.log"
fi

echo "== 4. each kernel's time (Nsight Compute), bf16, batch 128: the steps after the first"
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
if [ -n "$ncu" ]; then
    part kernels 120 "$ncu" --clock-control none --metrics gpu__time_duration.sum --print-summary per-kernel \
        --launch-skip 400 --launch-count 1500 "$BIN/tinylm" bench --device cuda --precision bf16 \
        --model-config "$MODEL" --batch-size 128 --steps 3 --no-peak
else
    echo "no ncu" | tee -a "$LOG/kernels.log"
fi

"$py" - "$LOG" "$BASE" <<'PY' | tee "$LOG/summary.txt"
"""The table: every figure read back from the parts' logs."""
import json, re, statistics, sys
from pathlib import Path

log = Path(sys.argv[1])
read = lambda name: (log / name).read_text() if (log / name).exists() else ""
fast, correct = read("fast.log"), read("correct.log")
peak = [json.loads(l) for l in fast.splitlines() if l.startswith('{"variant": "bf16 matmul peak"')]
peak_tflops = peak[0]["tflops"] if peak else None
print(correct.splitlines()[0] if correct else "")
for line in correct.splitlines():
    if re.match(r"test result|== FAILED", line):
        print("correct:", line)
rows = []  # (batch, name, tokens/s, GFLOP/s)
flop_per_token = {}
for run in re.split(r"(?m)^== \[", fast)[1:]:
    head = run.splitlines()[0]
    if "tinylm bench" in head:
        b = int(re.search(r"--batch-size (\d+)", head).group(1))
        p = re.search(r"--precision (\w+)", head).group(1)
        step = re.search(r"batch (\d+) x (\d+) tokens.* ([\d.]+) GFLOP per step", run)
        med = re.search(r"median\s+([\d.]+) ms\s+(\d+) tokens/s", run)
        if step and med:
            tokens = int(step.group(1)) * int(step.group(2))
            flop_per_token[b] = float(step.group(3)) * 1e9 / tokens
            who = "base" if sys.argv[2] and f"{sys.argv[2]}/tinylm bench" in head else "tinylm"
            rows.append((b, f"{who} {p}", float(med.group(2))))
    for l in run.splitlines():
        if l.startswith('{"variant": "torch'):
            r = json.loads(l)
            rows.append((r["batch_size"], r["variant"], r["tokens_per_s"]))
print(f"bf16 matrix-product peak: {peak_tflops} TFLOP/s (8192^3, PyTorch)")
print(f"{'batch':>5}  {'what':<22} {'tokens/s':>12} {'vs torch best':>13} {'MFU':>6}")
for b in sorted({r[0] for r in rows}):
    mine = [r for r in rows if r[0] == b]
    best_torch = max((r[2] for r in mine if r[1].startswith("torch")), default=None)
    for _, name, tps in mine:
        ratio = f"{tps / best_torch:.2f}x" if best_torch else "-"
        mfu = f"{tps * flop_per_token[b] / (peak_tflops * 1e12):.1%}" if peak_tflops and b in flop_per_token else "-"
        print(f"{b:>5}  {name:<22} {tps:>12,.0f} {ratio:>13} {mfu:>6}")
records = [json.loads(l) for l in read("train-log.jsonl").splitlines() if l.strip()]
rates = [r["tokens_per_s"] for r in records[1:] if r.get("tokens_per_s")]
if rates:
    rate = statistics.median(rates)
    last = records[-1]
    print(f"train (bf16, batch 128 x 256): {last.get('step')} steps, {last.get('tokens')} tokens, "
          f"median {rate:,.0f} tokens/s, last train loss {last.get('train_loss')}, val loss {last.get('val_loss')}")
    print(f"projected 327,680,000 tokens: {327_680_000 / rate / 60:.1f} min")
PY
echo "== done in $((SECONDS - START)) s; logs in $LOG"
exit "$status"
