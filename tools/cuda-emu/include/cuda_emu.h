// What a kernel module calls: the interface libcuda.so.1's block executor
// (src/block.cpp) exports to the modules it loads. Not a CUDA header: programs see
// only the CUDA driver, NVRTC and cuBLASLt entry points.
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {

struct cuemu_uint3 {
    unsigned int x, y, z;
};

/// What one GPU thread sees of itself: CUDA's four built-in index variables.
struct cuemu_thread_ids {
    cuemu_uint3 thread_idx, block_idx, block_dim, grid_dim;
};

/// The running GPU thread's indices.
const cuemu_thread_ids* cuemu_self(void);

/// `__syncthreads()`: a barrier of every thread of the block, reached at `file:line`.
void cuemu_syncthreads(const char* file, int line);

/// The warp collectives, one rendezvous of the lanes named by `mask`.
enum cuemu_warp_op {
    CUEMU_SHFL_IDX,
    CUEMU_SHFL_XOR,
    CUEMU_SHFL_DOWN,
    CUEMU_SHFL_UP,
    CUEMU_BALLOT,
    CUEMU_SYNCWARP,
};

/// One warp collective: every lane of `mask` must arrive with the same mask at the
/// same call; returns the value of the source lane (shuffles) or the vote mask.
uint64_t cuemu_warp(int op, unsigned int mask, uint64_t value, int lane_arg, int width,
                    const char* file, int line);

/// Stops the running kernel with a fault (printed, then a sticky launch error).
[[noreturn]] void cuemu_kernel_fault(const char* file, int line, const char* what);

/// A kernel as its module describes it: parameter sizes, which are pointers, and
/// the entry that unpacks `void** args` into a call.
struct cuemu_kernel_info {
    const char* name;
    int params;
    const unsigned int* sizes;
    const unsigned char* pointers;
    void (*entry)(void** args);
};
}
