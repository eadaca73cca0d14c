// The emulated NCCL's checks. Each case runs as R ranks: processes forked from
// this one, rank r on emulated device cuda:r, joined by one unique id as tinylm's
// ranks are. A case passes when every rank passes its checks (exit status 0).
// Cases marked plantable also run with a fault planted in the way they call NCCL
// (the kind of mistake tinylm's collective.rs could make), which the emulator or
// the check against the host's sums must catch; a rank that dies of its own (the
// dying-rank case's victim) is expected.
//
// Usage: nccl   (under run.sh)

#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cuda_api.h"
#include "cuda_bf16.h"

extern "C" {
typedef int ncclResult_t;
typedef void* ncclComm_t;
struct ncclUniqueId {
    char internal[128];
};
ncclResult_t ncclGetVersion(int*);
ncclResult_t ncclGetUniqueId(ncclUniqueId*);
ncclResult_t ncclCommInitRank(ncclComm_t*, int, ncclUniqueId, int);
ncclResult_t ncclCommDestroy(ncclComm_t);
ncclResult_t ncclCommAbort(ncclComm_t);
ncclResult_t ncclCommGetAsyncError(ncclComm_t, ncclResult_t*);
ncclResult_t ncclCommCount(ncclComm_t, int*);
ncclResult_t ncclCommCuDevice(ncclComm_t, int*);
ncclResult_t ncclCommUserRank(ncclComm_t, int*);
const char* ncclGetLastError(ncclComm_t);
ncclResult_t ncclGroupStart();
ncclResult_t ncclGroupEnd();
ncclResult_t ncclAllReduce(const void*, void*, size_t, int, int, ncclComm_t, CUstream);
ncclResult_t ncclBroadcast(const void*, void*, size_t, int, int, ncclComm_t, CUstream);
ncclResult_t ncclReduce(const void*, void*, size_t, int, int, int, ncclComm_t, CUstream);
ncclResult_t ncclAllGather(const void*, void*, size_t, int, ncclComm_t, CUstream);
ncclResult_t ncclReduceScatter(const void*, void*, size_t, int, int, ncclComm_t, CUstream);
}

