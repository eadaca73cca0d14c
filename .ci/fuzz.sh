#!/usr/bin/env bash
# The fuzz step of CI: builds the libFuzzer targets of fuzz/ (cargo fuzz, with
# AddressSanitizer and overflow checks) and runs each from its committed seed
# corpus, fuzz/corpus/<target>, until it has executed at least its number of inputs
# (RUNS below: sized so that each takes about 20-40 s of one core, the slow ones —
# a regex compiled per input, six encoders, two trainings — thousands of inputs),
# as many targets at a time as there are cores. Each prints how many inputs it ran
# and in how long. Any finding fails the step: a panic (a broken property, an error
# that does not name its file, memory past a reader's bound), an abort, an input
# that runs past 10 s, a leak, or more than 2 GiB resident. The crashing input is
# printed in hex and kept under <target dir>/fuzz/artifacts/<target>/.
#
#   bash .ci/fuzz.sh                                   # every target, its RUNS inputs
#   FUZZ_SECONDS=600 FUZZ_TARGETS="npy encode" bash .ci/fuzz.sh   # some, for a time
set -euo pipefail
cd "$(dirname "$0")/.."

# The inputs each target runs at least: its measured cost per input under the
# sanitizers (fuzz/README.md) times about 20 s, and at least 2,000.
declare -A RUNS=(
    [checkpoint]=10000 [encode]=2000 [gpt2_files]=20000 [hf_import]=6000
    [npy]=100000 [pattern]=2000 [pretokenize]=2000 [serve_request]=100000
    [sweep]=50000 [tiktoken]=25000 [tokenizer_json]=10000 [train_bpe]=3000
    [train_config]=20000 [weights]=8000
)

# cargo fuzz passes nightly-only compiler flags (-Zsanitizer=address and the
# coverage instrumentation's -C llvm-args). Only a stable toolchain is installed
# here and no other can be fetched, so RUSTC_BOOTSTRAP=1 lets the stable compiler
# accept them; it is set for this script's builds alone, never for the project's.
export RUSTC_BOOTSTRAP=1
if [ "$(cargo fuzz --version 2>/dev/null)" != "cargo-fuzz 0.13.2" ]; then
    cargo install --quiet --locked cargo-fuzz --version 0.13.2
fi

targets="${FUZZ_TARGETS:-$(cargo fuzz list)}"
fuzz_dir="${CARGO_TARGET_DIR:-$PWD/target}/fuzz"
# -a: debug assertions and overflow checks on, so that an overflow is a finding.
cargo fuzz build -a --target-dir "$fuzz_dir/build"
for target in $targets; do
    [ -n "${FUZZ_SECONDS:-}" ] || [ -n "${RUNS[$target]:-}" ] ||
        { echo "fuzz: no RUNS entry for the target $target in .ci/fuzz.sh" >&2; exit 1; }
done

# The targets' scratch files (each input as the files its reader opens), in
# memory, removed at the end.
scratch=$(mktemp -d /dev/shm/tinylm-fuzz.XXXXXX 2>/dev/null || mktemp -d)
trap 'rm -rf "$scratch"' EXIT
export TINYLM_FUZZ_SCRATCH="$scratch"

# fuzz_one TARGET: runs it; prints its line (and on a finding, what it found) and
# leaves TARGET.failed in the scratch directory.
fuzz_one() {
    local target=$1
    local corpus="$fuzz_dir/corpus/$target" artifacts="$fuzz_dir/artifacts/$target"
    local log="$fuzz_dir/$target.log" limit start=$SECONDS
    rm -rf "$corpus" "$artifacts"
    mkdir -p "$corpus" "$artifacts"
    if [ -n "${FUZZ_SECONDS:-}" ]; then
        limit=-max_total_time="$FUZZ_SECONDS"
    else
        limit=-runs="${RUNS[$target]}"
    fi
    if cargo fuzz run -a --target-dir "$fuzz_dir/build" "$target" "$corpus" \
        "fuzz/corpus/$target" -- "$limit" -timeout=10 -rss_limit_mb=2048 \
        -artifact_prefix="$artifacts/" -print_final_stats=1 >"$log" 2>&1; then
        local runs
        runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
        echo "$target: ${runs:-?} inputs in $((SECONDS - start)) s (${limit#-}), no finding"
    else
        {
            echo "$target: FINDING (log: $log)"
            grep -E -A25 '^(==[0-9]+==|thread .* panicked|ERROR: libFuzzer)' "$log" | head -60
            for input in "$artifacts"/*; do
                [ -f "$input" ] && { echo "input $input:"; od -A d -c "$input" | head -40; }
            done
        } >&2
        touch "$scratch/$target.failed"
    fi
}

# Each target is one process on one core: as many at a time as there are cores.
running=0
for target in $targets; do
    fuzz_one "$target" &
    running=$((running + 1))
    if [ "$running" -ge "$(nproc)" ]; then
        wait -n || true
        running=$((running - 1))
    fi
done
wait
failed=()
for marker in "$scratch"/*.failed; do
    [ -e "$marker" ] && failed+=("$(basename "$marker" .failed)")
done
if [ "${#failed[@]}" -gt 0 ]; then
    echo "fuzzing found faults in: ${failed[*]}" >&2
    exit 1
fi
