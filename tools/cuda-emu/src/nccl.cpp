// libnccl.so.2 of the emulated GPUs: NCCL's communicators and collectives between
// ranks that are separate processes (started by mpirun, or forked), each on its own
// emulated device, over a shared-memory segment that the unique id names.
//
// A collective is queued on its stream like a kernel: it runs after the work queued
// before it and before the work queued after it, and it completes only when every
// rank of the communicator has called it. A thread of each process runs a stream's
// queue as soon as a collective is queued on it (as a GPU would, without the host
// waiting), so the collective completes once every rank has called it, whatever
// their hosts do next. Each collective moves its values through the ranks' staging
// areas in rounds: every rank stages its part, waits for all, then computes its
// result from every rank's staging in rank order, so that every rank gets the same
// sums (bf16 sums round after each addition, as each hop of NCCL's ring does).
//
// What NCCL leaves to a hang or a wrong answer is an error here: ranks that call a
// collective with different counts, types, operations or roots (every rank gets
// ncclInvalidUsage, naming both), a rank that died or destroyed or aborted its
// communicator while the others wait for it (ncclRemoteError within a fraction of a
// second), a communicator used after ncclCommDestroy or ncclCommAbort
// (ncclInvalidArgument), calls of one group whose buffers overlap where one writes
// (ncclInvalidUsage from ncclGroupEnd: a group's calls run concurrently on a GPU),
// a buffer outside the device's allocations (ncclInvalidArgument, as NCCL with
// NCCL_CHECK_POINTERS=1), two ranks of one machine on one GPU (ncclInvalidUsage,
// as NCCL). An error in queued work is the communicator's asynchronous error
// (ncclCommGetAsyncError; later calls return it) and a fault of the stream's
// context, as a GPU fault: the stream's later work does not run and the next
// synchronization fails.

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cuda_bf16.h"
#include "driver.h"

typedef int ncclResult_t;
enum : ncclResult_t {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
};
enum {
    ncclInt8 = 0,
    ncclUint8 = 1,
    ncclInt32 = 2,
    ncclUint32 = 3,
    ncclInt64 = 4,
    ncclUint64 = 5,
    ncclFloat16 = 6,
    ncclFloat32 = 7,
    ncclFloat64 = 8,
    ncclBfloat16 = 9,
};
enum { ncclSum = 0 };
enum { CUDA_ERROR_LAUNCH_FAILED = 719 };

struct ncclUniqueId {
    char internal[128];
};

namespace {

constexpr int kMaxRanks = 64;
/// Bytes each rank stages per round of a collective.
constexpr size_t kStaging = 256 << 10;
constexpr char kIdMagic[] = "cuda-emu nccl id";

const char* const kTypeNames[] = {"ncclInt8",    "ncclUint8",   "ncclInt32",   "ncclUint32",
                                  "ncclInt64",   "ncclUint64",  "ncclFloat16", "ncclFloat32",
                                  "ncclFloat64", "ncclBfloat16"};
const size_t kTypeSizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};

enum Kind { kAllReduce, kBroadcast, kReduce, kAllGather, kReduceScatter };
const char* const kKindNames[] = {"ncclAllReduce", "ncclBroadcast", "ncclReduce",
                                  "ncclAllGather", "ncclReduceScatter"};

/// What every rank must pass alike to a collective.
struct Signature {
    uint64_t number;  // the communicator's collectives queued before it, plus one
    int kind, type, op, root;
    uint64_t count;  // as the call counts: per rank for AllGather and ReduceScatter

    bool operator==(const Signature& o) const {
        return number == o.number && kind == o.kind && type == o.type && op == o.op &&
               root == o.root && count == o.count;
    }
};

/// One rank's collective: its signature and buffers.
struct Call {
    Signature sig;
    const unsigned char* send;
    unsigned char* recv;
};

enum State { kAbsent = 0, kJoined, kDestroyed, kAborted, kFailed };

/// A rank's part of the shared segment.
struct Slot {
    std::atomic<int> state;
    int pid, device;
    char host[64];
    std::atomic<uint64_t> posted;  // rounds this rank has staged
    std::atomic<uint64_t> taken;   // rounds this rank has finished reading
    Signature sig;                 // of its collective, written before its first round is posted
    alignas(64) unsigned char staging[kStaging];
};

