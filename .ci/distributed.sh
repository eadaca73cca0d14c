#!/usr/bin/env bash
# Data-parallel training over MPI ranks on the CPU (Open MPI, `--features mpi`):
#   1. the same configuration follows the same trajectory whatever the launch: one
#      process (batch 8), one process in micro-batches of 2, `mpirun -np 2`, `-np 2
#      --zero 1` and `-np 4` in micro-batches of 1: every step's loss within 1e-5
#      (relative) of the one-process run's, the final weights within 1e-4; the model
#      has more parameters than one piece of the CPU's all-reduce, so the gradient
#      goes through it in two pieces;
#   2. a checkpoint of 2 ZeRO-1 ranks resumed by 1 process in micro-batches of 4
#      continues the one-process trajectory;
#   3. SIGTERM on mpirun ends both ranks at the same step, with its checkpoint:
#      gathered from both ranks' ZeRO-1 shards, it equals bit for bit a 2-rank run of
#      exactly that many steps;
#   4. a killed rank ends the job within seconds, naming the rank, and the last
#      checkpoint stays whole;
#   5. ranks started with different configurations refuse to start, naming the key;
#   6. a binary built without MPI, started by mpirun, says so and fails;
#   7. in bf16 mixed precision, 2 ranks (ZeRO-1 too) and micro-batches follow the
#      one-process bf16 trajectory within bf16 tolerances.
# Then GPU ranks: NCCL_BINARY (`--features nccl`) on the emulated GPUs of
# tools/cuda-emu, with its emulated NCCL, rank r on cuda:r of a 4-GPU machine:
#   8. `mpirun -np 2` and `-np 4`, with and without ZeRO-1, in micro-batches, in fp32
#      and bf16: every step's loss and the final weights against one emulated GPU
#      (fp32: within 1e-6 relative and 1e-5) and against the CPU ranks' run;
#   9. each rank's most device memory at once is `tinylm info --device cuda`'s figure
#      for its rank count, and ZeRO-1 saves each rank the moments of the others'
#      shards to the byte;
#  10. a checkpoint of 2 ZeRO-1 GPU ranks resumed on 1 GPU, on 4 and on the CPU
#      continues the one-GPU trajectory;
#  11. SIGTERM and a killed rank, as in 3 and 4, on GPU ranks.
# The runs are fp32 unless a check names bf16 (`auto` would pick bf16 on CPUs with
# native bf16 products only, and the fp32 trajectories agree to 1e-5).
# Usage: .ci/distributed.sh MPI_BINARY DEFAULT_BINARY NCCL_BINARY. The last line counts
# the checks; any failed check ends the script (exit 1) with a line saying what failed.
set -euo pipefail
cd "$(dirname "$0")/.."
tinylm=$(realpath "$1")
plain=$(realpath "$2")
nccl=$(realpath "$3")
make -s -C tools/cuda-emu
emu=$PWD/tools/cuda-emu/run.sh
work=$(mktemp -d)
# A run left in the background by a failed check ends with the script. The trap itself
# never fails: under `set -e` a failed `kill` of a launcher that has already exited
# would turn the script's exit status into 1 after every check passed.
trap '[ -z "${launcher:-}" ] || kill "$launcher" 2>/dev/null || true; rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
mpirun="mpirun --bind-to none"
passed=0
pass() {
    passed=$((passed + 1))
    echo "ok: $*"
}
# fail MESSAGE: the check failed. (Under `set -e` a test in `a && b` or `! a` stops
# nothing, so every check below ends in `|| fail …`.)
fail() {
    echo "FAILED: $*" >&2
    exit 1
}

python3 - "$work" <<'PY'
import random, struct, sys
random.seed(12)
words = [b"the dog ", b"a cat ", b"sees ", b"likes ", b"a red ", b"the big ", b"ball. ", b"tree.\n"]
data = b"".join(random.choice(words) for _ in range(20000))
def npy(path, tokens):
    header = "{'descr': '<u2', 'fortran_order': False, 'shape': (%d,), }" % len(tokens)
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
        f.write(b"".join(struct.pack("<H", b) for b in tokens))
