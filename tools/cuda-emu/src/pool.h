// The emulator's worker threads: the blocks of a launch and the columns of a
// cuBLASLt product run on them.
#pragma once

#include <cstddef>
#include <functional>

namespace cuemu {

/// The number of worker threads (`CUDA_EMU_THREADS`, else the host's cores).
unsigned workers();

/// Runs `body(i)` for `i` in `0..n` on the worker threads; returns when all have run.
void parallel_for(size_t n, const std::function<void(size_t)>& body);

}  // namespace cuemu