/// The segment the unique id names (created zeroed by the first rank to join).
struct Shared {
    std::atomic<int> ranks;   // set by the first rank to join
    std::atomic<int> joined;  // ranks that have joined
    Slot slots[kMaxRanks];
};
static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<int>::is_always_lock_free,
              "atomics in shared memory must be lock-free");

/// One rank's communicator.
struct Comm {
    std::string name;
    int fd = -1;
    Shared* shared = nullptr;
    int rank = 0, ranks = 0, device = 0;
    uint64_t queued = 0;  // collectives queued (host side)
    uint64_t rounds = 0;  // rounds run (by queued work, serialized by the driver)
    std::atomic<int> async{ncclSuccess};
    std::atomic<bool> aborted{false};
    std::set<std::pair<void*, void*>> streams;  // (context, stream) its work was queued on
};

std::mutex g_lock;  // the sets of communicators and the last error
std::set<Comm*> g_live;
std::set<Comm*> g_ended;  // destroyed or aborted: kept, so that a later use is an error
std::string g_last_error;
thread_local std::string tl_last_error;

ncclResult_t error(ncclResult_t code, const std::string& message) {
    std::lock_guard<std::mutex> g(g_lock);
    g_last_error = message;
    return code;
}

std::string last_error() {
    std::lock_guard<std::mutex> g(g_lock);
    return g_last_error;
}

