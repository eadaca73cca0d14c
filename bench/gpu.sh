#!/usr/bin/env bash
# The CUDA backend on a GPU machine, in one script, in two halves:
#
#   bench/gpu.sh pack        # here (Rust, no GPU): builds the CUDA test binaries and
#                            # the CLI with --features cuda into target/gpu-bin/
#   bench/gpu.sh             # on the GPU machine (no Rust needed): runs what was packed
#
# On the GPU machine it needs the NVIDIA driver (libcuda.so.1) and the CUDA 13
# libraries and headers: /usr/local/cuda (lib64: libnvrtc.so.13, libcublasLt.so.13;
# include: cuda_bf16.h), or a Python environment's nvidia/cu13 wheels
# (nvidia-cuda-nvrtc, nvidia-cuda-runtime, nvidia-cublas), found through $PYTHON.
# It runs the NVRTC compile test, the numeric suite (every kernel against the CPU,
# the whole model in fp32 and bf16, KV-cache decoding, a 200-step run, checkpoints
# across devices), then `tinylm bench --device cuda` in both precisions.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/gpu-bin}

if [ "${1:-}" = pack ]; then
    mkdir -p "$BIN"
    for test in cuda cuda_nvrtc; do
        exe=$(cargo test --release -p tinylm --features cuda --test "$test" --no-run 2>&1 |
            sed -n 's/.*Executable .*(\(.*\)).*/\1/p' | tail -1)
        cp "$exe" "$BIN/test-$test"
    done
    cargo build --release -q -p tinylm-cli --features cuda
    cp "${CARGO_TARGET_DIR:-target}/release/tinylm" "$BIN/tinylm"
    ls -la "$BIN"
    exit 0
fi

# Libraries: the toolkit, else the Python environment's wheels.
lib_dirs=()
[ -d /usr/local/cuda/lib64 ] && lib_dirs+=(/usr/local/cuda/lib64)
if [ -n "${PYTHON:-}" ] || command -v python3 >/dev/null; then
    py=${PYTHON:-python3}
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
fi
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
echo "== $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo 'nvidia-smi not found')"
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"

# Every part runs even when an earlier one fails; the exit status says if any did.
status=0
echo "== NVRTC: every kernel family for sm_80 and sm_90"
"$BIN/test-cuda_nvrtc" || status=1
echo "== numeric suite: the CUDA backend against the CPU engine"
"$BIN/test-cuda" --test-threads 1 --nocapture || status=1
echo "== tinylm bench --device cuda (CS336 TinyStories model, batch 128 x 256)"
for precision in bf16 fp32; do
    "$BIN/tinylm" bench --device cuda --precision "$precision" --model-config bench/configs/tinystories.json \
        --batch-size 128 --steps 50 --no-peak || status=1
done
exit "$status"
