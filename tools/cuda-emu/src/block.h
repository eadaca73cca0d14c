// The block executor: what the driver asks of it to run a launch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cuda_emu.h"

namespace cuemu {

/// One kernel launch, its parameter values copied at launch time.
struct Launch {
    cuemu_kernel_info kernel;
    cuemu_uint3 grid;
    cuemu_uint3 block;
    std::vector<uint64_t> storage;  // the parameters, each 8-byte aligned
    std::vector<void*> args;        // pointers into `storage`, as the kernel's void**
};

/// Runs every block of `launch` (blocks in parallel on the worker threads, the
/// threads of a block as fibers); the first fault's description, or "".
std::string execute(const Launch& launch);

}  // namespace cuemu