double seconds_since(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

/// How long a rank waits for another that is alive but does not come
/// (`CUDA_EMU_NCCL_TIMEOUT` seconds, default 300).
double timeout_s() {
    const char* s = std::getenv("CUDA_EMU_NCCL_TIMEOUT");
    return s ? std::atof(s) : 300.0;
}

/// Whether rank `r`'s process (another than this one) still holds its lock on byte
/// `r` of the segment (an open-file-description lock: released when the process ends
/// or closes it).
bool alive(const Comm* c, int r) {
    struct flock fl = {};
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = r;
    fl.l_len = 1;
    return fcntl(c->fd, F_OFD_GETLK, &fl) == 0 && fl.l_type != F_UNLCK;
}

std::string describe_rank(const Comm* c, int r) {
    const Slot& s = c->shared->slots[r];
    return "rank " + std::to_string(r) + " (pid " + std::to_string(s.pid) + ", cuda:" +
           std::to_string(s.device) + ")";
}

/// Waits until `done(slot)` holds for every rank's slot. Another rank that ended
/// (died, destroyed or aborted its communicator, failed) is ncclRemoteError; one
/// alive that does not come within the timeout, ncclInvalidUsage. `what` names the
/// wait in messages. While this rank aborts, returns ncclInProgress at once.
ncclResult_t wait_all(Comm* c, const std::string& what, const std::function<bool(const Slot&)>& done,
                      std::string* message) {
    const auto start = std::chrono::steady_clock::now();
    double next_check = 0.02;
    long nap_ns = 2000;
    for (int spin = 0;; spin++) {
        int missing = -1;
        for (int r = 0; r < c->ranks && missing < 0; r++) {
            if (!done(c->shared->slots[r])) missing = r;
        }
        if (missing < 0) return ncclSuccess;
        if (c->aborted.load()) return ncclInProgress;
        if (spin < 64) {
            std::this_thread::yield();
            continue;
        }
        struct timespec nap = {0, nap_ns};
        nanosleep(&nap, nullptr);
        nap_ns = std::min(nap_ns * 2, 500000L);
        double waited = seconds_since(start);
        if (waited < next_check) continue;
        next_check = waited + 0.02;
        for (int r = 0; r < c->ranks; r++) {
            const Slot& s = c->shared->slots[r];
            if (r == c->rank || done(s)) continue;
            int state = s.state.load();
            const char* ended = state == kDestroyed ? "destroyed its communicator"
                                : state == kAborted ? "aborted its communicator (ncclCommAbort)"
                                : state == kFailed  ? "stopped at an error"
                                : state == kJoined && !alive(c, r) ? "exited"
                                                                   : nullptr;
            if (ended) {
                *message = describe_rank(c, r) + " " + ended + " while " + what;
                return ncclRemoteError;
            }
        }
        if (waited > timeout_s()) {
            *message = describe_rank(c, missing) + " is alive but did not come within " +
                       std::to_string(int(timeout_s())) + " s while " + what +
                       " (CUDA_EMU_NCCL_TIMEOUT)";
            return ncclInvalidUsage;
        }
    }
}

// ---- Values.

/// `acc` ← `acc + x`, elementwise in `type`, for `n` values.
void add(int type, unsigned char* acc, const unsigned char* x, size_t n) {
    switch (type) {
#define ADD(code, T)                                                       \
    case code: {                                                           \
        auto* a = reinterpret_cast<T*>(acc);                               \
        auto* b = reinterpret_cast<const T*>(x);                           \
        for (size_t i = 0; i < n; i++) a[i] = T(a[i] + b[i]);              \
        break;                                                             \
    }
        ADD(ncclInt8, uint8_t)  // two's complement: sums wrap as the signed type's
        ADD(ncclUint8, uint8_t)
        ADD(ncclInt32, uint32_t)
        ADD(ncclUint32, uint32_t)
        ADD(ncclInt64, uint64_t)
        ADD(ncclUint64, uint64_t)
        ADD(ncclFloat32, float)
        ADD(ncclFloat64, double)
#undef ADD
        case ncclBfloat16: {
            auto* a = reinterpret_cast<__nv_bfloat16*>(acc);
            auto* b = reinterpret_cast<const __nv_bfloat16*>(x);
            for (size_t i = 0; i < n; i++) {
                a[i] = __float2bfloat16_rn(__bfloat162float(a[i]) + __bfloat162float(b[i]));
            }
            break;
        }
    }
}

/// The values a rank stages for `sig` (per rank: the whole send buffer).
uint64_t staged_count(const Signature& sig, int ranks) {
    return sig.kind == kReduceScatter ? sig.count * uint64_t(ranks) : sig.count;
}

/// `dst` ← the sum over ranks, in rank order, of `n` values at `offset` bytes into
/// each rank's staging.
void sum_staged(const Comm* c, int type, size_t offset, size_t n, unsigned char* dst) {
    const size_t bytes = n * kTypeSizes[type];
    std::memcpy(dst, c->shared->slots[0].staging + offset, bytes);
    for (int r = 1; r < c->ranks; r++) add(type, dst, c->shared->slots[r].staging + offset, n);
}

std::string describe_call(const Signature& s) {
    std::string text = std::string(kKindNames[s.kind]) + " of " + std::to_string(s.count) + " " +
                       kTypeNames[s.type] + " values";
    if (s.kind == kAllGather || s.kind == kReduceScatter) text += " per rank";
    if (s.kind == kBroadcast || s.kind == kReduce) text += " (root " + std::to_string(s.root) + ")";
    return text;
}

/// Runs `call` with the other ranks (queued work: the driver runs one at a time).
ncclResult_t run_call(Comm* c, const Call& call, std::string* message) {
    const Signature& sig = call.sig;
    const size_t size = kTypeSizes[sig.type];
    const uint64_t count = staged_count(sig, c->ranks);
    const uint64_t per_round = kStaging / size;
    const uint64_t rounds = count == 0 ? 1 : (count + per_round - 1) / per_round;
    const bool stages = sig.kind != kBroadcast || sig.root == c->rank;
    const std::string what = "in collective " + std::to_string(sig.number) + " (" +
                             kKindNames[sig.kind] + ")";
    Slot& me = c->shared->slots[c->rank];
    for (uint64_t round = 0; round < rounds; round++) {
        const uint64_t seq = ++c->rounds;
        const uint64_t lo = round * per_round, n = std::min(per_round, count - lo);
        // Every rank has read what this one staged in the previous round.
        auto read_before = [seq](const Slot& s) { return s.taken.load() >= seq - 1; };
        if (ncclResult_t r = wait_all(c, what, read_before, message)) return r;
        if (stages) std::memcpy(me.staging, call.send + lo * size, n * size);
        if (round == 0) me.sig = sig;
        me.posted.store(seq);
        auto staged = [seq](const Slot& s) { return s.posted.load() >= seq; };
        if (ncclResult_t r = wait_all(c, what, staged, message)) return r;
        if (round == 0) {
            const Signature& first = c->shared->slots[0].sig;
            for (int r = 1; r < c->ranks; r++) {
                const Signature& other = c->shared->slots[r].sig;
                if (!(other == first)) {
                    *message = "collective " + std::to_string(sig.number) +
                               " of the communicator differs between ranks: rank " +
                               std::to_string(r) + " called " + describe_call(other) +
                               ", rank 0 " + describe_call(first);
                    return ncclInvalidUsage;
                }
            }
        }
        switch (sig.kind) {
            case kAllReduce:
                sum_staged(c, sig.type, 0, n, call.recv + lo * size);
                break;
            case kReduce:
                if (c->rank == sig.root) sum_staged(c, sig.type, 0, n, call.recv + lo * size);
                break;
            case kBroadcast:
                std::memcpy(call.recv + lo * size, c->shared->slots[sig.root].staging, n * size);
                break;
            case kAllGather:
                for (int r = 0; r < c->ranks; r++) {
                    std::memcpy(call.recv + (r * sig.count + lo) * size,
                                c->shared->slots[r].staging, n * size);
                }
                break;
            case kReduceScatter: {
                // This rank's block of the send buffers, where this round covers it.
                const uint64_t from = std::max(lo, sig.count * c->rank);
                const uint64_t to = std::min(lo + n, sig.count * (c->rank + 1));
                if (from < to) {
                    sum_staged(c, sig.type, (from - lo) * size, to - from,
                               call.recv + (from - sig.count * c->rank) * size);
                }
                break;
            }
        }
        me.taken.store(seq);
    }
    return ncclSuccess;
}

/// Queued work: `calls` (one call, or a group's on one stream) in order. A failure
/// is the communicator's asynchronous error and a fault of the stream's context.
void run_calls(Comm* c, const std::vector<Call>& calls) {
    for (const Call& call : calls) {
        if (c->aborted.load() || c->async.load() != ncclSuccess) return;
        std::string message;
        ncclResult_t r = run_call(c, call, &message);
        if (r == ncclInProgress) return;  // aborted while waiting
        if (r != ncclSuccess) {
            int expected = ncclSuccess;
            c->async.compare_exchange_strong(expected, r);
            c->shared->slots[c->rank].state.store(kFailed);
            error(r, message);
            cuemu::fault(CUDA_ERROR_LAUNCH_FAILED, "NCCL rank " + std::to_string(c->rank) + ": " +
                                                       message);
            return;
        }
    }
}

// ---- Progress: a thread that runs a stream's queue once a collective is on it.

struct Progress {
    std::mutex mutex;
    std::condition_variable ready;
    std::deque<std::pair<void*, void*>> streams;  // (context, stream)
    bool started = false;

    void push(void* context, void* stream) {
        std::lock_guard<std::mutex> g(mutex);
        streams.emplace_back(context, stream);
        if (!started) {
            started = true;
            std::thread([this] { serve(); }).detach();
        }
        ready.notify_one();
    }

    void serve() {
        std::unique_lock<std::mutex> lock(mutex);
        for (;;) {
            ready.wait(lock, [this] { return !streams.empty(); });
            auto [context, stream] = streams.front();
            streams.pop_front();
            lock.unlock();
            cuemu::run_stream(context, stream);  // errors reach the host at its next sync
            lock.lock();
        }
    }
};

// Never destroyed: its thread waits on it until the process ends.
Progress& g_progress = *new Progress;

// ---- Checks of the calls.

/// `comm` as a live communicator, or the error of a bad handle.
ncclResult_t live(void* comm, Comm** out) {
    auto* c = static_cast<Comm*>(comm);
    std::lock_guard<std::mutex> g(g_lock);
    if (g_live.count(c)) {
        *out = c;
        return ncclSuccess;
    }
    g_last_error = g_ended.count(c) ? "communicator used after ncclCommDestroy or ncclCommAbort"
                                    : "not a communicator of ncclCommInitRank";
    return ncclInvalidArgument;
}

/// The byte ranges `call` reads and writes on this rank (empty where it does not).
struct Ranges {
    uint64_t read_lo, read_hi, write_lo, write_hi;
};

Ranges ranges(const Comm* c, const Call& call) {
    const Signature& s = call.sig;
    const uint64_t size = kTypeSizes[s.type];
    const uint64_t in = (s.kind == kReduceScatter ? s.count * c->ranks : s.count) * size;
    const uint64_t out = (s.kind == kAllGather ? s.count * c->ranks : s.count) * size;
    const bool rooted = s.kind == kBroadcast || s.kind == kReduce;
    const bool reads = !rooted || s.kind == kReduce || c->rank == s.root;
    const bool writes = s.kind != kReduce || c->rank == s.root;
    const auto send = reinterpret_cast<uint64_t>(call.send);
    const auto recv = reinterpret_cast<uint64_t>(call.recv);
    return {send, reads ? send + in : send, recv, writes ? recv + out : recv};
}

/// The bytes `[lo, hi)` of a buffer of `call`, named `name`: inside one allocation
/// of the current device, or empty.
ncclResult_t check_buffer(uint64_t lo, uint64_t hi, const char* name, const Call& call) {
    std::string why;
    if (lo == hi || cuemu::in_device_memory(lo, hi - lo, &why)) return ncclSuccess;
    return error(ncclInvalidArgument, std::string(kKindNames[call.sig.kind]) + ": " + name + " (" +
                                          std::to_string(hi - lo) + " bytes): " + why);
}

/// The group being built on this thread (ncclGroupStart nesting depth and calls).
struct Pending {
    Comm* comm;
    Call call;
    void* stream;
    void* context;
};
thread_local int tl_depth = 0;
thread_local std::vector<Pending> tl_group;
thread_local ncclResult_t tl_group_error = ncclSuccess;  // the first failed call's

/// Queues `calls` (all on `c` and `stream`) as one piece of work.
ncclResult_t enqueue(Comm* c, void* context, void* stream, std::vector<Call> calls) {
    for (Call& call : calls) call.sig.number = ++c->queued;
    int r = cuemu::enqueue(stream, [c, calls] { run_calls(c, calls); });
    if (r != 0) {
        return error(ncclUnhandledCudaError, "queuing on the stream failed: CUDA error " +
                                                 std::to_string(r));
    }
    c->streams.emplace(context, stream);
    g_progress.push(context, stream);
    return ncclSuccess;
}

/// Checks a collective and queues it, or adds it to this thread's group.
ncclResult_t check_and_queue(Kind kind, const void* send, void* recv, size_t count, int type, int op,
                        int root, void* comm, void* stream) {
    Comm* c;
    if (ncclResult_t r = live(comm, &c)) return r;
    if (ncclResult_t r = c->async.load()) {
        return error(r, "the communicator failed earlier: " + last_error());
    }
    const char* name = kKindNames[kind];
    if (type < 0 || type > ncclBfloat16) {
        return error(ncclInvalidArgument, std::string(name) + ": unknown data type " + std::to_string(type));
    }
    const bool reduces = kind == kAllReduce || kind == kReduce || kind == kReduceScatter;
    if (reduces && op != ncclSum) {
        return error(ncclInvalidArgument, std::string(name) + ": only ncclSum is emulated (op " +
                                              std::to_string(op) + ")");
    }
    if (reduces && type == ncclFloat16) {
        return error(ncclInvalidArgument, std::string(name) + ": ncclFloat16 sums are not emulated");
    }
    const bool rooted = kind == kBroadcast || kind == kReduce;
    if (rooted && (root < 0 || root >= c->ranks)) {
        return error(ncclInvalidArgument, std::string(name) + ": root " + std::to_string(root) +
                                              " of " + std::to_string(c->ranks) + " ranks");
    }
    if (cuemu::current_device() != c->device) {
        return error(ncclInvalidUsage, std::string(name) + ": the current context is not the "
                                           "communicator's device, cuda:" + std::to_string(c->device));
    }
    Call call = {{0, kind, type, reduces ? op : 0, rooted ? root : 0, count},
                 static_cast<const unsigned char*>(send), static_cast<unsigned char*>(recv)};
    if (count == 0) return ncclSuccess;  // as NCCL: nothing to do
    if (count > (uint64_t(1) << 40)) {
        return error(ncclInvalidArgument, std::string(name) + ": " + std::to_string(count) + " values");
    }
    const Ranges bytes = ranges(c, call);
    if (ncclResult_t r = check_buffer(bytes.read_lo, bytes.read_hi, "sendbuff", call)) return r;
    if (ncclResult_t r = check_buffer(bytes.write_lo, bytes.write_hi, "recvbuff", call)) return r;
    if (tl_depth > 0) {
        tl_group.push_back({c, call, stream, cuemu::current_context()});
        return ncclSuccess;
    }
    return enqueue(c, cuemu::current_context(), stream, {call});
}

/// [`check_and_queue`]; in a group, a failed call is also the group's error.
ncclResult_t collective(Kind kind, const void* send, void* recv, size_t count, int type, int op,
                        int root, void* comm, void* stream) {
    ncclResult_t r = check_and_queue(kind, send, recv, count, type, op, root, comm, stream);
    if (r != ncclSuccess && tl_depth > 0 && tl_group_error == ncclSuccess) tl_group_error = r;
    return r;
}

bool overlap(uint64_t a_lo, uint64_t a_hi, uint64_t b_lo, uint64_t b_hi) {
    return a_lo < b_hi && b_lo < a_hi;
}

/// A group's calls run concurrently on a GPU: none may write what another reads or
/// writes.
ncclResult_t check_group(const std::vector<Pending>& group) {
    for (size_t i = 0; i < group.size(); i++) {
        const Ranges a = ranges(group[i].comm, group[i].call);
        for (size_t j = 0; j < i; j++) {
            const Ranges b = ranges(group[j].comm, group[j].call);
            if (overlap(a.write_lo, a.write_hi, b.read_lo, b.read_hi) ||
                overlap(a.write_lo, a.write_hi, b.write_lo, b.write_hi) ||
                overlap(b.write_lo, b.write_hi, a.read_lo, a.read_hi)) {
                return error(ncclInvalidUsage,
                             "ncclGroupEnd: call " + std::to_string(i + 1) + " of the group (" +
                                 describe_call(group[i].call.sig) + ") and call " +
                                 std::to_string(j + 1) + " (" + describe_call(group[j].call.sig) +
                                 ") overlap where one writes: the calls of a group run concurrently");
            }
        }
    }
    return ncclSuccess;
}

/// `*out` ← `read` of the live communicator `comm`.
template <typename Read>
ncclResult_t query(void* comm, int* out, Read read) {
    Comm* c;
    if (ncclResult_t r = live(comm, &c)) return r;
    if (out == nullptr) return error(ncclInvalidArgument, "a communicator query's result is null");
    *out = read(*c);
    return ncclSuccess;
}

/// The name of a new segment: the process, a count and random bits.
std::string new_segment_name() {
    static std::atomic<int> ids{0};
    std::random_device random;
    char name[64];
    std::snprintf(name, sizeof name, "/cuda-emu-nccl-%d-%d-%08x%08x", int(getpid()), ids++,
                  random(), random());
    return name;
}

void release(Comm* c, State state) {
    c->shared->slots[c->rank].state.store(state);
    close(c->fd);  // releases the lock: the others see this rank ended
    std::lock_guard<std::mutex> g(g_lock);
    g_live.erase(c);
    g_ended.insert(c);
}

/// Joins rank `rank` of `nranks` to the segment `name`: its slot, then the wait
/// for every rank. On failure the communicator is left unusable.
ncclResult_t join(Comm* c, std::string* message) {
    const size_t size = sizeof(Shared);
    c->fd = shm_open(c->name.c_str(), O_RDWR | O_CREAT, 0600);
    struct stat st;
    if (c->fd < 0 || fstat(c->fd, &st) != 0 ||
        (size_t(st.st_size) < size && ftruncate(c->fd, off_t(size)) != 0)) {
        *message = "cannot create the shared memory " + c->name + ": " + std::strerror(errno);
        return ncclSystemError;
    }
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, c->fd, 0);
    if (p == MAP_FAILED) {
        *message = "cannot map the shared memory " + c->name + ": " + std::strerror(errno);
        return ncclSystemError;
    }
    c->shared = static_cast<Shared*>(p);
    int expected = 0;
    if (!c->shared->ranks.compare_exchange_strong(expected, c->ranks) && expected != c->ranks) {
        *message = "rank " + std::to_string(c->rank) + " was told of " + std::to_string(c->ranks) +
                   " ranks, an earlier rank of " + std::to_string(expected);
        return ncclInvalidUsage;
    }
    struct flock fl = {};
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = c->rank;
    fl.l_len = 1;
    Slot& me = c->shared->slots[c->rank];
    if (fcntl(c->fd, F_OFD_SETLK, &fl) != 0 || me.state.load() != kAbsent) {
        *message = "rank " + std::to_string(c->rank) + " joined twice";
        return ncclInvalidUsage;
    }
    me.pid = int(getpid());
    me.device = c->device;
    gethostname(me.host, sizeof me.host - 1);
    me.state.store(kJoined);
    c->shared->joined.fetch_add(1);
    const auto start = std::chrono::steady_clock::now();
    while (c->shared->joined.load() < c->ranks) {
        struct timespec nap = {0, 1000000};
        nanosleep(&nap, nullptr);
        for (int r = 0; r < c->ranks; r++) {
            const Slot& s = c->shared->slots[r];
            if (r == c->rank || s.state.load() != kJoined) continue;
            // Dead, unless every rank had joined by then (it died after its join).
            if (!alive(c, r) && c->shared->joined.load() < c->ranks) {
                *message = describe_rank(c, r) + " exited before every rank joined";
                return ncclRemoteError;
            }
        }
        if (seconds_since(start) > timeout_s()) {
            *message = std::to_string(c->shared->joined.load()) + " of " + std::to_string(c->ranks) +
                       " ranks joined within " + std::to_string(int(timeout_s())) +
                       " s (CUDA_EMU_NCCL_TIMEOUT)";
            return ncclSystemError;
        }
    }
    shm_unlink(c->name.c_str());  // every rank has it mapped
    for (int a = 0; a < c->ranks; a++) {
        for (int b = a + 1; b < c->ranks; b++) {
            const Slot &x = c->shared->slots[a], &y = c->shared->slots[b];
            if (x.device == y.device && std::strcmp(x.host, y.host) == 0) {
                *message = "Duplicate GPU detected: rank " + std::to_string(a) + " and rank " +
                           std::to_string(b) + " both on cuda:" + std::to_string(x.device) +
                           " of " + x.host;
                return ncclInvalidUsage;
            }
        }
    }
    return ncclSuccess;
}

}  // namespace