namespace {

enum { ncclInt32 = 2, ncclFloat32 = 7, ncclFloat64 = 8, ncclBfloat16 = 9, ncclSum = 0 };
enum { ncclInvalidArgument = 4, ncclInvalidUsage = 5, ncclRemoteError = 6 };
enum { CUDA_ERROR_ILLEGAL_ADDRESS = 700, CUDA_ERROR_LAUNCH_FAILED = 719 };
constexpr int kMaxRanks = 4;

/// What the ranks of a case share besides NCCL: flags one rank raises for another.
struct Channel {
    std::atomic<int> flag[kMaxRanks];
};

/// This process as one rank of a case.
struct Rank {
    int rank, ranks;
    ncclUniqueId id;
    Channel* channel;
    CUstream stream = nullptr;
    ncclComm_t comm = nullptr;
};

void nccl_ok(ncclResult_t r, const char* what) {
    if (r != 0) caught(std::string(what) + " returned NCCL error " + std::to_string(r) + ": " + ncclGetLastError(nullptr));
}

/// `what` returned `got`, which must be `want`; the last error must contain `says`.
void expect_error(ncclResult_t got, ncclResult_t want, const std::string& says, const char* what) {
    std::string last = ncclGetLastError(nullptr);
    if (got != want || last.find(says) == std::string::npos) {
        caught(std::string(what) + " returned " + std::to_string(got) + " (\"" + last + "\"), not " +
               std::to_string(want) + " saying \"" + says + "\"");
    }
}

double since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

/// Opens cuda:`device` with a non-blocking stream, as tinylm's backend does.
void open_device(Rank& me, int device) {
    ok(cuInit(0), "cuInit");
    CUcontext ctx;
    ok(cuDevicePrimaryCtxRetain(&ctx, device), "cuDevicePrimaryCtxRetain");
    ok(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
    ok(cuStreamCreate(&me.stream, 1), "cuStreamCreate");
}

/// Rank `me.rank` on its own device, in the communicator of every rank.
void join(Rank& me) {
    open_device(me, me.rank);
    nccl_ok(ncclCommInitRank(&me.comm, me.ranks, me.id, me.rank), "ncclCommInitRank");
}

CUdeviceptr alloc(size_t bytes, Rank& me) {
    CUdeviceptr d;
    ok(cuMemAllocAsync(&d, bytes, me.stream), "cuMemAllocAsync");
    return d;
}

template <typename T>
CUdeviceptr upload(const std::vector<T>& host, Rank& me) {
    CUdeviceptr d = alloc(host.size() * sizeof(T), me);
    ok(cuMemcpyHtoDAsync_v2(d, host.data(), host.size() * sizeof(T), me.stream), "upload");
    return d;
}

/// Waits for the stream (the copy to pageable memory does) and reads `n` values.
template <typename T>
std::vector<T> download(CUdeviceptr d, size_t n, Rank& me) {
    std::vector<T> host(n);
    ok(cuMemcpyDtoHAsync_v2(host.data(), d, n * sizeof(T), me.stream), "download");
    return host;
}

/// Rank `rank`'s `n` values, different on every rank (exact in bf16).
std::vector<float> values(size_t n, int rank) {
    std::vector<float> v(n);
    uint32_t seed = 2654435761u * uint32_t(rank + 1);
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        v[i] = float(int(seed >> 24) - 128) / 16.0f;
    }
    return v;
}

// Values in f32, f64 or bf16, summed on the host in rank order as NCCL's result
// must be (bf16 rounded after each addition).
struct F32 {
    using T = float;
    static constexpr int type = ncclFloat32;
    static T from(float x) { return x; }
    static T add(T a, T b) { return a + b; }
    static bool same(T a, T b) { return std::memcmp(&a, &b, sizeof a) == 0; }
};
struct F64 {
    using T = double;
    static constexpr int type = ncclFloat64;
    static T from(float x) { return x / 3.0; }
    static T add(T a, T b) { return a + b; }
    static bool same(T a, T b) { return std::memcmp(&a, &b, sizeof a) == 0; }
};
struct Bf16 {
    using T = __nv_bfloat16;
    static constexpr int type = ncclBfloat16;
    static T from(float x) { return __float2bfloat16_rn(x); }
    static T add(T a, T b) { return __float2bfloat16_rn(__bfloat162float(a) + __bfloat162float(b)); }
    static bool same(T a, T b) { return std::memcmp(&a, &b, sizeof a) == 0; }
};

template <typename V>
std::vector<typename V::T> typed(const std::vector<float>& x) {
    std::vector<typename V::T> out;
    for (float v : x) out.push_back(V::from(v));
    return out;
}

/// Every rank's values of `n`, summed in rank order.
template <typename V>
std::vector<typename V::T> host_sum(size_t n, int ranks) {
    auto sum = typed<V>(values(n, 0));
    for (int r = 1; r < ranks; r++) {
        auto x = typed<V>(values(n, r));
        for (size_t i = 0; i < n; i++) sum[i] = V::add(sum[i], x[i]);
    }
    return sum;
}

template <typename V>
void expect_same(const std::vector<typename V::T>& got, const std::vector<typename V::T>& want,
                 size_t offset, const std::string& what) {
    for (size_t i = 0; i < got.size(); i++) {
        if (!V::same(got[i], want[offset + i])) {
            caught(what + ": element " + std::to_string(i) + " differs from the host's");
        }
    }
}

/// All five collectives of type `V` on `n` values (per rank where the call counts
/// so), out of place and in place.
template <typename V>
void check_collectives(Rank& me, size_t n, const char* type) {
    using T = typename V::T;
    const size_t size = sizeof(T), R = me.ranks;
    const std::vector<T> mine = typed<V>(values(n * R, me.rank)), sum = host_sum<V>(n * R, me.ranks);
    for (bool in_place : {false, true}) {
        const std::string how = std::string(type) + (in_place ? " in place, " : ", ") +
                                std::to_string(n) + " values";
        // AllReduce and Reduce (root 1) of n values.
        CUdeviceptr a = upload(std::vector<T>(mine.begin(), mine.begin() + n), me);
        CUdeviceptr b = in_place ? a : alloc(n * size, me);
        nccl_ok(ncclAllReduce((void*)a, (void*)b, n, V::type, ncclSum, me.comm, me.stream), "ncclAllReduce");
        expect_same<V>(download<T>(b, n, me), sum, 0, "ncclAllReduce " + how);
        CUdeviceptr c = upload(std::vector<T>(mine.begin(), mine.begin() + n), me);
        CUdeviceptr d = in_place ? c : alloc(n * size, me);
        nccl_ok(ncclReduce((void*)c, (void*)d, n, V::type, ncclSum, 1, me.comm, me.stream), "ncclReduce");
        if (me.rank == 1) expect_same<V>(download<T>(d, n, me), sum, 0, "ncclReduce " + how);
        // Broadcast from the last rank.
        CUdeviceptr e = upload(std::vector<T>(mine.begin(), mine.begin() + n), me);
        CUdeviceptr f = in_place ? e : alloc(n * size, me);
        nccl_ok(ncclBroadcast((void*)e, (void*)f, n, V::type, me.ranks - 1, me.comm, me.stream), "ncclBroadcast");
        expect_same<V>(download<T>(f, n, me), typed<V>(values(n * R, me.ranks - 1)), 0, "ncclBroadcast " + how);
        // AllGather of n values per rank: rank r's first n values at r·n.
        CUdeviceptr g = alloc(n * R * size, me);
        CUdeviceptr g_send = in_place ? g + me.rank * n * size : alloc(n * size, me);
        ok(cuMemcpyHtoDAsync_v2(g_send, mine.data(), n * size, me.stream), "upload");
        nccl_ok(ncclAllGather((void*)g_send, (void*)g, n, V::type, me.comm, me.stream), "ncclAllGather");
        auto gathered = download<T>(g, n * R, me);
        for (int r = 0; r < me.ranks; r++) {
            expect_same<V>(std::vector<T>(gathered.begin() + r * n, gathered.begin() + (r + 1) * n),
                           typed<V>(values(n * R, r)), 0, "ncclAllGather " + how + ", rank " + std::to_string(r) + "'s part");
        }
        // ReduceScatter of n values per rank: rank r receives the sum of block r.
        CUdeviceptr h = upload(mine, me);
        CUdeviceptr h_recv = in_place ? h + me.rank * n * size : alloc(n * size, me);
        nccl_ok(ncclReduceScatter((void*)h, (void*)h_recv, n, V::type, ncclSum, me.comm, me.stream),
                "ncclReduceScatter");
        expect_same<V>(download<T>(h_recv, n, me), sum, me.rank * n, "ncclReduceScatter " + how);
    }
}

// ---- The cases: each takes `planted` and returns normally when its checks pass.

/// Every collective in f32, bf16 and (the all-reduce tinylm gives the gradient's sum
/// of squares) f64, in one round and in several (over 256 KiB a rank), against the
/// host's sums; the communicator's rank, size and device; the version.
void collectives(Rank& me, bool) {
    join(me);
    int version, count, device, rank;
    nccl_ok(ncclGetVersion(&version), "ncclGetVersion");
    nccl_ok(ncclCommCount(me.comm, &count), "ncclCommCount");
    nccl_ok(ncclCommCuDevice(me.comm, &device), "ncclCommCuDevice");
    nccl_ok(ncclCommUserRank(me.comm, &rank), "ncclCommUserRank");
    if (version != 22803 || count != me.ranks || device != me.rank || rank != me.rank) {
        caught("version " + std::to_string(version) + ", count " + std::to_string(count) + ", device " +
               std::to_string(device) + ", rank " + std::to_string(rank));
    }
    for (size_t n : {size_t(1001), size_t(150001)}) {
        check_collectives<F32>(me, n, "f32");
        check_collectives<Bf16>(me, n, "bf16");
    }
    const size_t n = 70001;
    CUdeviceptr x = upload(typed<F64>(values(n, me.rank)), me);
    nccl_ok(ncclAllReduce((void*)x, (void*)x, n, ncclFloat64, ncclSum, me.comm, me.stream), "ncclAllReduce");
    expect_same<F64>(download<double>(x, n, me), host_sum<F64>(n, me.ranks), 0, "ncclAllReduce f64");
    nccl_ok(ncclCommDestroy(me.comm), "ncclCommDestroy");
}

const char* const kKernels = R"(
extern "C" __global__ void fill_rank(float* x, float rank, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = rank + 0.5f * float(i % 64);
}
extern "C" __global__ void twice(float* x, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = 2.0f * x[i];
}
)";

