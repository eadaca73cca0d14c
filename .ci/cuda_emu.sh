#!/usr/bin/env bash
# The CUDA backend on the emulated GPU (tools/cuda-emu), on any CPU, built with
# `--features nccl` (CUDA, MPI and NCCL: the build .ci/distributed.sh runs as GPU ranks):
#   1. builds the emulator and runs its planted-fault suite, and the emulated NCCL's
#      checks and planted faults (ranks as processes, each on its own emulated GPU);
#   2. trains a tiny model for a few steps with `tinylm train --device cuda`, in fp32
#      and bf16, and in fp32 in micro-batches of 2 (the step's gradient accumulated),
#      compares every step's loss with the CPU run's and checks that it fell;
#   3. checks a run's device high-water mark against `tinylm info --device cuda`
#      (within ±10%, either way);
#   4. checks that a driver older than CUDA 13 is one clear error;
#   5. checks that the memory accounting counts every buffer and work space the
#      backend allocates, and the device's whole memory (crates/tinylm/tests/accounting.rs);
#   6. runs the unit tests behind the `cuda` and `nccl` features, then the numeric
#      suite crates/tinylm/tests/cuda/ with its assertions as on a GPU, and prints
#      how many kernels and cuBLASLt products the emulator executed;
#   7. runs crates/tinylm/tests/nccl.rs: the training step's NCCL calls through the
#      emulated libnccl.so.2 on one rank.
# The last line is cargo's `test result:` line of the numeric suite.
set -euo pipefail
cd "$(dirname "$0")/.."
emu=tools/cuda-emu
make -s -C "$emu"
stats=$(mktemp)
export CUDA_EMU_STATS=$stats
work=$(mktemp -d)
trap 'rm -rf "$work" "$stats"' EXIT

echo "== cuda-emu: planted faults"
"$emu/run.sh" "$emu/build/faults" crates/tinylm/src/kernels/cuda

echo "== cuda-emu: the emulated NCCL (tools/cuda-emu/tests/nccl.cpp)"
"$emu/run.sh" "$emu/build/nccl"

echo "== cuda-emu: tinylm train --device cuda against the CPU (fp32, bf16, micro-batches)"
cargo build --quiet --release -p tinylm-cli --features nccl
tinylm=${CARGO_TARGET_DIR:-target}/release/tinylm
python3 - "$work/tokens.npy" <<'PY'
import random, struct, sys
random.seed(12)
words = [b"the dog ", b"a cat ", b"sees ", b"likes ", b"a red ", b"the big ", b"ball. ", b"tree.\n"]
data = b"".join(random.choice(words) for _ in range(20000))
header = "{'descr': '<u2', 'fortran_order': False, 'shape': (%d,), }" % len(data)
header += " " * (63 - (10 + len(header)) % 64) + "\n"
with open(sys.argv[1], "wb") as f:
    f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
    f.write(b"".join(struct.pack("<H", b) for b in data))
PY
# train NAME FLAGS: 6 steps of a tiny model at a learning rate high enough that the
# loss falls by a quarter (5.69 to 4.28 on the CPU).
train() {
    "$emu/run.sh" "$tinylm" train --train-data "$work/tokens.npy" --out-dir "$work/$1" \
        --vocab-size 256 --context-length 32 --d-model 32 --num-layers 2 --num-heads 2 \
        --d-ff 64 --batch-size 8 --steps 6 --warmup-steps 2 --lr-max 1e-2 --log-interval 1 \
        --eval-interval 0 --checkpoint-interval 0 --threads 2 "${@:2}" >"$work/$1.out" 2>&1 ||
        { cat "$work/$1.out"; exit 1; }
}
train cpu --device cpu --precision fp32
train fp32 --device cuda --precision fp32
train bf16 --device cuda --precision bf16
train fp32-micro --device cuda --precision fp32 --micro-batch-size 2
python3 - "$work" <<'PY'
import json, sys
def losses(run):
    return [r["train_loss"] for r in map(json.loads, open(f"{sys.argv[1]}/{run}/log.jsonl"))
            if r.get("train_loss") is not None]