#define API extern "C" __attribute__((visibility("default")))

API ncclResult_t ncclGetVersion(int* version) {
    if (version == nullptr) return error(ncclInvalidArgument, "ncclGetVersion: version is null");
    const char* v = std::getenv("CUDA_EMU_NCCL_VERSION");
    *version = v ? std::atoi(v) : 22803;  // NCCL 2.28.3
    return ncclSuccess;
}

API const char* ncclGetErrorString(ncclResult_t result) {
    switch (result) {
        case ncclSuccess: return "no error";
        case ncclUnhandledCudaError: return "unhandled cuda error";
        case ncclSystemError: return "unhandled system error";
        case ncclInternalError: return "internal error";
        case ncclInvalidArgument: return "invalid argument";
        case ncclInvalidUsage: return "invalid usage";
        case ncclRemoteError: return "remote process exited or there was a network error";
        case ncclInProgress: return "NCCL operation in progress";
        default: return "unknown result code";
    }
}

API const char* ncclGetLastError(void*) {
    std::lock_guard<std::mutex> g(g_lock);
    tl_last_error = g_last_error;
    return tl_last_error.c_str();
}

API ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
    if (id == nullptr) return error(ncclInvalidArgument, "ncclGetUniqueId: id is null");
    std::memset(id->internal, 0, sizeof id->internal);
    std::memcpy(id->internal, kIdMagic, sizeof kIdMagic);
    std::string name = new_segment_name();
    std::memcpy(id->internal + sizeof kIdMagic, name.c_str(), name.size() + 1);
    return ncclSuccess;
}