CUfunction kernel(const char* name) {
    static CUmodule module = [] {
        nvrtcProgram prog;
        nvrtcCreateProgram(&prog, kKernels, "nccl_case.cu", 0, nullptr, nullptr);
        const char* options[] = {"--gpu-architecture=compute_90"};
        if (nvrtcCompileProgram(prog, 1, options) != 0) caught("the case's kernels do not compile");
        size_t n;
        nvrtcGetPTXSize(prog, &n);
        std::string ptx(n, '\0');
        nvrtcGetPTX(prog, &ptx[0]);
        CUmodule m;
        ok(cuModuleLoadData(&m, ptx.c_str()), "cuModuleLoadData");
        return m;
    }();
    CUfunction f;
    ok(cuModuleGetFunction(&f, module, name), "cuModuleGetFunction");
    return f;
}

/// A kernel fills each rank's buffer, the all-reduce sums it, a kernel doubles the
/// sums: the collective runs after the kernel queued before it and before the one
/// after it. Planted: the all-reduce queued on the legacy stream, which does not
/// wait for the non-blocking stream the kernels run on.
void stream_order(Rank& me, bool planted) {
    join(me);
    unsigned n = 1000;
    CUdeviceptr x = alloc(n * 4, me);
    float rank = float(me.rank);
    void* fill_args[] = {&x, &rank, &n};
    ok(cuLaunchKernel(kernel("fill_rank"), 4, 1, 1, 256, 1, 1, 0, me.stream, fill_args, nullptr), "fill_rank");
    CUstream stream = planted ? nullptr : me.stream;
    nccl_ok(ncclAllReduce((void*)x, (void*)x, n, ncclFloat32, ncclSum, me.comm, stream), "ncclAllReduce");
    void* twice_args[] = {&x, &n};
    ok(cuLaunchKernel(kernel("twice"), 4, 1, 1, 256, 1, 1, 0, me.stream, twice_args, nullptr), "twice");
    auto got = download<float>(x, n, me);
    for (unsigned i = 0; i < n; i++) {
        float sum = 0;
        for (int r = 0; r < me.ranks; r++) sum += float(r) + 0.5f * float(i % 64);
        if (got[i] != 2.0f * sum) {
            caught("element " + std::to_string(i) + " is " + std::to_string(got[i]) + ", twice the ranks' sum " +
                   std::to_string(2.0f * sum));
        }
    }
    ok(cuStreamSynchronize(nullptr), "cuStreamSynchronize");
}

