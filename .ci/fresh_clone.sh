#!/usr/bin/env bash
# The README's first command in a copy of the checkout with nothing beside it (no
# ../shared): the quickstart trains on the corpus inside tinylm. A short budget
# (MINUTES, default 0.3); the run directory it leaves is checked. The copy holds the
# files git sees (tracked, and untracked unless ignored), so it builds the same code
# as the checkout, in its CARGO_TARGET_DIR (default target/): the workspace's crates
# build again (their sources are new files), the dependencies do not.
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=${MINUTES:-0.3}
target_dir=$(realpath -m "${CARGO_TARGET_DIR:-target}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/tinylm"
git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -xf - -C "$work/tinylm"
[ ! -e "$work/shared" ] || { echo "fresh clone: $work/shared exists" >&2; exit 1; }
cd "$work/tinylm"
CARGO_TARGET_DIR="$target_dir" cargo run --quiet --release -p tinylm-cli -- \
    quickstart --minutes "$minutes" > "$work/quickstart.txt" 2>&1 \
    || { cat "$work/quickstart.txt" >&2; exit 1; }
fail() { cat "$work/quickstart.txt" >&2; echo "fresh clone: $1" >&2; exit 1; }
grep -q "^tinylm quickstart: the TinyStories sample inside tinylm -> runs/" "$work/quickstart.txt" \
    || fail "the quickstart did not train on the embedded sample"
runs=(runs/*)
[ "${#runs[@]}" = 1 ] && [ -d "${runs[0]}" ] || fail "expected one run directory under runs/, found: ${runs[*]}"
run=${runs[0]}
for file in tokenizer/vocab.json tokenizer/merges.txt train.npy val.npy log.jsonl loss.svg \
    checkpoint.safetensors samples.txt; do
    [ -s "$run/$file" ] || fail "$run/$file is missing or empty"
done
grep -q '^--- sample 3 ---' "$run/samples.txt" || fail "$run/samples.txt lacks its third sample"
loss=$(sed -n 's/^  validation loss \([0-9.]*\),.*/\1/p' "$work/quickstart.txt")
[ -n "$loss" ] || fail "no validation loss printed"
echo "fresh clone: quickstart for $minutes min on the embedded sample, validation loss $loss, run directory $run complete"