API ncclResult_t ncclCommInitRank(void** comm, int nranks, ncclUniqueId id, int rank) {
    if (comm == nullptr) return error(ncclInvalidArgument, "ncclCommInitRank: comm is null");
    if (nranks < 1 || nranks > kMaxRanks || rank < 0 || rank >= nranks) {
        return error(ncclInvalidArgument, "ncclCommInitRank: rank " + std::to_string(rank) + " of " +
                                              std::to_string(nranks) + " (the emulator has 1 to " +
                                              std::to_string(kMaxRanks) + " ranks)");
    }
    if (std::memcmp(id.internal, kIdMagic, sizeof kIdMagic) != 0 ||
        std::memchr(id.internal + sizeof kIdMagic, '\0', sizeof id.internal - sizeof kIdMagic) == nullptr) {
        return error(ncclInvalidArgument, "ncclCommInitRank: the id is not one of ncclGetUniqueId");
    }
    int device = cuemu::current_device();
    if (device < 0) {
        return error(ncclInvalidUsage, "ncclCommInitRank: no CUDA context is current: make the "
                                       "rank's device current first");
    }
    auto* c = new Comm();
    c->name = id.internal + sizeof kIdMagic;
    c->rank = rank;
    c->ranks = nranks;
    c->device = device;
    std::string message;
    ncclResult_t r = join(c, &message);
    if (r != ncclSuccess) {
        shm_unlink(c->name.c_str());
        if (c->shared) c->shared->slots[rank].state.store(kFailed);
        if (c->fd >= 0) close(c->fd);
        return error(r, "ncclCommInitRank: " + message);
    }
    {
        std::lock_guard<std::mutex> g(g_lock);
        g_live.insert(c);
    }
    *comm = c;
    return ncclSuccess;
}