/// tinylm's ZeRO-1 step on a buffer the ranks do not divide: a group of one
/// ncclReduce per shard to its owner, then a group of one ncclBroadcast per shard
/// from its owner (collective.rs), in place; every rank ends with every sum.
/// Planted: each shard after the first starts one value late.
void zero_shards(Rank& me, bool planted) {
    join(me);
    const size_t n = 1000;
    CUdeviceptr x = upload(values(n, me.rank), me);
    auto shard = [&](int r, size_t* start, size_t* len) {  // distributed::shard
        size_t base = n / me.ranks, extra = n % me.ranks;
        *start = r * base + std::min<size_t>(r, extra) + (planted && r > 0 ? 1 : 0);
        *len = base + (size_t(r) < extra ? 1 : 0);
    };
    for (bool gather : {false, true}) {
        nccl_ok(ncclGroupStart(), "ncclGroupStart");
        for (int r = 0; r < me.ranks; r++) {
            size_t start, len;
            shard(r, &start, &len);
            void* part = (void*)(x + start * 4);
            ncclResult_t result = gather
                ? ncclBroadcast(part, part, len, ncclFloat32, r, me.comm, me.stream)
                : ncclReduce(part, part, len, ncclFloat32, ncclSum, r, me.comm, me.stream);
            if (result != 0) {
                ncclGroupEnd();
                nccl_ok(result, gather ? "ncclBroadcast" : "ncclReduce");
            }
        }
        nccl_ok(ncclGroupEnd(), "ncclGroupEnd");
    }
    expect_same<F32>(download<float>(x, n, me), host_sum<F32>(n, me.ranks), 0, "the gathered sums");
}