npy(f"{sys.argv[1]}/train.npy", data[:100000])
npy(f"{sys.argv[1]}/val.npy", data[100000:])
PY
cd "$work"
# 164,160 parameters: more than the 131,072 values (MPI_CHUNK_ONE_NODE) of one piece
# of the CPU's all-reduce on one machine, so the gradient goes in two pieces.
model=(--vocab-size 256 --context-length 32 --d-model 64 --num-layers 2 --num-heads 4 --d-ff 256)
run=("${model[@]}" --train-data train.npy --val-data val.npy --batch-size 8 --cosine-steps 20
    --warmup-steps 2 --lr-max 3e-3 --log-interval 1 --eval-interval 10 --eval-batches 4
    --checkpoint-interval 10)
# split LAUNCHER ... -- [FLAGS ...]: the words before `--` into $launch, those after
# into $flags.
split() {
    launch=()
    while [ "$1" != -- ]; do launch+=("$1"); shift; done
    shift
    flags=("$@")
}
# train OUT [LAUNCHER ...] -- [FLAGS ...]: a run of $binary into OUT in $precision,
# its output in OUT.out.
binary=$tinylm
precision=fp32
train() {
    local out=$1
    shift
    split "$@"
    "${launch[@]}" "$binary" train "${run[@]}" --precision "$precision" --out-dir "$out" \
        "${flags[@]}" >"$out.out" 2>&1 ||
        { cat "$out.out"; fail "the run $out failed"; }
}

# compare.py REFERENCE RUN FIRST_STEP [NAME]: losses of steps >= FIRST_STEP and the
# final weights, within the bounds LIMITS[NAME] (default fp32); `exact`: equal bit for
# bit, the AdamW moments too.
cat >compare.py <<'PY'
import array, json, struct, sys
# (largest relative difference of a logged loss, largest absolute difference of a
# final weight) between two runs of one configuration, by what differs between them.
LIMITS = {
    # CPU runs in fp32: ranks and micro-batches sum in another order.
    "fp32": (1e-5, 1e-4),
    "exact": (0, 0),
    # bf16, on the CPU or on GPUs: ranks sum the gradient in another order, which moves
    # a few weights' bf16 copies by one bf16 unit (2^-8 relative); measured 7e-5
    # (losses) and 1e-4 (weights) on the CPU, 1.8e-5 and 2.2e-5 on emulated GPUs.
    "bf16": (1e-3, 1e-3),
    # fp32 on GPUs, against one GPU or the CPU: NCCL and the CPU's MPI sum the ranks'
    # f32 gradients, and each device's kernels their values, in other orders;
    # measured 8.3e-8 and 2.4e-7 over 8 steps.
    "fp32-gpu": (1e-6, 1e-5),
    # bf16 on GPUs against bf16 on the CPU: each device rounds other intermediates to
    # bf16. A loss is the mean of 256 tokens' losses whose roundings are independent,
    # well within one rounding (2^-8; measured 2.5e-4); AdamW moves a weight by up to
    # lr_max (1e-2) a step whatever its gradient's size, so a weight whose gradient
    # is near 0 may move the other way: 2 lr_max (measured 7.2e-3).
    "bf16-gpu-cpu": (2**-8, 2e-2),
}
def losses(run):
    return {r["step"]: r["train_loss"] for r in map(json.loads, open(f"{run}/log.jsonl"))}
