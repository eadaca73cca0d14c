#!/usr/bin/env bash
# Runs a command on the emulated GPU: the emulator's libcuda.so.1, libnvrtc.so.13
# and libcublasLt.so.13 first on LD_LIBRARY_PATH, AddressSanitizer preloaded (the
# kernel modules are built with it), the kernel prelude as the CUDA include
# directory, and the caches under build/. Use it as cargo's runner:
#   CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER=tools/cuda-emu/run.sh cargo test ...
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [ ! -e "$here/build/lib/libcuda.so.1" ]; then
    echo "cuda-emu: not built: run make -C $here" >&2
    exit 2
fi
asan=$("${CXX:-g++}" -print-file-name=libasan.so)
export LD_LIBRARY_PATH="$here/build/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LD_PRELOAD="$asan${LD_PRELOAD:+:$LD_PRELOAD}"
export ASAN_OPTIONS="detect_leaks=0:detect_odr_violation=0:abort_on_error=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export TINYLM_CUDA_INCLUDE="$here/build/include"
export TINYLM_CUDA_CACHE="${TINYLM_CUDA_CACHE:-$here/build/ptx}"
export CUDA_EMU_CACHE="${CUDA_EMU_CACHE:-$here/build/modules}"
exec "$@"
