// The block executor: what the driver asks of it to run a launch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cuda_emu.h"

namespace cuemu {

/// A module's `__shared__` memory: its thread-local storage (the prelude declares
/// `__shared__` variables `static thread_local`, and a module has no other), one
/// copy per worker thread, which runs one block at a time.
struct SharedMemory {
    size_t tls_module = 0;  // the module's TLS module id (0: none)
    size_t bytes = 0;       // its TLS block's size
};

/// One kernel launch, its parameter values copied at launch time.
struct Launch {
    cuemu_kernel_info kernel;
    cuemu_uint3 grid;
    cuemu_uint3 block;
    SharedMemory shared;
    uint64_t sequence = 0;          // this kernel's launches before it: picks the turns
    std::vector<uint64_t> storage;  // the parameters, each 8-byte aligned
    std::vector<void*> args;        // pointers into `storage`, as the kernel's void**
};

/// Runs every block of `launch` (blocks in parallel on the worker threads, the
/// threads of a block as fibers, in an order, and with its warps together or each
/// alone between barriers, that change from block to block); the first fault's
/// description, or "".
std::string execute(const Launch& launch);

}  // namespace cuemu