API ncclResult_t ncclCommDestroy(void* comm) {
    Comm* c;
    if (ncclResult_t r = live(comm, &c)) return r;
    // As NCCL's: the collectives queued on it complete first.
    for (const auto& [context, stream] : c->streams) cuemu::run_stream(context, stream);
    release(c, kDestroyed);
    return ncclSuccess;
}

API ncclResult_t ncclCommAbort(void* comm) {
    Comm* c;
    if (ncclResult_t r = live(comm, &c)) return r;
    c->aborted.store(true);  // its queued and running collectives stop
    release(c, kAborted);
    return ncclSuccess;
}

API ncclResult_t ncclCommGetAsyncError(void* comm, ncclResult_t* result) {
    return query(comm, result, [](const Comm& c) { return c.async.load(); });
}

API ncclResult_t ncclCommCount(void* comm, int* count) {
    return query(comm, count, [](const Comm& c) { return c.ranks; });
}

API ncclResult_t ncclCommCuDevice(void* comm, int* device) {
    return query(comm, device, [](const Comm& c) { return c.device; });
}

API ncclResult_t ncclCommUserRank(void* comm, int* rank) {
    return query(comm, rank, [](const Comm& c) { return c.rank; });
}

API ncclResult_t ncclGroupStart() {
    tl_depth++;
    return ncclSuccess;
}