/// The last rank calls the all-reduce 0.3 s after the others: their
/// synchronization waits for it.
void waits_for_every_rank(Rank& me, bool) {
    join(me);
    const size_t n = 100;
    CUdeviceptr x = upload(values(n, me.rank), me);
    const bool last = me.rank == me.ranks - 1;
    if (last) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    auto start = std::chrono::steady_clock::now();
    nccl_ok(ncclAllReduce((void*)x, (void*)x, n, ncclFloat32, ncclSum, me.comm, me.stream), "ncclAllReduce");
    expect_same<F32>(download<float>(x, n, me), host_sum<F32>(n, me.ranks), 0, "the sums");
    if (!last && since(start) < 0.25) {
        caught("the all-reduce completed " + std::to_string(since(start)) + " s after it was queued, "
               "before the last rank called it");
    }
}

/// Rank 1 queues the all-reduce, then waits on its host until rank 0 has its sums
/// before it synchronizes: a collective completes once every rank has called it, as
/// on a GPU, not when their hosts synchronize.
void completes_before_the_hosts_wait(Rank& me, bool) {
    join(me);
    const size_t n = 100;
    CUdeviceptr x = upload(values(n, me.rank), me);
    nccl_ok(ncclAllReduce((void*)x, (void*)x, n, ncclFloat32, ncclSum, me.comm, me.stream), "ncclAllReduce");
    if (me.rank == 1) {
        auto start = std::chrono::steady_clock::now();
        while (me.channel->flag[0].load() == 0) {
            if (since(start) > 20) caught("rank 0 did not get its sums within 20 s");
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
    }
    expect_same<F32>(download<float>(x, n, me), host_sum<F32>(n, me.ranks), 0, "the sums");
    if (me.rank == 0) me.channel->flag[0].store(1);
}

/// The queued all-reduce of rank `me` fails at its synchronization within
/// `seconds`, as a fault of the stream, and the communicator's asynchronous error is
/// `want`, its last error saying `says`.
void expect_failed_collective(Rank& me, CUdeviceptr x, size_t n, ncclResult_t want,
                              const std::string& says, double seconds) {
    auto start = std::chrono::steady_clock::now();
    std::vector<float> host(n);
    CUresult synced = cuMemcpyDtoHAsync_v2(host.data(), x, n * 4, me.stream);
    double waited = since(start);
    if (synced != CUDA_ERROR_LAUNCH_FAILED) caught("the synchronization returned CUDA error " + std::to_string(synced));
    if (waited > seconds) caught("the error came after " + std::to_string(waited) + " s");
    ncclResult_t async;
    nccl_ok(ncclCommGetAsyncError(me.comm, &async), "ncclCommGetAsyncError");
    expect_error(async, want, says, "ncclCommGetAsyncError");
    expect_error(ncclAllReduce((void*)x, (void*)x, n, ncclFloat32, ncclSum, me.comm, me.stream), want, says,
                 "the next ncclAllReduce");
}

/// Rank 1 passes one value more: every rank gets ncclInvalidUsage naming both.
void counts_differ(Rank& me, bool) {
    join(me);
    const size_t n = 100 + (me.rank == 1);
    CUdeviceptr x = upload(values(n, me.rank), me);
    nccl_ok(ncclAllReduce((void*)x, (void*)x, n, ncclFloat32, ncclSum, me.comm, me.stream), "ncclAllReduce");
    expect_failed_collective(me, x, n, ncclInvalidUsage,
                             "rank 1 called ncclAllReduce of 101 ncclFloat32 values, rank 0 ncclAllReduce of "
                             "100 ncclFloat32 values", 5);
}

/// Rank 1 passes bf16 where rank 0 passes f32 (the same bytes).
void types_differ(Rank& me, bool) {
    join(me);
    const size_t n = 100;
    CUdeviceptr x = upload(values(n, me.rank), me);
    const size_t count = me.rank == 1 ? 2 * n : n;
    const int type = me.rank == 1 ? ncclBfloat16 : ncclFloat32;
    nccl_ok(ncclAllReduce((void*)x, (void*)x, count, type, ncclSum, me.comm, me.stream), "ncclAllReduce");
    expect_failed_collective(me, x, n, ncclInvalidUsage, "rank 1 called ncclAllReduce of 200 ncclBfloat16 values", 5);
}

/// A collective on a destroyed communicator is ncclInvalidArgument.
void used_after_destroy(Rank& me, bool) {
    join(me);
    CUdeviceptr x = upload(values(10, me.rank), me);
    nccl_ok(ncclAllReduce((void*)x, (void*)x, 10, ncclFloat32, ncclSum, me.comm, me.stream), "ncclAllReduce");
    nccl_ok(ncclCommDestroy(me.comm), "ncclCommDestroy");
    expect_error(ncclAllReduce((void*)x, (void*)x, 10, ncclFloat32, ncclSum, me.comm, me.stream),
                 ncclInvalidArgument, "after ncclCommDestroy", "ncclAllReduce after ncclCommDestroy");
}

/// Rank 1 is killed (SIGKILL) after joining: the others' all-reduce fails within
/// 2 s with ncclRemoteError naming it.
void a_rank_dies(Rank& me, bool) {
    join(me);
    if (me.rank == 1) raise(SIGKILL);
    CUdeviceptr x = upload(values(10, me.rank), me);
    nccl_ok(ncclAllReduce((void*)x, (void*)x, 10, ncclFloat32, ncclSum, me.comm, me.stream), "ncclAllReduce");
    expect_failed_collective(me, x, 10, ncclRemoteError, "rank 1 (pid", 2);
}

/// Rank 1 aborts its communicator instead of calling the all-reduce.
void a_rank_aborts(Rank& me, bool) {
    join(me);
    if (me.rank == 1) {
        nccl_ok(ncclCommAbort(me.comm), "ncclCommAbort");
        return;
    }
    CUdeviceptr x = upload(values(10, me.rank), me);
    nccl_ok(ncclAllReduce((void*)x, (void*)x, 10, ncclFloat32, ncclSum, me.comm, me.stream), "ncclAllReduce");
    expect_failed_collective(me, x, 10, ncclRemoteError, "aborted its communicator", 2);
}

/// Every rank on cuda:0: ncclCommInitRank refuses, as NCCL does.
void two_ranks_on_one_gpu(Rank& me, bool) {
    open_device(me, 0);
    expect_error(ncclCommInitRank(&me.comm, me.ranks, me.id, me.rank), ncclInvalidUsage,
                 "Duplicate GPU detected: rank 0 and rank 1 both on cuda:0", "ncclCommInitRank");
}

/// One process, every device: each its own memory, and a kernel on cuda:0 given a
/// buffer of cuda:1 is an illegal address.
void devices(Rank& me, bool) {
    ok(cuInit(0), "cuInit");
    int count;
    ok(cuDeviceGetCount(&count), "cuDeviceGetCount");
    if (count != kMaxRanks) caught("cuDeviceGetCount says " + std::to_string(count));
    CUcontext ctx[2];
    CUstream stream[2];
    CUdeviceptr x[2];
    size_t free[2], total;
    for (int d = 0; d < 2; d++) {
        ok(cuDevicePrimaryCtxRetain(&ctx[d], d), "cuDevicePrimaryCtxRetain");
        ok(cuCtxSetCurrent(ctx[d]), "cuCtxSetCurrent");
        ok(cuStreamCreate(&stream[d], 1), "cuStreamCreate");
        ok(cuMemAllocAsync(&x[d], size_t(d + 1) << 20, stream[d]), "cuMemAllocAsync");
        ok(cuMemGetInfo_v2(&free[d], &total), "cuMemGetInfo");
    }
    if (total - free[0] != 1 << 20 || total - free[1] != 2 << 20) {
        caught("cuda:0 has " + std::to_string(total - free[0]) + " bytes in use, cuda:1 " +
               std::to_string(total - free[1]));
    }
    me.stream = stream[1];
    unsigned n = 16;
    void* args[] = {&x[0], &n};
    ok(cuLaunchKernel(kernel("twice"), 1, 1, 1, 32, 1, 1, 0, stream[1], args, nullptr), "twice");
    CUresult r = cuStreamSynchronize(stream[1]);
    if (r != CUDA_ERROR_ILLEGAL_ADDRESS) caught("a kernel on cuda:1 given cuda:0's buffer: CUDA error " + std::to_string(r));
    ok(cuCtxSetCurrent(ctx[0]), "cuCtxSetCurrent");
    ok(cuStreamSynchronize(stream[0]), "cuda:0 after cuda:1's fault");
}

struct Case {
    const char* name;
    int ranks;
    void (*run)(Rank&, bool planted);
    const char* planted;  // the fault it plants, or null
    int victim = -1;      // the rank that dies of its own
};

const Case kCases[] = {
    {"every collective in f32 and bf16, in place and not, in one round and several", 3, collectives, nullptr},
    {"a collective runs after the kernel before it, before the kernel after it", 2, stream_order,
     "a collective that does not wait for its stream's earlier kernels (queued on the legacy stream)"},
    {"ZeRO-1's shards: ncclReduce to each owner, then ncclBroadcast from it, grouped", 3, zero_shards,
     "a shard offset off by one"},
    {"a collective completes only when every rank has called it", 2, waits_for_every_rank, nullptr},
    {"a collective completes before the ranks' hosts synchronize", 2, completes_before_the_hosts_wait, nullptr},
    {"counts that differ between ranks: ncclInvalidUsage on every rank", 2, counts_differ, nullptr},
    {"types that differ between ranks: ncclInvalidUsage on every rank", 2, types_differ, nullptr},
    {"a communicator used after ncclCommDestroy: ncclInvalidArgument", 2, used_after_destroy, nullptr},
    {"a rank that dies: the others' collective fails within 2 s (ncclRemoteError)", 3, a_rank_dies, nullptr, 1},
    {"a rank that aborts: the other's collective fails (ncclRemoteError)", 2, a_rank_aborts, nullptr},
    {"two ranks on one GPU: ncclCommInitRank refuses", 2, two_ranks_on_one_gpu, nullptr},
    {"several devices in one process, each its own memory", 1, devices, nullptr},
};

/// Runs `c` as its ranks (forked), at most 60 s; every rank's exit status (a signal
/// as 128 + its number) and the most telling line any said.
std::vector<int> run_ranks(const Case& c, bool planted, std::string* said) {
    ncclUniqueId id;
    nccl_ok(ncclGetUniqueId(&id), "ncclGetUniqueId");
    auto* channel = static_cast<Channel*>(
        mmap(nullptr, sizeof(Channel), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    int fds[2];
    if (channel == MAP_FAILED || pipe(fds) != 0) caught("no shared memory or pipe for the ranks");
    std::fflush(stdout);
    std::vector<pid_t> pids;
    for (int r = 0; r < c.ranks; r++) {
        pid_t pid = fork();
        if (pid == 0) {
            dup2(fds[1], 1);
            dup2(fds[1], 2);
            close(fds[0]);
            Rank me{r, c.ranks, id, channel};
            c.run(me, planted);
            std::fflush(stdout);
            std::_Exit(0);
        }
        pids.push_back(pid);
    }
    close(fds[1]);
    std::string out;
    auto start = std::chrono::steady_clock::now();
    for (bool open = true; open;) {
        pollfd p = {fds[0], POLLIN, 0};
        if (since(start) > 60) {
            for (pid_t pid : pids) kill(pid, SIGKILL);
            out += "check failed: the ranks did not end within 60 s\n";
            break;
        }
        if (poll(&p, 1, 100) <= 0) continue;
        char buf[4096];
        ssize_t n = read(fds[0], buf, sizeof buf);
        if (n <= 0) open = false;
        else out.append(buf, size_t(n));
    }
    close(fds[0]);
    munmap(channel, sizeof(Channel));
    std::vector<int> statuses;
    for (pid_t pid : pids) {
        int status = 0;
        waitpid(pid, &status, 0);
        statuses.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
    }
    for (const char* key : {"check failed", "cuda-emu: FAULT", "ERROR: AddressSanitizer"}) {
        size_t at = out.find(key);
        if (at != std::string::npos) {
            *said = out.substr(at, out.find('\n', at) - at);
            return statuses;
        }
    }
    *said = out.substr(0, out.find('\n'));
    return statuses;
}

/// Whether every rank of `c` ended as it should: status 0, the victim by SIGKILL.
bool passed(const Case& c, const std::vector<int>& statuses) {
    for (int r = 0; r < c.ranks; r++) {
        if (statuses[r] != (r == c.victim ? 128 + SIGKILL : 0)) return false;
    }
    return true;
}

std::string describe(const std::vector<int>& statuses) {
    std::string s;
    for (size_t r = 0; r < statuses.size(); r++) {
        s += (r ? ", " : "") + std::string("rank ") + std::to_string(r) + " " + std::to_string(statuses[r]);
    }
    return s;
}

}  // namespace

int main() {
    // Every rank its own device, and a rank that waits for nothing fails within 20 s.
    setenv("CUDA_EMU_DEVICES", std::to_string(kMaxRanks).c_str(), 1);
    setenv("CUDA_EMU_NCCL_TIMEOUT", "20", 1);
    int failures = 0, clean_passed = 0, caught_count = 0, plantable = 0;
    for (const Case& c : kCases) {
        std::string said;
        std::vector<int> clean = run_ranks(c, false, &said);
        if (c.planted) plantable++;
        if (!passed(c, clean)) {
            std::printf("FAILED  %s: %s: %s\n", c.name, describe(clean).c_str(), said.c_str());
            failures++;
            continue;
        }
        clean_passed++;
        if (c.planted == nullptr) {
            std::printf("ok      %s\n", c.name);
            continue;
        }
        std::vector<int> planted = run_ranks(c, true, &said);
        if (passed(c, planted)) {
            std::printf("MISSED  %s: the planted fault (%s) went unnoticed\n", c.name, c.planted);
            failures++;
        } else {
            std::printf("caught  %s, planted: %s\n        %s\n", c.name, c.planted, said.c_str());
            caught_count++;
        }
    }
    std::printf("emulated NCCL: %d of %zu cases pass unchanged, planted faults: %d of %d caught\n",
                clean_passed, sizeof kCases / sizeof kCases[0], caught_count, plantable);
    return failures == 0 ? 0 : 1;
}