def tensors(run, moments):
    with open(f"{run}/checkpoint.safetensors", "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, t in header.items():
        if name == "__metadata__" or (name.startswith("optim.") and not moments):
            continue
        start, end = t["data_offsets"]
        out[name] = array.array("f", data[start:end])
    return out, json.loads(header["__metadata__"]["step"])
ref, run, first = sys.argv[1], sys.argv[2], int(sys.argv[3])
limits = sys.argv[4] if len(sys.argv) > 4 else "fp32"
exact = limits == "exact"
a, b = losses(ref), losses(run)
steps = [s for s in a if s >= first]
assert steps and all(s in b for s in steps), (sorted(a), sorted(b))
loss_diff = max(abs(b[s] - a[s]) / abs(a[s]) for s in steps)
(wa, step_a), (wb, step_b) = tensors(ref, exact), tensors(run, exact)
assert step_a == step_b and wa.keys() == wb.keys(), (step_a, step_b, sorted(wa), sorted(wb))
for k in wa:
    assert len(wa[k]) == len(wb[k]), (k, len(wa[k]), len(wb[k]))
weight_diff = max(max(abs(x - y) for x, y in zip(wa[k], wb[k])) for k in wa)
what = "weights and AdamW moments" if exact else "weights"
print(f"{run}: {len(steps)} steps' losses within {loss_diff:.1e} (relative) of {ref}'s, "
      f"{what} at step {step_b} within {weight_diff:.1e}")
assert loss_diff <= LIMITS[limits][0] and weight_diff <= LIMITS[limits][1], (loss_diff, weight_diff)
PY

echo "== one trajectory whatever the launch (20 steps, batch 8)"
train one -- --steps 20 --threads 2
train micro2 -- --steps 20 --threads 2 --micro-batch-size 2
train ranks2 $mpirun -np 2 -- --steps 20 --threads 1
train zero2 $mpirun -np 2 -- --steps 20 --threads 1 --zero 1
train ranks4 $mpirun -np 4 -- --steps 20 --threads 1 --micro-batch-size 1
grep -q "2 ranks: 4 sequences each per step, in micro-batches of 4, AdamW state sharded" zero2.out ||
    fail "zero2 did not say it shards the AdamW state"
python3 - one/checkpoint.safetensors <<'PY' || fail "the model fits in one piece of the all-reduce"
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
params = sum((t["data_offsets"][1] - t["data_offsets"][0]) // 4 for name, t in header.items()
             if name != "__metadata__" and not name.startswith("optim."))
print(f"{params} parameters: the gradient's all-reduce goes in {-(-params // 131072)} pieces")
assert params > 131072, params
PY
for r in micro2 ranks2 zero2 ranks4; do
    python3 compare.py one "$r" 1 || fail "$r left the one-process trajectory"
    pass "$r follows the one-process trajectory"
done

echo "== a 2-rank ZeRO-1 checkpoint resumed by 1 process in micro-batches of 4"
train resumed $mpirun -np 2 -- --steps 10 --threads 1 --zero 1
"$tinylm" train --resume resumed/checkpoint.safetensors --steps 20 --threads 2 \
    --micro-batch-size 4 >resumed.out 2>&1 || { cat resumed.out; fail "the resume failed"; }
python3 compare.py one resumed 11 || fail "the resumed run left the one-process trajectory"
pass "the resumed run continues the one-process trajectory"

echo "== bf16 mixed precision: ranks and micro-batches follow the one-process bf16 trajectory"
precision=bf16
train one-bf16 -- --steps 20 --threads 2
train micro2-bf16 -- --steps 20 --threads 2 --micro-batch-size 2
train ranks2-bf16 $mpirun -np 2 -- --steps 20 --threads 1
train zero2-bf16 $mpirun -np 2 -- --steps 20 --threads 1 --zero 1
precision=fp32
grep -q "^training on cpu in bf16" ranks2-bf16.out || fail "ranks2-bf16 did not say it runs in bf16"
for r in micro2-bf16 ranks2-bf16 zero2-bf16; do
    python3 compare.py one-bf16 "$r" 1 bf16 || fail "$r left the one-process bf16 trajectory"
    pass "$r follows the one-process bf16 trajectory"
done

# The flags of a 2-rank run that goes on until stopped (its schedule does not depend
# on --steps).
endless=("${model[@]}" --train-data train.npy --val-data val.npy --batch-size 8
    --cosine-steps 1000000 --threads 1 --log-interval 1 --eval-interval 0 --eval-batches 2)
# long OUT LAUNCHER ... -- [FLAGS ...]: such a run of $binary, in the background; the
# launcher's pid in $launcher.
long() {
    local out=$1
    shift
    split "$@"
    "${launch[@]}" "$binary" train "${endless[@]}" --steps 1000000 --out-dir "$out" \
        "${flags[@]}" >"$out.out" 2>&1 &
    launcher=$!
}
# wait_for_step OUT STEP: until OUT's log reaches STEP (60 s at most).
wait_for_step() {
    for _ in $(seq 600); do
        [ -f "$1/log.jsonl" ] && [ "$(wc -l <"$1/log.jsonl")" -ge "$2" ] && return 0
        sleep 0.1
    done
    cat "$1.out"
    fail "$1 did not reach step $2 within 60 s"
}
# ended_within SECONDS: the launcher in the background has exited within SECONDS;
# its exit status in $launcher_status.
ended_within() {
    for _ in $(seq $(($1 * 10))); do
        if ! kill -0 "$launcher" 2>/dev/null; then
            launcher_status=0
            wait "$launcher" || launcher_status=$?
            return 0
        fi
        sleep 0.1
    done
    fail "mpirun still running $1 s later"
}

# rank_pids OUT: the pids of the ranks of the run into OUT (not its launcher's).
rank_pids() {
    pgrep -f "train .*--out-dir $1( |$)" | grep -v "^$launcher$"
}
# stopped_by_sigterm OUT STEP WHOM LAUNCHER ... -- [FLAGS ...]: a long run of 2 ZeRO-1
# ranks, SIGTERM once its log reached STEP, to WHOM: `mpirun`, which passes it on,
# or the `ranks`, as Slurm signals a job's tasks. Within 60 s both ranks stop at one
# step, evaluate and write that step's checkpoint, whose weights and moments
# (gathered from both ranks' shards) equal bit for bit those of a run of exactly that
# many steps.
stopped_by_sigterm() {
    local out=$1 step=$2 whom=$3 steps status=0
    shift 3
    long "$out" "$@" --checkpoint-interval 0 --zero 1
    wait_for_step "$out" "$step"
    if [ "$whom" = mpirun ]; then
        kill -TERM "$launcher"
        # mpirun exits 1 once it ended a job for a signal, whatever the ranks'
        # statuses (measured with ranks that exit 0 and 3); 0 would mean it never got
        # the signal.
        status=1
    else
        kill -TERM $(rank_pids "$out")
    fi
    ended_within 60
    [ "$launcher_status" -eq "$status" ] ||
        { cat "$out.out"; fail "mpirun exited $launcher_status after SIGTERM to $whom"; }
    if grep -E "exited on signal|error:|MPI_ABORT" "$out.out"; then
        fail "a rank did not stop cleanly on SIGTERM"
    fi
    steps=$(sed -n 's/^stopped after \([0-9]*\) steps.*/\1/p' "$out.out")
    [ -n "$steps" ] || { cat "$out.out"; fail "rank 0 did not say where it stopped"; }
    python3 - "$out" "$steps" <<'PY' || fail "the checkpoint and the log disagree on the last step"
import json, struct, sys
out, steps = sys.argv[1], int(sys.argv[2])
with open(f"{out}/checkpoint.safetensors", "rb") as f:
    header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
step = json.loads(header["__metadata__"]["step"])
last = [json.loads(l) for l in open(f"{out}/log.jsonl")][-1]
assert step == steps == last["step"] and last["val_loss"] is not None, (step, last)
print(f"stopped at step {step}: checkpoint and log agree, the last step evaluated")
PY
    # Rank 1 stopped at that step too: under ZeRO-1 each rank updates its half of the
    # weights and holds its half of AdamW's moments, which the checkpoint gathers.
    split "$@"
    "${launch[@]}" "$binary" train "${endless[@]}" --steps "$steps" --zero 1 \
        --checkpoint-interval 0 --out-dir "$out-ref" "${flags[@]}" >"$out-ref.out" 2>&1 ||
        { cat "$out-ref.out"; fail "the reference run failed"; }
    python3 compare.py "$out-ref" "$out" 1 exact || fail "the ranks' shards are not those of step $steps"
}

# killed_rank OUT STEP RANK LAUNCHER ... -- [FLAGS ...]: a long run of 2 ranks,
# checkpoints every 5 steps; once its log reached STEP, rank RANK killed (SIGKILL): the
# job ends within 20 s, mpirun naming the rank, and the last checkpoint loads.
killed_rank() {
    local out=$1 step=$2 rank=$3 pid
    shift 3
    long "$out" "$@" --checkpoint-interval 5
    wait_for_step "$out" "$step"
    # The rank's process: the one of the run's whose environment says its rank.
    for pid in $(rank_pids "$out"); do
        tr '\0' '\n' <"/proc/$pid/environ" | grep -qx "OMPI_COMM_WORLD_RANK=$rank" && break
    done
    kill -KILL "$pid"
    ended_within 20
    [ "$launcher_status" -ne 0 ] || fail "mpirun exited 0 after a rank was killed"
    grep -E "process rank $rank .* exited on signal 9" "$out.out" ||
        { cat "$out.out"; fail "mpirun did not name the killed rank"; }
    "$tinylm" eval --checkpoint "$out/checkpoint.safetensors" --data val.npy --max-batches 2 ||
        fail "the last checkpoint of the killed job does not load"
}

echo "== SIGTERM on mpirun: both ranks stop at the same step, with a checkpoint"
# Open MPI's mpirun passes SIGTERM on to the ranks odls_base_sigkill_timeout seconds
# after it gets it (default 1) and kills them (SIGKILL) as long after: the tiny model
# stops well within that second.
stopped_by_sigterm term 20 mpirun $mpirun -np 2 --
pass "SIGTERM stops both ranks at one step with a checkpoint"

echo "== a killed rank ends the job, naming it; the last checkpoint stays whole"
killed_rank killed 30 1 $mpirun -np 2 --
pass "a killed rank ends the job within 20 s and leaves a whole checkpoint"

# refused OUT TEXT COMMAND ...: COMMAND fails, saying TEXT (its output in OUT.out).
refused() {
    local out=$1 text=$2 status=0
    shift 2
    "$@" >"$out.out" 2>&1 || status=$?
    [ "$status" -ne 0 ] || { cat "$out.out"; fail "$out ran (exit 0)"; }
    grep -F "$text" "$out.out" || { cat "$out.out"; fail "$out did not say: $text"; }
}

echo "== ranks started differently refuse to start"
refused differ "rank 1 has seed = 3, rank 0 has 0" \
    $mpirun -np 1 "$tinylm" train "${run[@]}" --steps 5 --out-dir differ : \
    -np 1 "$tinylm" train "${run[@]}" --steps 5 --out-dir differ --seed 3
[ ! -e differ/checkpoint.safetensors ] || fail "ranks with different seeds wrote a checkpoint"
pass "ranks with different seeds refuse to start, naming the key"

echo "== a binary built without MPI under mpirun"
refused plain "built without MPI" $mpirun -np 2 "$plain" train "${run[@]}" --steps 5 --out-dir plain
pass "a binary without MPI says so"

# ---- GPU ranks: NCCL_BINARY on emulated GPUs (tools/cuda-emu) and its emulated
# libnccl.so.2; the emulated machine has 4 GPUs, and rank r takes cuda:r.
export CUDA_EMU_DEVICES=4
binary=$nccl
# 51,954 parameters: 4 ranks do not divide them, so ZeRO-1's shards differ by one
# value (12,989 on ranks 0 and 1, 12,988 on ranks 2 and 3).
model=(--vocab-size 256 --context-length 32 --d-model 42 --num-layers 2 --num-heads 3 --d-ff 64)
run=("${model[@]}" --train-data train.npy --val-data val.npy --batch-size 8 --cosine-steps 20
    --warmup-steps 2 --lr-max 1e-2 --log-interval 1 --eval-interval 4 --eval-batches 1
    --checkpoint-interval 4 --threads 1)
gpu=(--device cuda --steps 8)
# gpu_ranks OUT RANKS [FLAGS ...]: 8 steps on RANKS emulated GPUs, the emulator's
# counts of each rank in OUT.stats.
gpu_ranks() {
    local out=$1 ranks=$2
    shift 2
    train "$out" env CUDA_EMU_STATS="$PWD/$out.stats" $mpirun -np "$ranks" "$emu" -- "${gpu[@]}" "$@"
}

echo "== GPU ranks: -np 2 and 4, ZeRO-1, micro-batches, against one GPU and the CPU ranks"
for precision in fp32 bf16; do
    train "g1-$precision" "$emu" -- "${gpu[@]}"
    gpu_ranks "g2-$precision" 2 --micro-batch-size 2
    gpu_ranks "g2z-$precision" 2 --micro-batch-size 2 --zero 1
    gpu_ranks "g4-$precision" 4 --micro-batch-size 1
    gpu_ranks "g4z-$precision" 4 --micro-batch-size 1 --zero 1
    train "c2-$precision" $mpirun -np 2 -- --device cpu --steps 8
    grep -q "^training on cuda:0 in $precision" "g4z-$precision.out" ||
        fail "g4z-$precision did not say it runs on cuda:0 in $precision"
    same=fp32-gpu cpu=fp32-gpu
    [ "$precision" = fp32 ] || same=bf16 cpu=bf16-gpu-cpu
    for r in g2 g2z g4 g4z; do
        python3 compare.py "g1-$precision" "$r-$precision" 1 "$same" ||
            fail "$r-$precision left the one-GPU trajectory"
        python3 compare.py "c2-$precision" "$r-$precision" 1 "$cpu" ||
            fail "$r-$precision left the CPU ranks' trajectory"
        pass "$r-$precision follows the one-GPU and the CPU ranks' trajectories"
    done
done
precision=fp32

echo "== GPU ranks: each rank's device memory is tinylm info --device cuda's, ZeRO-1's moments a shard"
# The emulator counts the bytes of each allocation (no allocator slack, no CUDA
# context): a rank's most at once equals the memory model's figure for its rank count
# and micro-batch to the precision `tinylm info` prints (3 digits), and ZeRO-1 takes
# from each rank exactly the 8 bytes a parameter of the moments outside its shard.
for precision in fp32 bf16; do
    for launch in "2 2" "4 1"; do
        read -r ranks micro <<<"$launch"
        for zero in 0 1; do
            "$nccl" info "${model[@]}" --batch-size 8 --ranks "$ranks" --micro-batch-size "$micro" \
                --zero "$zero" --device cuda --precision "$precision" >"info-$ranks-$zero-$precision.txt"
        done
        python3 - "$ranks" "$precision" <<'PY' || fail "the ranks' device memory is not tinylm info's"
import re, sys
ranks, precision = int(sys.argv[1]), sys.argv[2]
units = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
def info(zero):
    text = open(f"info-{ranks}-{zero}-{precision}.txt").read()
    number, unit = re.search(r"GPU memory needed: ([0-9.]+) (\w+)", text).groups()
    half = 0.5 * 10 ** -len(number.partition(".")[2]) * units[unit]
    params = int(re.search(r"^  total +([0-9,]+) +\(", text, re.M).group(1).replace(",", ""))
    return float(number) * units[unit], half, params
def peaks(run):
    lines = [l.split() for l in open(f"{run}.stats")]
    return {int(l[7]): int(l[5]) for l in lines}
run = {2: "g2", 4: "g4"}[ranks]
for zero, suffix in ((0, ""), (1, "z")):
    figure, half, params = info(zero)
    got = peaks(f"{run}{suffix}-{precision}")
    assert sorted(got) == list(range(ranks)), f"the ranks' devices are {sorted(got)}, not cuda:0 to cuda:{ranks - 1}"
    for rank, peak in sorted(got.items()):
        print(f"{run}{suffix}-{precision} rank {rank} (cuda:{rank}): most at once {peak:,} bytes, "
              f"tinylm info {figure / 2**20:.1f} MiB")
        assert abs(peak - figure) <= half, (rank, peak, figure, half)
whole, sharded = peaks(f"{run}-{precision}"), peaks(f"{run}z-{precision}")
for rank in range(ranks):
    shard = params // ranks + (rank < params % ranks)
    saved = whole[rank] - sharded[rank]
    print(f"rank {rank}: ZeRO-1 saves {saved:,} bytes, the moments of {params - shard:,} parameters")
    assert saved == 8 * (params - shard), (rank, saved, params, shard)
PY
        pass "$ranks GPU ranks in $precision: each rank's device memory is tinylm info's"
    done
done
precision=fp32

echo "== GPU ranks: an NCCL older than 2.13, or fewer GPUs than ranks, is one line a rank"
refused old-nccl "error: rank 0: libnccl.so.2 is NCCL 2.12.12; tinylm needs NCCL 2.13.0 or newer" \
    env CUDA_EMU_NCCL_VERSION=21212 $mpirun -np 2 "$emu" "$nccl" train "${run[@]}" --device cuda \
    --steps 1 --out-dir old-nccl
refused one-gpu "error: rank 1: cuda:1 does not exist: this machine has 1 CUDA device(s)" \
    env CUDA_EMU_DEVICES=1 $mpirun -np 2 "$emu" "$nccl" train "${run[@]}" --device cuda \
    --steps 1 --out-dir one-gpu
pass "an old NCCL and a missing GPU are refused, naming them"

echo "== a checkpoint of 2 ZeRO-1 GPU ranks resumed on 1 GPU, on 4 and on the CPU"
train g2z-4 $mpirun -np 2 "$emu" -- --device cuda --steps 4 --zero 1
# resumed OUT LAUNCHER ... -- [FLAGS ...]: g2z-4's run directory copied to OUT and
# resumed there to step 8.
resumed() {
    local out=$1
    shift
    split "$@"
    cp -r g2z-4 "$out"
    "${launch[@]}" "$binary" train --resume "$out/checkpoint.safetensors" --out-dir "$out" \
        --steps 8 "${flags[@]}" >"$out.out" 2>&1 || { cat "$out.out"; fail "the resume $out failed"; }
}
resumed g2z-4-on-1 "$emu" --
resumed g2z-4-on-4 $mpirun -np 4 "$emu" -- --micro-batch-size 1
resumed g2z-4-on-cpu -- --device cpu --threads 2
for r in g2z-4-on-1 g2z-4-on-4 g2z-4-on-cpu; do
    python3 compare.py g1-fp32 "$r" 5 fp32-gpu || fail "$r left the one-GPU trajectory"
    pass "$r continues the one-GPU trajectory"
done

endless=("${model[@]}" --train-data train.npy --val-data val.npy --batch-size 8
    --cosine-steps 1000000 --threads 1 --log-interval 1 --eval-interval 0 --eval-batches 2
    --device cuda)
echo "== GPU ranks: SIGTERM to the ranks stops both at one step, with its checkpoint"
# To the ranks, as Slurm signals a job: mpirun would pass it on only after
# odls_base_sigkill_timeout and kill as long after, too soon for an emulated GPU.
stopped_by_sigterm g-term 5 ranks $mpirun -np 2 "$emu" --
pass "SIGTERM stops both GPU ranks at one step with a checkpoint"

echo "== GPU ranks: a killed rank ends the job; the survivor says which rank died, or mpirun does"
# Rank 0 killed, the one that writes checkpoints. Where rank 1 waits in a collective
# of the step, the emulated NCCL fails it within 0.1 s and rank 1 says so in one
# line of its own; where rank 1 waits in MPI (the host's share of the step), mpirun
# ends it, having said which rank died.
killed_rank g-killed 8 0 $mpirun -np 2 "$emu" --
grep "^error: rank" g-killed.out >g-killed.errors || true
[ "$(wc -l <g-killed.errors)" -le 1 ] &&
    ! grep -v -E "^error: rank 1: NCCL .*rank 0 \(pid [0-9]+, cuda:0\) exited" g-killed.errors ||
    { cat g-killed.out; fail "rank 1 said more than one line, or not which rank died"; }
pass "a killed GPU rank ends the job within 20 s, the survivor says nothing else, the checkpoint stays whole"

echo "distributed: $passed passed, 0 failed"
