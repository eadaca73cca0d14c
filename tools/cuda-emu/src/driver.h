// What libcuda.so.1's driver lends the emulated cuBLASLt and NCCL: its streams, its
// map of device memory and its fault reporting.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace cuemu {

/// Queues `work` on `stream` (a CUstream; 0 is the legacy stream). Returns a CUresult.
int enqueue(void* stream, std::function<void()> work);
/// Whether `[ptr, ptr + bytes)` lies inside one live device allocation of the device
/// whose work runs (or, outside queued work, of the current context's); else a
/// sentence saying where it falls.
bool in_device_memory(uint64_t ptr, size_t bytes, std::string* why);
/// Records a fault of queued work: printed now, and the context's sticky error.
void fault(int cuda_error, const std::string& what);
/// Counts one executed cuBLASLt product.
void count_product();
/// The calling thread's current context (a CUcontext), or null.
void* current_context();
/// The device of the calling thread's current context, or -1 when none is current.
int current_device();
/// Runs the work queued so far on `stream` of `context` (a CUstream and the
/// CUcontext it was queued in; 0 is that context's legacy stream), as a GPU runs
/// its queue without the host waiting. Returns a CUresult: the context's sticky error.
int run_stream(void* context, void* stream);

}  // namespace cuemu
