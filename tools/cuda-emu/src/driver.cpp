// libcuda.so.1 of the emulated GPU: the CUDA driver entry points tinylm reaches
// (through cudarc), on host memory and host threads.
//
// Streams are queues: work is queued by launches, asynchronous copies, memsets,
// stream-ordered frees and cuBLASLt products, and runs only when the host
// synchronizes (a stream or event synchronization, a blocking copy, a context
// synchronization). A host read that misses its wait sees memory as it was before
// the work: poisoned (0xff bytes, a NaN in f32 and bf16) when never written.
// Device memory is host memory from the (AddressSanitizer) allocator, so a kernel
// that reads or writes outside its buffers is reported by AddressSanitizer; a
// pointer argument outside every live allocation of the kernel's device is an
// illegal address.
//
// The driver offers `CUDA_EMU_DEVICES` devices (default 1). Each has its primary
// context with its own legacy stream, memory count and sticky error; a stream
// belongs to the context current when it was created, and its work runs on that
// device.

#include "driver.h"

#include <dlfcn.h>
#include <link.h>

#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "block.h"
#include "build.h"
#include "pool.h"

typedef int CUresult;
typedef int CUdevice;
typedef uint64_t CUdeviceptr;

enum : CUresult {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_IMAGE = 200,
    CUDA_ERROR_INVALID_CONTEXT = 201,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_FOUND = 500,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_ILLEGAL_ADDRESS = 700,
    CUDA_ERROR_LAUNCH_FAILED = 719,
    CUDA_ERROR_NOT_SUPPORTED = 801,
};

