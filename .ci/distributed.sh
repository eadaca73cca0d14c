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
# The runs are fp32 unless a check names bf16 (`auto` would pick bf16 on CPUs with
# native bf16 products only, and the fp32 trajectories agree to 1e-5).
# Usage: .ci/distributed.sh MPI_BINARY DEFAULT_BINARY. The last line counts the checks;
# any failed check ends the script (exit 1) with a line saying what failed.
set -euo pipefail
cd "$(dirname "$0")/.."
tinylm=$(realpath "$1")
plain=$(realpath "$2")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
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
# train OUT [LAUNCHER ...] -- [FLAGS ...]: a run into OUT in $precision, its output in
# OUT.out.
precision=fp32
train() {
    local out=$1 launcher=()
    shift
    while [ "$1" != -- ]; do launcher+=("$1"); shift; done
    shift
    "${launcher[@]}" "$tinylm" train "${run[@]}" --precision "$precision" --out-dir "$out" "$@" \
        >"$out.out" 2>&1 ||
        { cat "$out.out"; fail "the run $out failed"; }
}

# compare.py REFERENCE RUN FIRST_STEP [exact|bf16]: losses of steps >= FIRST_STEP and
# the final weights, within 1e-5 (relative) and 1e-4; `exact`: equal bit for bit, the
# AdamW moments too; `bf16`: within BF16_LIMITS (see the bf16 check).
cat >compare.py <<'PY'
import array, json, struct, sys
# bf16: ranks sum the gradient in another order, which moves a few weights' bf16
# copies by one bf16 unit (2^-8 relative); measured 7e-5 (losses) and 1e-4 (weights).
BF16_LIMITS = (1e-3, 1e-3)
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
exact = sys.argv[4:] == ["exact"]
bf16 = sys.argv[4:] == ["bf16"]
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
limits = (0, 0) if exact else BF16_LIMITS if bf16 else (1e-5, 1e-4)
assert loss_diff <= limits[0] and weight_diff <= limits[1], (loss_diff, weight_diff)
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
# long OUT [FLAGS ...]: such a run, in the background.
long() {
    local out=$1
    shift
    $mpirun -np 2 "$tinylm" train "${endless[@]}" --steps 1000000 --out-dir "$out" "$@" \
        >"$out.out" 2>&1 &
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

echo "== SIGTERM on mpirun: both ranks stop at the same step, with a checkpoint"
# Open MPI's mpirun passes SIGTERM on to the ranks odls_base_sigkill_timeout seconds
# after it gets it (default 1) and kills them (SIGKILL) as long after: the tiny model
# stops well within that second.
long term --checkpoint-interval 0 --zero 1
wait_for_step term 20
kill -TERM "$launcher"
ended_within 30
# mpirun exits 1 once it ended a job for a signal, whatever the ranks' statuses
# (measured with ranks that exit 0 and 3); 0 would mean it never got the signal.
[ "$launcher_status" -eq 1 ] || { cat term.out; fail "mpirun exited $launcher_status after SIGTERM"; }
if grep -E "exited on signal|error:|MPI_ABORT" term.out; then
    fail "a rank did not stop cleanly on SIGTERM"
fi
steps=$(sed -n 's/^stopped after \([0-9]*\) steps.*/\1/p' term.out)
[ -n "$steps" ] || { cat term.out; fail "rank 0 did not say where it stopped"; }
python3 - "$steps" <<'PY' || fail "the checkpoint and the log disagree on the last step"
import json, struct, sys
with open("term/checkpoint.safetensors", "rb") as f:
    header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
step = json.loads(header["__metadata__"]["step"])
last = [json.loads(l) for l in open("term/log.jsonl")][-1]
assert step == int(sys.argv[1]) == last["step"] and last["val_loss"] is not None, (step, last)
print(f"stopped at step {step}: checkpoint and log agree, the last step evaluated")
PY
# Rank 1 stopped at that step too: under ZeRO-1 each rank updates its half of the
# weights and holds its half of AdamW's moments, which the checkpoint gathers.
$mpirun -np 2 "$tinylm" train "${endless[@]}" --steps "$steps" --zero 1 --checkpoint-interval 0 \
    --out-dir term-ref >term-ref.out 2>&1 || { cat term-ref.out; fail "the reference run failed"; }
python3 compare.py term-ref term 1 exact || fail "the ranks' shards are not those of step $steps"
pass "SIGTERM stops both ranks at one step with a checkpoint"

echo "== a killed rank ends the job, naming it; the last checkpoint stays whole"
long killed --checkpoint-interval 5
wait_for_step killed 30
rank=$(pgrep -f "tinylm train .*--out-dir killed" | grep -v "^$launcher$" | tail -1)
kill -KILL "$rank"
ended_within 20
[ "$launcher_status" -ne 0 ] || fail "mpirun exited 0 after a rank was killed"
grep -E "process rank [01] .* exited on signal 9" killed.out || { cat killed.out; fail "mpirun did not name the killed rank"; }
"$tinylm" eval --checkpoint killed/checkpoint.safetensors --data val.npy --max-batches 2 ||
    fail "the last checkpoint of the killed job does not load"
pass "a killed rank ends the job within 20 s and leaves a whole checkpoint"

echo "== ranks started differently refuse to start"
status=0
$mpirun -np 1 "$tinylm" train "${run[@]}" --steps 5 --out-dir differ : \
    -np 1 "$tinylm" train "${run[@]}" --steps 5 --out-dir differ --seed 3 >differ.out 2>&1 ||
    status=$?
cat differ.out
[ "$status" -ne 0 ] || fail "ranks with different seeds ran (mpirun exited 0)"
grep -q "rank 1 has seed = 3, rank 0 has 0" differ.out || fail "the refusal does not name the key"
[ ! -e differ/checkpoint.safetensors ] || fail "ranks with different seeds wrote a checkpoint"
pass "ranks with different seeds refuse to start, naming the key"

echo "== a binary built without MPI under mpirun"
status=0
$mpirun -np 2 "$plain" train "${run[@]}" --steps 5 --out-dir plain >plain.out 2>&1 || status=$?
head -1 plain.out
[ "$status" -ne 0 ] || fail "a binary built without MPI ran under mpirun -np 2 (exit 0)"
grep -q "built without MPI" plain.out || fail "a binary built without MPI did not say so"
pass "a binary without MPI says so"

echo "distributed: $passed passed, 0 failed"