cpu = losses("cpu")
assert len(cpu) == 6 and cpu[-1] < 0.9 * cpu[0], cpu
# Every step's loss against the CPU run's: fp32 within 1e-4 (f32 sums in another
# order); bf16 within its unit roundoff 2^-8 (3.9e-3): a step's loss is the mean of
# 256 tokens' losses whose bf16 roundings are independent, so it errs by much less
# than one rounding (measured 2.3e-4 over the 6 steps; the numeric suite's 7.8e-2
# bounds single logits). And each run learns: its loss falls at least 90% as far as
# the CPU run's, which falls by a quarter.
for run, tol in (("fp32", 1e-4), ("bf16", 2**-8), ("fp32-micro", 1e-4)):
    gpu = losses(run)
    assert len(gpu) == len(cpu), (run, gpu)
    worst = max(abs(g - c) / c for g, c in zip(gpu, cpu))
    fell = (gpu[0] - gpu[-1]) / (cpu[0] - cpu[-1])
    print(f"{run}: {len(gpu)} steps, losses {gpu[0]:.4f} .. {gpu[-1]:.4f} (the CPU's "
          f"{cpu[0]:.4f} .. {cpu[-1]:.4f}), largest relative difference from the CPU run "
          f"{worst:.1e} (limit {tol:.0e}), fell {fell:.2f} as far as the CPU's")
    assert worst <= tol and fell >= 0.9, (run, gpu, cpu)
PY

echo "== cuda-emu: a run's device memory against tinylm info --device cuda"
# Training in micro-batches with evaluations and checkpoints, then a resume: the
# most device memory either process allocated at once (the emulator's count) is
# within ±10% of the memory model's figure. The emulator counts the bytes of each
# allocation, nothing else (no allocator slack, no program), so the two differ only
# where the model's high-water mark and the run's differ in which buffers are alive
# at once; a buffer the model forgot, or counts twice, is larger than 10%.
model=(--vocab-size 1024 --context-length 128 --d-model 128 --num-layers 2 --num-heads 4
    --d-ff 384 --batch-size 16 --micro-batch-size 8)
memory_run() {
    CUDA_EMU_STATS="$work/$1.stats" "$emu/run.sh" "$tinylm" train "${@:2}" >"$work/$1.out" 2>&1 ||
        { cat "$work/$1.out"; exit 1; }
}
memory_run first --train-data "$work/tokens.npy" --val-data "$work/tokens.npy" \
    --out-dir "$work/memory" "${model[@]}" --steps 2 --eval-interval 1 --eval-batches 2 \
    --checkpoint-interval 1 --device cuda --precision bf16 --threads 2
memory_run resumed --resume "$work/memory/checkpoint.safetensors" --steps 3
"$tinylm" info "${model[@]}" --device cuda --precision bf16 >"$work/info.txt"
python3 - "$work" <<'PY'
import re, sys
work = sys.argv[1]
units = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
number, unit = re.search(r"GPU memory needed: ([0-9.]+) (\w+)", open(f"{work}/info.txt").read()).groups()
model = float(number) * units[unit]
for run in ("first", "resumed"):
    peak = int(open(f"{work}/{run}.stats").read().split()[5])
    print(f"{run} run: most device memory at once {peak / 2**20:.2f} MiB, "
          f"tinylm info --device cuda {model / 2**20:.2f} MiB ({peak / model:.3f} of it)")
    assert 0.9 <= peak / model <= 1.1, (run, peak, model)
PY

echo "== cuda-emu: a driver older than CUDA 13 is one clear error"
if CUDA_EMU_DRIVER_VERSION=12080 "$emu/run.sh" "$tinylm" train --train-data "$work/tokens.npy" \
    --out-dir "$work/old" --device cuda --steps 1 >"$work/old.out" 2>&1; then
    echo "a CUDA 12.8 driver was accepted"; exit 1
fi
grep "CUDA 12.8" "$work/old.out"
grep -q "CUDA 13.0 or newer" "$work/old.out"

echo "== cuda-emu: accounted bytes are allocated bytes (crates/tinylm/tests/accounting.rs)"
CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="$PWD/$emu/run.sh" \
CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="$PWD/$emu/run.sh" \
    cargo test --release -p tinylm --features nccl --test accounting

export CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="$PWD/$emu/run.sh"
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="$PWD/$emu/run.sh"
echo "== cuda-emu: the unit tests behind the cuda and nccl features (src/kernels/cuda)"
cargo test --release -p tinylm --features nccl --lib kernels::cuda:: 2>&1 | tee "$work/unit.out"
grep -Eq "^test result: ok\. [1-9][0-9]* passed" "$work/unit.out"

echo "== cuda-emu: the numeric suite (crates/tinylm/tests/cuda/)"
start=$(date +%s)
cargo test --release -p tinylm --features nccl --test cuda 2>&1 | tee "$work/suite.out"
grep -q "^test result: ok" "$work/suite.out"
awk -v s="$(($(date +%s) - start))" '{ k += $2; p += $4 }
    END { printf "cuda-emu: %d kernels launched and %d cuBLASLt products executed (all steps); numeric suite %d s\n", k, p, s }' "$stats"

echo "== cuda-emu: NCCL on one rank (crates/tinylm/tests/nccl.rs)"
cargo test --release -p tinylm --features nccl --test nccl 2>&1 | tee "$work/nccl.out"
grep -q "^test result: ok" "$work/nccl.out"
grep "^test result:" "$work/suite.out" | tail -1
