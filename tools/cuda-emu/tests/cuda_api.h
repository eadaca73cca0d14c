// What the emulator's test programs call: the driver's and NVRTC's entry points (as
// cuda.h and nvrtc.h declare them), and how a check fails.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

extern "C" {
typedef int CUresult;
typedef uint64_t CUdeviceptr;
typedef void* CUcontext;
typedef void* CUmodule;
typedef void* CUfunction;
typedef void* CUstream;
CUresult cuInit(unsigned);
CUresult cuDeviceGetCount(int*);
CUresult cuDevicePrimaryCtxRetain(CUcontext*, int);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuStreamCreate(CUstream*, unsigned);
CUresult cuStreamSynchronize(CUstream);
CUresult cuMemAllocAsync(CUdeviceptr*, size_t, CUstream);
CUresult cuMemFreeAsync(CUdeviceptr, CUstream);
CUresult cuMemGetInfo_v2(size_t*, size_t*);
CUresult cuMemHostAlloc(void**, size_t, unsigned);
CUresult cuMemsetD8Async(CUdeviceptr, unsigned char, size_t, CUstream);
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr, const void*, size_t, CUstream);
CUresult cuMemcpyDtoHAsync_v2(void*, CUdeviceptr, size_t, CUstream);
CUresult cuModuleLoadData(CUmodule*, const void*);
CUresult cuModuleGetFunction(CUfunction*, CUmodule, const char*);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, CUstream, void**, void**);
typedef void* nvrtcProgram;
int nvrtcCreateProgram(nvrtcProgram*, const char*, const char*, int, const char* const*,
                       const char* const*);
int nvrtcCompileProgram(nvrtcProgram, int, const char* const*);
int nvrtcGetPTXSize(nvrtcProgram, size_t*);
int nvrtcGetPTX(nvrtcProgram, char*);
int nvrtcGetProgramLogSize(nvrtcProgram, size_t*);
int nvrtcGetProgramLog(nvrtcProgram, char*);
}

namespace {

/// A failed check: the process exits with status 3 after saying what it saw.
[[noreturn]] void caught(const std::string& what) {
    std::printf("check failed: %s\n", what.c_str());
    std::fflush(stdout);
    std::_Exit(3);
}

void ok(CUresult r, const char* what) {
    if (r != 0) caught(std::string(what) + " returned CUDA error " + std::to_string(r));
}

}  // namespace
