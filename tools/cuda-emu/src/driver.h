// What libcuda.so.1's driver lends the emulated cuBLASLt: its streams, its map of
// device memory and its fault reporting.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

namespace cuemu {

/// Queues `work` on `stream` (a CUstream; 0 is the legacy stream). Returns a CUresult.
int enqueue(void* stream, std::function<void()> work);
/// Whether `[ptr, ptr + bytes)` lies inside one live device allocation; else a
/// sentence saying where it falls.
bool in_device_memory(uint64_t ptr, size_t bytes, std::string* why);
/// Records a fault of queued work: printed now, and the context's sticky error.
void fault(int cuda_error, const std::string& what);
/// Counts one executed cuBLASLt product.
void count_product();

}  // namespace cuemu