API ncclResult_t ncclGroupEnd() {
    if (tl_depth == 0) return error(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    if (--tl_depth > 0) return ncclSuccess;
    std::vector<Pending> group = std::move(tl_group);
    tl_group.clear();
    // As NCCL's: a call of the group that failed fails the group, which queues nothing.
    if (ncclResult_t r = std::exchange(tl_group_error, ncclSuccess)) return r;
    if (ncclResult_t r = check_group(group)) return r;
    // One piece of work per communicator and stream, in the order of their first call.
    std::vector<bool> queued(group.size(), false);
    for (size_t i = 0; i < group.size(); i++) {
        if (queued[i]) continue;
        std::vector<Call> calls;
        for (size_t j = i; j < group.size(); j++) {
            if (!queued[j] && group[j].comm == group[i].comm && group[j].stream == group[i].stream) {
                calls.push_back(group[j].call);
                queued[j] = true;
            }
        }
        if (ncclResult_t r = enqueue(group[i].comm, group[i].context, group[i].stream, calls)) return r;
    }
    return ncclSuccess;
}

API ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, int type, int op,
                               void* comm, void* stream) {
    return collective(kAllReduce, send, recv, count, type, op, 0, comm, stream);
}

API ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, int type, int root,
                               void* comm, void* stream) {
    return collective(kBroadcast, send, recv, count, type, ncclSum, root, comm, stream);
}

API ncclResult_t ncclReduce(const void* send, void* recv, size_t count, int type, int op, int root,
                            void* comm, void* stream) {
    return collective(kReduce, send, recv, count, type, op, root, comm, stream);
}

API ncclResult_t ncclAllGather(const void* send, void* recv, size_t count, int type, void* comm,
                               void* stream) {
    return collective(kAllGather, send, recv, count, type, ncclSum, 0, comm, stream);
}

API ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t count, int type, int op,
                                   void* comm, void* stream) {
    return collective(kReduceScatter, send, recv, count, type, op, 0, comm, stream);
}
