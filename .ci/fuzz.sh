#!/usr/bin/env bash
# The fuzz step of CI: builds the libFuzzer targets of fuzz/ (cargo fuzz, with
# AddressSanitizer and overflow checks) and runs each for FUZZ_SECONDS seconds
# (default 20) from its committed seed corpus, fuzz/corpus/<target>. Any finding
# fails the step: a panic (a broken property, an error that does not name its
# file, memory past a reader's bound), an abort, an input that runs past 10 s, a
# leak, or more than 2 GiB resident. The crashing input is printed in hex and
# kept under <target dir>/fuzz/artifacts/<target>/.
#
#   bash .ci/fuzz.sh                          # every target, 20 s each
#   FUZZ_SECONDS=600 FUZZ_TARGETS="npy encode" bash .ci/fuzz.sh
set -euo pipefail
cd "$(dirname "$0")/.."

# cargo fuzz passes nightly-only compiler flags (-Zsanitizer=address and the
# coverage instrumentation's -C llvm-args). Only a stable toolchain is installed
# here and no other can be fetched, so RUSTC_BOOTSTRAP=1 lets the stable compiler
# accept them; it is set for this script's builds alone, never for the project's.
export RUSTC_BOOTSTRAP=1
if [ "$(cargo fuzz --version 2>/dev/null)" != "cargo-fuzz 0.13.2" ]; then
    cargo install --quiet --locked cargo-fuzz --version 0.13.2
fi

seconds="${FUZZ_SECONDS:-20}"
targets="${FUZZ_TARGETS:-$(cargo fuzz list)}"
fuzz_dir="${CARGO_TARGET_DIR:-$PWD/target}/fuzz"
# -a: debug assertions and overflow checks on, so that an overflow is a finding.
fuzz=(cargo fuzz run -a --target-dir "$fuzz_dir/build")
cargo fuzz build -a --target-dir "$fuzz_dir/build"

# The targets' scratch files (each input as the files its reader opens), in
# memory, removed at the end.
scratch=$(mktemp -d /dev/shm/tinylm-fuzz.XXXXXX 2>/dev/null || mktemp -d)
trap 'rm -rf "$scratch"' EXIT
export TINYLM_FUZZ_SCRATCH="$scratch"

failed=()
for target in $targets; do
    corpus="$fuzz_dir/corpus/$target"
    artifacts="$fuzz_dir/artifacts/$target"
    log="$fuzz_dir/$target.log"
    rm -rf "$corpus" "$artifacts"
    mkdir -p "$corpus" "$artifacts"
    start=$SECONDS
    if "${fuzz[@]}" "$target" "$corpus" "fuzz/corpus/$target" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
        -artifact_prefix="$artifacts/" -print_final_stats=1 >"$log" 2>&1; then
        runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
        echo "$target: ${runs:-?} inputs in $((SECONDS - start)) s, no finding"
    else
        echo "$target: FINDING (log: $log)" >&2
        grep -E -A25 '^(==[0-9]+==|thread .* panicked|ERROR: libFuzzer)' "$log" | head -60 >&2
        for input in "$artifacts"/*; do
            [ -f "$input" ] && { echo "input $input:" >&2; od -A d -c "$input" | head -40 >&2; }
        done
        failed+=("$target")
    fi
done
if [ "${#failed[@]}" -gt 0 ]; then
    echo "fuzzing found faults in: ${failed[*]}" >&2
    exit 1
fi