namespace cuemu {
namespace {

struct Context;

struct Stream {
    Context* ctx = nullptr;  // the device's context it belongs to
    std::deque<std::function<void()>> queue;
    uint64_t enqueued = 0;
    uint64_t done = 0;
    bool blocking = true;  // synchronizes with the legacy stream
};

/// A device's primary context.
struct Context {
    int device = 0;
    Stream legacy;                    // the legacy stream (handle 0)
    CUresult sticky = CUDA_SUCCESS;   // the first fault of its work
    size_t bytes = 0;                 // device memory allocated now
    size_t peak = 0;                  // the most allocated at once
};

struct Event {
    Stream* stream = nullptr;
    uint64_t seq = 0;
    double time_ms = 0;
};

struct Region {
    size_t size;
    bool pinned;
    int device;  // whose memory it is (pinned memory: -1, every device's)
};

struct Module {
    void* handle;
    SharedMemory shared;
    std::map<std::string, cuemu_kernel_info> functions;
};

struct Function {
    cuemu_kernel_info info;
    SharedMemory shared;
};

std::recursive_mutex g_lock;
bool g_initialized = false;
std::vector<Context*> g_contexts;  // by device ordinal, made by cuInit
thread_local Context* tl_current = nullptr;
Context* g_running = nullptr;  // the context whose queued work runs now
std::set<Stream*> g_streams;
std::set<Event*> g_events;
std::map<uint64_t, Region> g_regions;
uint64_t g_kernels = 0;
std::map<std::string, uint64_t> g_launches_of;  // launches executed, by kernel
uint64_t g_products = 0;
std::map<std::string, double> g_kernel_seconds;  // by kernel, with CUDA_EMU_PROFILE
const auto g_start = std::chrono::steady_clock::now();

using Guard = std::lock_guard<std::recursive_mutex>;

size_t total_memory() {
    const char* mb = std::getenv("CUDA_EMU_MEMORY_MB");
    return (mb ? size_t(std::atoll(mb)) : size_t(16) << 10) << 20;
}

void parse_capability(int* major, int* minor) {
    const char* cc = std::getenv("CUDA_EMU_COMPUTE_CAPABILITY");
    *major = 9;
    *minor = 0;
    if (cc) std::sscanf(cc, "%d.%d", major, minor);
}

/// The number of devices `CUDA_EMU_DEVICES` asks for (default 1); 0 when it is not
/// a number from 1 to 64.
int device_count() {
    const char* n = std::getenv("CUDA_EMU_DEVICES");
    if (n == nullptr) return 1;
    char* end;
    long count = std::strtol(n, &end, 10);
    return *n != '\0' && *end == '\0' && count >= 1 && count <= 64 ? int(count) : 0;
}

bool valid_device(CUdevice device) { return device >= 0 && size_t(device) < g_contexts.size(); }

/// Prints the emulator's counts at exit (to `$CUDA_EMU_STATS` when set): the most
/// device memory one device had allocated at once, and which device.
struct Counts {
    ~Counts() {
        if (const char* path = std::getenv("CUDA_EMU_STATS")) {
            if (FILE* f = std::fopen(path, "a")) {
                const Context* most = nullptr;
                for (const Context* c : g_contexts) {
                    if (most == nullptr || c->peak > most->peak) most = c;
                }
                std::fprintf(f, "kernels %llu products %llu peak_device_bytes %llu device %d\n",
                             (unsigned long long)g_kernels, (unsigned long long)g_products,
                             (unsigned long long)(most ? most->peak : 0), most ? most->device : 0);
                std::fclose(f);
            }
        }
        if (std::getenv("CUDA_EMU_PROFILE")) {
            for (const auto& [name, seconds] : g_kernel_seconds) {
                std::fprintf(stderr, "cuda-emu: %8.3f s  %s\n", seconds, name.c_str());
            }
        }
    }
} g_counts;

void run_queued(Stream* s, uint64_t upto) {
    Context* outer = g_running;
    g_running = s->ctx;
    while (s->done < upto) {
        auto work = std::move(s->queue.front());
        s->queue.pop_front();
        s->done++;
        if (s->ctx->sticky == CUDA_SUCCESS) work();
    }
    g_running = outer;
}

/// Runs the work queued on every stream of context `c`.
void run_all(Context* c) {
    run_queued(&c->legacy, c->legacy.enqueued);
    for (Stream* s : g_streams) {
        if (s->ctx == c) run_queued(s, s->enqueued);
    }
}

/// The stream of `handle` in context `c`: 0 is its legacy stream (as are 0x1
/// CU_STREAM_LEGACY and 0x2 CU_STREAM_PER_THREAD); null for no stream.
Stream* stream_of(void* handle, Context* c = tl_current) {
    if (handle == nullptr || handle == (void*)1 || handle == (void*)2) {
        return c ? &c->legacy : nullptr;
    }
    auto* s = static_cast<Stream*>(handle);
    return g_streams.count(s) ? s : nullptr;
}

const Region* region_of(uint64_t ptr, uint64_t* start) {
    auto it = g_regions.upper_bound(ptr);
    if (it == g_regions.begin()) return nullptr;
    --it;
    *start = it->first;
    return &it->second;
}

bool is_pinned(const void* p, size_t bytes) {
    uint64_t start;
    const Region* r = region_of(reinterpret_cast<uint64_t>(p), &start);
    return r && r->pinned && reinterpret_cast<uint64_t>(p) + bytes <= start + r->size;
}

/// The result of an API call that needs an initialized driver and a current context.
CUresult ready() {
    if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
    return tl_current ? tl_current->sticky : CUDA_ERROR_INVALID_CONTEXT;
}

void* poisoned(size_t bytes, size_t alignment) {
    void* p = nullptr;
    if (posix_memalign(&p, alignment, bytes ? bytes : 1) != 0) return nullptr;
    std::memset(p, 0xff, bytes);
    return p;
}

/// Allocates `bytes` on the current context's device.
CUresult alloc_device(CUdeviceptr* out, size_t bytes) {
    if (out == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    Context* c = tl_current;
    if (c->bytes + bytes > total_memory()) return CUDA_ERROR_OUT_OF_MEMORY;
    void* p = poisoned(bytes, 256);
    if (p == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
    g_regions[reinterpret_cast<uint64_t>(p)] = {bytes, false, c->device};
    c->bytes += bytes;
    c->peak = std::max(c->peak, c->bytes);
    *out = reinterpret_cast<uint64_t>(p);
    return CUDA_SUCCESS;
}

CUresult free_device(CUdeviceptr ptr) {
    auto it = g_regions.find(ptr);
    if (it == g_regions.end() || it->second.pinned) return CUDA_ERROR_INVALID_VALUE;
    g_contexts[size_t(it->second.device)]->bytes -= it->second.size;
    g_regions.erase(it);
    std::free(reinterpret_cast<void*>(ptr));
    return CUDA_SUCCESS;
}

/// The `__shared__` memory of the loaded module `handle`: its TLS module id and the
/// size of its PT_TLS segment.
SharedMemory shared_memory_of(void* handle) {
    SharedMemory shared;
    if (dlinfo(handle, RTLD_DI_TLS_MODID, &shared.tls_module) != 0 || shared.tls_module == 0) {
        return {};
    }
    dl_iterate_phdr(
        [](dl_phdr_info* info, size_t, void* data) {
            auto* s = static_cast<SharedMemory*>(data);
            if (info->dlpi_tls_modid != s->tls_module) return 0;
            for (int i = 0; i < info->dlpi_phnum; i++) {
                if (info->dlpi_phdr[i].p_type == PT_TLS) s->bytes = info->dlpi_phdr[i].p_memsz;
            }
            return 1;
        },
        &shared);
    return shared;
}

CUresult check_device_range(CUdeviceptr ptr, size_t bytes) {
    std::string why;
    return in_device_memory(ptr, bytes, &why) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

}  // namespace

bool in_device_memory(uint64_t ptr, size_t bytes, std::string* why) {
    Guard g(g_lock);  // NCCL's calls check their buffers outside queued work
    uint64_t start;
    const Region* r = region_of(ptr, &start);
    char buf[200];
    if (r == nullptr || r->pinned || ptr >= start + r->size + (bytes == 0)) {
        std::snprintf(buf, sizeof buf, "0x%llx is in no live device allocation",
                      (unsigned long long)ptr);
        *why = buf;
        return false;
    }
    const Context* device = g_running ? g_running : tl_current;
    if (device && r->device != device->device) {
        std::snprintf(buf, sizeof buf, "0x%llx is memory of cuda:%d, the work runs on cuda:%d",
                      (unsigned long long)ptr, r->device, device->device);
        *why = buf;
        return false;
    }
    if (ptr + bytes > start + r->size) {
        std::snprintf(buf, sizeof buf,
                      "0x%llx + %zu bytes ends %llu bytes past its allocation of %zu bytes",
                      (unsigned long long)ptr, bytes,
                      (unsigned long long)(ptr + bytes - start - r->size), r->size);
        *why = buf;
        return false;
    }
    return true;
}

void fault(int cuda_error, const std::string& what) {
    std::fprintf(stderr, "cuda-emu: FAULT: %s\n", what.c_str());
    Context* c = g_running ? g_running : tl_current;
    if (c && c->sticky == CUDA_SUCCESS) c->sticky = cuda_error;
}

void count_product() { g_products++; }

int enqueue(void* handle, std::function<void()> work) {
    Guard g(g_lock);
    if (CUresult r = ready()) return r;
    Stream* s = stream_of(handle);
    if (s == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    // The legacy stream waits for every blocking stream of its context, and they
    // wait for it.
    Stream* legacy = &s->ctx->legacy;
    if (s == legacy) {
        for (Stream* other : g_streams) {
            if (other->ctx == s->ctx && other->blocking && other->done < other->enqueued) {
                uint64_t upto = other->enqueued;
                s->queue.push_back([other, upto] { run_queued(other, upto); });
                s->enqueued++;
            }
        }
    } else if (s->blocking && legacy->done < legacy->enqueued) {
        uint64_t upto = legacy->enqueued;
        s->queue.push_back([legacy, upto] { run_queued(legacy, upto); });
        s->enqueued++;
    }
    s->queue.push_back(std::move(work));
    s->enqueued++;
    return CUDA_SUCCESS;
}

void* current_context() { return tl_current; }

int current_device() { return tl_current ? tl_current->device : -1; }

int run_stream(void* context, void* handle) {
    Guard g(g_lock);
    auto* c = static_cast<Context*>(context);
    if (std::find(g_contexts.begin(), g_contexts.end(), c) == g_contexts.end()) {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    Stream* s = stream_of(handle, c);
    if (s == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    run_queued(s, s->enqueued);
    return s->ctx->sticky;
}

}  // namespace cuemu

using namespace cuemu;

#define API extern "C" __attribute__((visibility("default")))

// ---- Versions, devices, contexts.

API CUresult cuInit(unsigned int flags) {
    Guard g(g_lock);
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (g_initialized) return CUDA_SUCCESS;
    int count = device_count();
    if (count == 0) {
        std::fprintf(stderr, "cuda-emu: CUDA_EMU_DEVICES=%s is not a number of devices from 1 "
                             "to 64\n", std::getenv("CUDA_EMU_DEVICES"));
        return CUDA_ERROR_NO_DEVICE;
    }
    for (int d = 0; d < count; d++) {
        auto* c = new Context();
        c->device = d;
        c->legacy.ctx = c;
        g_contexts.push_back(c);
    }
    g_initialized = true;
    return CUDA_SUCCESS;
}

API CUresult cuDriverGetVersion(int* version) {
    if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const char* v = std::getenv("CUDA_EMU_DRIVER_VERSION");
    *version = v ? std::atoi(v) : 13000;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetCount(int* count) {
    if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *count = int(g_contexts.size());
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGet(CUdevice* device, int ordinal) {
    if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!valid_device(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetName(char* name, int len, CUdevice device) {
    if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!valid_device(device)) return CUDA_ERROR_INVALID_DEVICE;
    if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    std::snprintf(name, size_t(len), "cuda-emu (an emulated GPU on the CPU)");
    return CUDA_SUCCESS;
}

API CUresult cuDeviceGetAttribute(int* value, int attribute, CUdevice device) {
    if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!valid_device(device)) return CUDA_ERROR_INVALID_DEVICE;
    if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
    int major, minor;
    parse_capability(&major, &minor);
    switch (attribute) {
        case 1: *value = 1024; break;        // max threads per block
        case 2: case 3: *value = 1024; break;  // max block dim x, y
        case 4: *value = 64; break;          // max block dim z
        case 5: *value = 0x7fffffff; break;  // max grid dim x
        case 6: case 7: *value = 65535; break;
        case 8: *value = 48 << 10; break;    // shared memory per block
        case 10: *value = 32; break;         // warp size
        case 16: *value = int(workers()); break;  // multiprocessors
        case 75: *value = major; break;
        case 76: *value = minor; break;
        case 115: *value = 1; break;         // memory pools (stream-ordered allocation)
        default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

API CUresult cuDeviceTotalMem_v2(size_t* bytes, CUdevice device) {
    if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!valid_device(device)) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = total_memory();
    return CUDA_SUCCESS;
}

API CUresult cuDevicePrimaryCtxRetain(Context** ctx, CUdevice device) {
    if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (!valid_device(device)) return CUDA_ERROR_INVALID_DEVICE;
    *ctx = g_contexts[size_t(device)];
    return CUDA_SUCCESS;
}

API CUresult cuDevicePrimaryCtxRelease_v2(CUdevice device) {
    return valid_device(device) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

API CUresult cuCtxGetCurrent(Context** ctx) {
    if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
    *ctx = tl_current;
    return CUDA_SUCCESS;
}

API CUresult cuCtxSetCurrent(Context* ctx) {
    if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
    if (ctx != nullptr && std::find(g_contexts.begin(), g_contexts.end(), ctx) == g_contexts.end()) {
        return CUDA_ERROR_INVALID_CONTEXT;
    }
    tl_current = ctx;
    return CUDA_SUCCESS;
}

API CUresult cuCtxSynchronize() {
    Guard g(g_lock);
    if (CUresult r = ready()) return r;
    run_all(tl_current);
    return tl_current->sticky;
}

API CUresult cuMemGetInfo_v2(size_t* free, size_t* total) {
    Guard g(g_lock);
    if (CUresult r = ready()) return r;
    *total = total_memory();
    *free = *total - tl_current->bytes;
    return CUDA_SUCCESS;
}

API CUresult cuGetErrorName(CUresult error, const char** name) {
    switch (error) {
        case CUDA_SUCCESS: *name = "CUDA_SUCCESS"; break;
        case CUDA_ERROR_INVALID_VALUE: *name = "CUDA_ERROR_INVALID_VALUE"; break;
        case CUDA_ERROR_OUT_OF_MEMORY: *name = "CUDA_ERROR_OUT_OF_MEMORY"; break;
        case CUDA_ERROR_NOT_INITIALIZED: *name = "CUDA_ERROR_NOT_INITIALIZED"; break;
        case CUDA_ERROR_INVALID_DEVICE: *name = "CUDA_ERROR_INVALID_DEVICE"; break;
        case CUDA_ERROR_INVALID_IMAGE: *name = "CUDA_ERROR_INVALID_IMAGE"; break;
        case CUDA_ERROR_INVALID_CONTEXT: *name = "CUDA_ERROR_INVALID_CONTEXT"; break;
        case CUDA_ERROR_INVALID_HANDLE: *name = "CUDA_ERROR_INVALID_HANDLE"; break;
        case CUDA_ERROR_NOT_FOUND: *name = "CUDA_ERROR_NOT_FOUND"; break;
        case CUDA_ERROR_NOT_READY: *name = "CUDA_ERROR_NOT_READY"; break;
        case CUDA_ERROR_ILLEGAL_ADDRESS: *name = "CUDA_ERROR_ILLEGAL_ADDRESS"; break;
        case CUDA_ERROR_LAUNCH_FAILED: *name = "CUDA_ERROR_LAUNCH_FAILED"; break;
        case CUDA_ERROR_NOT_SUPPORTED: *name = "CUDA_ERROR_NOT_SUPPORTED"; break;
        default: *name = "CUDA_ERROR_UNKNOWN"; return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

API CUresult cuGetErrorString(CUresult error, const char** text) {
    switch (error) {
        case CUDA_SUCCESS: *text = "no error"; break;
        case CUDA_ERROR_INVALID_VALUE: *text = "invalid argument"; break;
        case CUDA_ERROR_OUT_OF_MEMORY: *text = "out of memory"; break;
        case CUDA_ERROR_NOT_INITIALIZED: *text = "initialization error"; break;
        case CUDA_ERROR_INVALID_DEVICE: *text = "invalid device ordinal"; break;
        case CUDA_ERROR_INVALID_IMAGE: *text = "device kernel image is invalid"; break;
        case CUDA_ERROR_INVALID_CONTEXT: *text = "invalid device context"; break;
        case CUDA_ERROR_INVALID_HANDLE: *text = "invalid resource handle"; break;
        case CUDA_ERROR_NOT_FOUND: *text = "named symbol not found"; break;
        case CUDA_ERROR_NOT_READY: *text = "device not ready"; break;
        case CUDA_ERROR_ILLEGAL_ADDRESS: *text = "an illegal memory access was encountered"; break;
        case CUDA_ERROR_LAUNCH_FAILED: *text = "unspecified launch failure"; break;
        case CUDA_ERROR_NOT_SUPPORTED: *text = "operation not supported"; break;
        default: *text = "unknown error"; return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

// ---- Memory.

API CUresult cuMemAlloc_v2(CUdeviceptr* ptr, size_t bytes) {
    Guard g(g_lock);
    if (CUresult r = ready()) return r;
    return alloc_device(ptr, bytes);
}

API CUresult cuMemFree_v2(CUdeviceptr ptr) {
    Guard g(g_lock);
    if (CUresult r = ready()) return r;
    run_all(tl_current);  // cuMemFree waits for the device
    return free_device(ptr);
}

API CUresult cuMemAllocAsync(CUdeviceptr* ptr, size_t bytes, void* stream) {
    Guard g(g_lock);
    if (CUresult r = ready()) return r;
    if (stream_of(stream) == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    return alloc_device(ptr, bytes);
}

API CUresult cuMemFreeAsync(CUdeviceptr ptr, void* stream) {
    Guard g(g_lock);
    if (CUresult r = ready()) return r;
    auto it = g_regions.find(ptr);
    if (it == g_regions.end() || it->second.pinned) return CUDA_ERROR_INVALID_VALUE;
    return enqueue(stream, [ptr] { free_device(ptr); });
}

API CUresult cuMemHostAlloc(void** ptr, size_t bytes, unsigned int flags) {
    Guard g(g_lock);
    if (CUresult r = ready()) return r;
    (void)flags;
    if (ptr == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
    void* p = poisoned(bytes, 4096);
    if (p == nullptr) return CUDA_ERROR_OUT_OF_MEMORY;
    g_regions[reinterpret_cast<uint64_t>(p)] = {bytes, true, -1};
    *ptr = p;
    return CUDA_SUCCESS;
}

API CUresult cuMemAllocHost_v2(void** ptr, size_t bytes) { return cuMemHostAlloc(ptr, bytes, 0); }

API CUresult cuMemFreeHost(void* ptr) {
    Guard g(g_lock);
    if (CUresult r = ready()) return r;
    auto it = g_regions.find(reinterpret_cast<uint64_t>(ptr));
    if (it == g_regions.end() || !it->second.pinned) return CUDA_ERROR_INVALID_VALUE;
    for (Context* c : g_contexts) run_all(c);  // queued copies may still read or write it
    g_regions.erase(it);
    std::free(ptr);
    return CUDA_SUCCESS;
}

API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void* src, size_t bytes, void* stream) {
    Guard g(g_lock);
    if (CUresult r = ready()) return r;
    if (CUresult r = check_device_range(dst, bytes)) return r;
    Stream* s = stream_of(stream);
    if (s == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    if (is_pinned(src, bytes)) {
        // Read when the copy runs: the host must not touch `src` until then.
        return enqueue(stream, [=] { std::memcpy(reinterpret_cast<void*>(dst), src, bytes); });
    }
    // From pageable memory the driver waits for the stream, then copies.
    run_queued(s, s->enqueued);
    if (s->ctx->sticky) return s->ctx->sticky;
    std::memcpy(reinterpret_cast<void*>(dst), src, bytes);
    return CUDA_SUCCESS;
}

API CUresult cuMemcpyDtoHAsync_v2(void* dst, CUdeviceptr src, size_t bytes, void* stream) {
    Guard g(g_lock);
    if (CUresult r = ready()) return r;
    if (CUresult r = check_device_range(src, bytes)) return r;
    Stream* s = stream_of(stream);
    if (s == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    if (is_pinned(dst, bytes)) {
        return enqueue(stream, [=] { std::memcpy(dst, reinterpret_cast<void*>(src), bytes); });
    }
    // To pageable memory the call returns when the copy is done.
    run_queued(s, s->enqueued);
    if (s->ctx->sticky) return s->ctx->sticky;
    std::memcpy(dst, reinterpret_cast<void*>(src), bytes);
    return CUDA_SUCCESS;
}

API CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dst, CUdeviceptr src, size_t bytes, void* stream) {
    Guard g(g_lock);
    if (CUresult r = ready()) return r;
    if (CUresult r = check_device_range(dst, bytes)) return r;
    if (CUresult r = check_device_range(src, bytes)) return r;
    return enqueue(stream, [=] {
        std::memmove(reinterpret_cast<void*>(dst), reinterpret_cast<void*>(src), bytes);
    });
}

API CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t bytes, void* stream) {
    Guard g(g_lock);
    if (CUresult r = ready()) return r;
    if (CUresult r = check_device_range(dst, bytes)) return r;
    return enqueue(stream, [=] { std::memset(reinterpret_cast<void*>(dst), value, bytes); });
}

/// A blocking call on `bytes` of device memory at `device`: waits for every
/// stream (the legacy stream's semantics), then does `work`.
static CUresult blocking(CUdeviceptr device, size_t bytes, const std::function<void()>& work) {
    Guard g(g_lock);
    if (CUresult r = ready()) return r;
    if (CUresult r = check_device_range(device, bytes)) return r;
    run_all(tl_current);
    if (tl_current->sticky) return tl_current->sticky;
    work();
    return CUDA_SUCCESS;
}

API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t bytes) {
    return blocking(dst, bytes, [=] { std::memcpy(reinterpret_cast<void*>(dst), src, bytes); });
}

API CUresult cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t bytes) {
    return blocking(src, bytes, [=] { std::memcpy(dst, reinterpret_cast<void*>(src), bytes); });
}

API CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t bytes) {
    return blocking(dst, bytes, [=] { std::memset(reinterpret_cast<void*>(dst), value, bytes); });
}

// ---- Streams and events.

API CUresult cuStreamCreate(void** stream, unsigned int flags) {
    Guard g(g_lock);
    if (CUresult r = ready()) return r;
    if (flags > 1) return CUDA_ERROR_INVALID_VALUE;
    auto* s = new Stream();
    s->ctx = tl_current;
    s->blocking = (flags & 1) == 0;  // CU_STREAM_NON_BLOCKING = 1
    g_streams.insert(s);
    *stream = s;
    return CUDA_SUCCESS;
}

API CUresult cuStreamDestroy_v2(void* stream) {
    Guard g(g_lock);
    if (CUresult r = ready()) return r;
    Stream* s = stream_of(stream);
    if (s == nullptr || s == &s->ctx->legacy) return CUDA_ERROR_INVALID_HANDLE;
    // Queued work still completes; events recorded on it stay valid.
    run_queued(s, s->enqueued);
    g_streams.erase(s);
    return CUDA_SUCCESS;
}

API CUresult cuStreamSynchronize(void* stream) {
    Guard g(g_lock);
    if (CUresult r = ready()) return r;
    Stream* s = stream_of(stream);
    if (s == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    run_queued(s, s->enqueued);
    return s->ctx->sticky;
}

API CUresult cuEventCreate(Event** event, unsigned int flags) {
    Guard g(g_lock);
    if (CUresult r = ready()) return r;
    (void)flags;
    *event = new Event();
    g_events.insert(*event);
    return CUDA_SUCCESS;
}

API CUresult cuEventDestroy_v2(Event* event) {
    Guard g(g_lock);
    if (!g_events.erase(event)) return CUDA_ERROR_INVALID_HANDLE;
    delete event;
    return CUDA_SUCCESS;
}

API CUresult cuEventRecord(Event* event, void* stream) {
    Guard g(g_lock);
    if (CUresult r = ready()) return r;
    Stream* s = stream_of(stream);
    if (!g_events.count(event) || s == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    CUresult r = enqueue(stream, [event] {
        event->time_ms =
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - g_start)
                .count();
    });
    event->stream = s;
    event->seq = s->enqueued;
    return r;
}

API CUresult cuEventSynchronize(Event* event) {
    Guard g(g_lock);
    if (CUresult r = ready()) return r;
    if (!g_events.count(event)) return CUDA_ERROR_INVALID_HANDLE;
    if (event->stream == nullptr) return tl_current->sticky;
    run_queued(event->stream, event->seq);
    return event->stream->ctx->sticky;
}

API CUresult cuEventQuery(Event* event) {
    // Queued work runs when asked for: a query completes the event's work.
    return cuEventSynchronize(event);
}

API CUresult cuEventElapsedTime(float* ms, Event* start, Event* end) {
    Guard g(g_lock);
    if (CUresult r = ready()) return r;
    if (!g_events.count(start) || !g_events.count(end)) return CUDA_ERROR_INVALID_HANDLE;
    if (start->stream == nullptr || end->stream == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    if (start->stream->done < start->seq || end->stream->done < end->seq) return CUDA_ERROR_NOT_READY;
    *ms = float(end->time_ms - start->time_ms);
    return CUDA_SUCCESS;
}

API CUresult cuEventElapsedTime_v2(float* ms, Event* start, Event* end) {
    return cuEventElapsedTime(ms, start, end);
}

API CUresult cuStreamWaitEvent(void* stream, Event* event, unsigned int flags) {
    Guard g(g_lock);
    if (CUresult r = ready()) return r;
    (void)flags;
    if (!g_events.count(event)) return CUDA_ERROR_INVALID_HANDLE;
    Stream* source = event->stream;
    uint64_t upto = event->seq;
    if (source == nullptr) return CUDA_SUCCESS;  // never recorded: nothing to wait for
    return enqueue(stream, [source, upto] { run_queued(source, upto); });
}

// ---- Modules and launches.

API CUresult cuModuleLoadData(Module** module, const void* image) {
    Guard g(g_lock);
    if (CUresult r = ready()) return r;
    std::string cpp, library, log;
    std::vector<std::string> flags;
    if (!parse_module_text(static_cast<const char*>(image), &cpp, &flags)) {
        std::fprintf(stderr, "cuda-emu: cuModuleLoadData: not a module of the emulated NVRTC "
                             "(real PTX or a cubin cannot run here)\n");
        return CUDA_ERROR_INVALID_IMAGE;
    }
    if (!build_module(cpp, flags, &library, &log)) {
        std::fprintf(stderr, "%s\n", log.c_str());
        return CUDA_ERROR_INVALID_IMAGE;
    }
    void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
        std::fprintf(stderr, "cuda-emu: %s\n", dlerror());
        return CUDA_ERROR_INVALID_IMAGE;
    }
    auto* m = new Module{handle, shared_memory_of(handle), {}};
    for (const auto& name : kernel_names(cpp)) {
        auto describe = reinterpret_cast<cuemu_kernel_info (*)()>(
            dlsym(handle, ("cuemu_kernel_" + name).c_str()));
        if (describe) m->functions[name] = describe();
    }
    *module = m;
    return CUDA_SUCCESS;
}

API CUresult cuModuleUnload(Module* module) {
    Guard g(g_lock);
    for (Context* c : g_contexts) run_all(c);
    delete module;  // the shared object stays loaded: kernels may be cached elsewhere
    return CUDA_SUCCESS;
}

API CUresult cuModuleGetFunction(Function** function, Module* module, const char* name) {
    Guard g(g_lock);
    if (CUresult r = ready()) return r;
    auto it = module->functions.find(name);
    if (it == module->functions.end()) return CUDA_ERROR_NOT_FOUND;
    *function = new Function{it->second, module->shared};
    return CUDA_SUCCESS;
}

API CUresult cuLaunchKernel(Function* f, unsigned int gx, unsigned int gy, unsigned int gz,
                            unsigned int bx, unsigned int by, unsigned int bz,
                            unsigned int shared_bytes, void* stream, void** params, void** extra) {
    Guard g(g_lock);
    if (CUresult r = ready()) return r;
    if (f == nullptr) return CUDA_ERROR_INVALID_HANDLE;
    if (gx == 0 || gy == 0 || gz == 0 || bx == 0 || by == 0 || bz == 0 || gy > 65535 ||
        gz > 65535 || gx > 0x7fffffffu || bx > 1024 || by > 1024 || bz > 64 ||
        uint64_t(bx) * by * bz > 1024 || shared_bytes > (48u << 10)) {
        std::fprintf(stderr, "cuda-emu: %s: invalid launch: grid (%u,%u,%u), block (%u,%u,%u), "
                     "%u bytes of shared memory\n", f->info.name, gx, gy, gz, bx, by, bz, shared_bytes);
        return CUDA_ERROR_INVALID_VALUE;
    }
    if (extra != nullptr || (params == nullptr && f->info.params > 0)) return CUDA_ERROR_INVALID_VALUE;
    auto launch = std::make_shared<Launch>();
    launch->kernel = f->info;
    launch->grid = {gx, gy, gz};
    launch->block = {bx, by, bz};
    launch->shared = f->shared;
    std::vector<size_t> offsets;
    size_t words = 0;
    for (int i = 0; i < f->info.params; i++) {
        offsets.push_back(words);
        words += (f->info.sizes[i] + 7) / 8;
    }
    launch->storage.assign(words, 0);
    for (int i = 0; i < f->info.params; i++) {
        std::memcpy(&launch->storage[offsets[i]], params[i], f->info.sizes[i]);
    }
    for (int i = 0; i < f->info.params; i++) launch->args.push_back(&launch->storage[offsets[i]]);
    return enqueue(stream, [launch] {
        const cuemu_kernel_info& k = launch->kernel;
        for (int i = 0; i < k.params; i++) {
            uint64_t ptr;
            std::memcpy(&ptr, launch->args[i], 8);
            std::string why;
            if (k.pointers[i] && ptr != 0 && !in_device_memory(ptr, 0, &why)) {
                fault(CUDA_ERROR_ILLEGAL_ADDRESS, "kernel " + std::string(k.name) + ": pointer argument " +
                                                      std::to_string(i) + ": " + why);
                return;
            }
        }
        launch->sequence = g_launches_of[k.name]++;
        g_kernels++;
        auto start = std::chrono::steady_clock::now();
        std::string failed = execute(*launch);
        g_kernel_seconds[k.name] +=
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (!failed.empty()) fault(CUDA_ERROR_LAUNCH_FAILED, failed);
    });
}
