// The block executor: each block of a launch runs on one host thread, its GPU
// threads as fibers scheduled round-robin. A thread runs until it exits or waits
// at a barrier or a warp collective; a barrier opens when every thread of the
// block has reached it, a collective when every lane of its mask has. What real
// hardware would hang on or leave undefined is a fault here: a thread that exits
// while others wait at a barrier, threads waiting at different barriers, a mask
// that names an exited or absent lane or leaves out the caller, lanes that meet
// with different masks or operations, and a block where nobody can go on.
//
// A missing barrier shows as a wrong result whichever thread comes first: the
// round-robin runs the block's threads in an order that changes from block to
// block and from launch to launch (forward, reverse, shuffled), so each pair of
// threads runs both ways round, and each block's `__shared__` memory starts
// poisoned (0xff bytes: NaN in f32 and bf16), never holding the previous block's
// values. Between two barriers a block's warps either run together — each pass
// of the round-robin takes every warp to its next collective, so no warp gets
// more than one collective ahead of another — or each alone: one warp runs
// until all its lanes wait at the barrier or have exited, then the next, so a
// warp may be any number of collectives ahead of the others, as on a GPU.

#include "block.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <mutex>
#include <string>
#include <vector>

#include <sanitizer/common_interface_defs.h>

#include "fiber.h"
#include "pool.h"

/// glibc's: the calling thread's copy of a module's thread-local storage, allocated
/// on first use (`index` is {module id, offset}).
extern "C" void* __tls_get_addr(void* index);

namespace cuemu {

namespace {

constexpr unsigned kMaxThreads = 1024;
constexpr size_t kStackSize = 64 << 10;
constexpr size_t kGuard = 4 << 10;

enum class State : uint8_t { Ready, AtBarrier, InWarp, Exited };

/// The order in which a block's round-robin runs its threads.
enum class Order : uint8_t { Forward, Reverse, Shuffled };

const char* order_name(Order order) {
    switch (order) {
        case Order::Forward: return "forward";
        case Order::Reverse: return "reverse";
        default: return "shuffled";
    }
}

/// How a block runs its threads between two barriers: in `order`, its warps
/// together (each pass of the round-robin takes every warp to its next collective)
/// or each warp alone (one warp runs until none of its lanes can go on before the
/// next runs; the order then keeps each warp's lanes together).
struct Turn {
    Order order = Order::Forward;
    bool warps_alone = false;
};

const char* warps_name(bool warps_alone) { return warps_alone ? "alone" : "together"; }

std::string turn_name(Turn turn) {
    return std::string(order_name(turn.order)) + " order, warps " + warps_name(turn.warps_alone);
}

struct Thread {
    cuemu_thread_ids ids;
    unsigned linear = 0;
    unsigned position = 0;  // its place in the round-robin's order
    // The positions of the threads it runs with between barriers, [first, end):
    // the block's, or its warp's when warps run alone.
    unsigned first = 0;
    unsigned end = 0;
    State state = State::Ready;
    Fiber fiber;
    // A pending warp collective.
    int op = 0;
    unsigned mask = 0;
    uint64_t value = 0;
    int lane_arg = 0;
    int width = 32;
    const char* file = "";
    int line = 0;
    uint64_t result = 0;
};

struct Warp {
    unsigned arrived = 0;  // lanes waiting in the current collective
};

/// One host thread's means to run blocks: fiber stacks for the largest block,
/// and the state of the block it runs.
struct Worker {
    Scheduler scheduler;
    char* stacks = nullptr;
    std::vector<Thread> threads = std::vector<Thread>(kMaxThreads);
    Warp warps[kMaxThreads / 32];
    const Launch* launch = nullptr;
    unsigned count = 0;  // threads of the block
    Turn turn;
    std::vector<unsigned> schedule = std::vector<unsigned>(kMaxThreads);  // threads in order
    unsigned live = 0;
    unsigned exited = 0;
    unsigned at_barrier = 0;
    const char* barrier_file = "";
    int barrier_line = 0;
    bool faulted = false;
    std::string fault;
    unsigned cursor = 0;  // the position the scheduler's pass has reached
    bool barrier_opened = false;  // the next pass starts from the first position

    Worker() {
        size_t per = kStackSize + kGuard;
        void* p = mmap(nullptr, per * kMaxThreads, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED) {
            std::fprintf(stderr, "cuda-emu: cannot map %zu MiB of fiber stacks\n",
                         per * kMaxThreads >> 20);
            std::abort();
        }
        stacks = static_cast<char*>(p);
        for (unsigned i = 0; i < kMaxThreads; i++) {
            char* base = stacks + i * per;
            mprotect(base, kGuard, PROT_NONE);
            threads[i].fiber.stack = base + kGuard;
            threads[i].fiber.stack_size = kStackSize;
        }
    }
};

// Initial-exec: read on every index and collective, without __tls_get_addr.
__attribute__((tls_model("initial-exec"))) thread_local Worker* tl_worker = nullptr;
__attribute__((tls_model("initial-exec"))) thread_local Thread* tl_thread = nullptr;

Worker& worker() {
    if (tl_worker == nullptr) {
        tl_worker = new Worker();  // one per host thread, for the process's life
    }
    return *tl_worker;
}

std::string where(const Thread& t, Turn turn) {
    char s[200];
    std::snprintf(s, sizeof s, "block (%u,%u,%u) (threads run in %s) thread (%u,%u,%u)",
                  t.ids.block_idx.x, t.ids.block_idx.y, t.ids.block_idx.z,
                  turn_name(turn).c_str(), t.ids.thread_idx.x, t.ids.thread_idx.y,
                  t.ids.thread_idx.z);
    return s;
}

std::string site(const char* file, int line) { return std::string(file) + ":" + std::to_string(line); }

std::string format(const char* fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return buf;
}

const char* op_name(int op) {
    switch (op) {
        case CUEMU_SHFL_IDX: return "__shfl_sync";
        case CUEMU_SHFL_XOR: return "__shfl_xor_sync";
        case CUEMU_SHFL_DOWN: return "__shfl_down_sync";
        case CUEMU_SHFL_UP: return "__shfl_up_sync";
        case CUEMU_BALLOT: return "a vote (__ballot/__any/__all_sync)";
        default: return "__syncwarp";
    }
}

/// Ends the running thread's fiber for good with a fault of its block.
[[noreturn]] void fault_here(const std::string& what) {
    Worker& w = worker();
    Thread& t = *tl_thread;
    if (!w.faulted) {
        w.faulted = true;
        w.fault = "kernel " + std::string(w.launch->kernel.name) + ", " + where(t, w.turn) + ": " +
                  what;
    }
    leave(w.scheduler, t.fiber, true);
    std::abort();  // never resumed
}

/// Leaves the running thread `t` for the next ready thread of the scheduler's
/// pass among those it runs with, or for the scheduler when there is none
/// (`finished`: `t` has exited).
void switch_away(Thread& t, bool finished) {
    Worker& w = worker();
    for (unsigned p = t.position + 1; p < t.end; p++) {
        Thread& next = w.threads[w.schedule[p]];
        if (next.state == State::Ready) {
            w.cursor = p;
            tl_thread = &next;
            hand_off(t.fiber, next.fiber, finished);
            return;
        }
    }
    leave(w.scheduler, t.fiber, finished);
}

/// Waits (as a fiber) until this thread is resumed.
void wait(Thread& t) { switch_away(t, false); }

void thread_main(void* arg) {
    Worker& w = worker();
    Thread& t = *static_cast<Thread*>(arg);
    const void* from_bottom;
    size_t from_size;
    __sanitizer_finish_switch_fiber(nullptr, &from_bottom, &from_size);
    if (w.scheduler.stack_bottom == nullptr) {
        // The first fiber of this host thread is entered from the scheduler.
        w.scheduler.stack_bottom = from_bottom;
        w.scheduler.stack_size = from_size;
    }
    w.launch->kernel.entry(const_cast<void**>(w.launch->args.data()));
    // The thread exits.
    t.state = State::Exited;
    w.live--;
    w.exited++;
    if (w.at_barrier > 0) {
        fault_here(format("exits while %u thread(s) wait at __syncthreads() at %s: a barrier "
                          "must be reached by every thread of the block",
                          w.at_barrier, site(w.barrier_file, w.barrier_line).c_str()));
    }
    Warp& warp = w.warps[t.linear / 32];
    unsigned lane = t.linear % 32;
    if (warp.arrived != 0) {
        const Thread& first = w.threads[t.linear - lane + __builtin_ctz(warp.arrived)];
        if (first.mask & (1u << lane)) {
            fault_here(format("lane %u exits while lanes 0x%08x wait for it in %s at %s (mask "
                              "0x%08x)",
                              lane, warp.arrived, op_name(first.op),
                              site(first.file, first.line).c_str(), first.mask));
        }
    }
    switch_away(t, true);
    std::abort();
}

/// A knob that fixes one of `choices` (its index) for every block, or -1 when it is
/// unset or `rotate` (the turns of `turn_of`).
int fixed_choice(const char* knob, std::initializer_list<const char*> choices) {
    const char* env = std::getenv(knob);
    std::string v = env ? env : "rotate";
    std::string names;
    int i = 0;
    for (const char* choice : choices) {
        if (v == choice) return i;
        names += std::string(choice) + ", ";
        i++;
    }
    if (v != "rotate") {
        std::fprintf(stderr, "cuda-emu: %s=%s: not %sor rotate\n", knob, v.c_str(), names.c_str());
        std::exit(2);
    }
    return -1;
}

/// `CUDA_EMU_ORDER`: `forward`, `reverse` or `shuffled` for every block.
int fixed_order() {
    static int order = fixed_choice("CUDA_EMU_ORDER", {order_name(Order::Forward),
                                                       order_name(Order::Reverse),
                                                       order_name(Order::Shuffled)});
    return order;
}

/// `CUDA_EMU_WARPS`: `together` or `alone` for every block.
int fixed_warps() {
    static int warps = fixed_choice("CUDA_EMU_WARPS", {warps_name(false), warps_name(true)});
    return warps;
}

uint64_t splitmix64(uint64_t& state) {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/// Shuffles `v[0..n)` with `state`.
void shuffle(unsigned* v, unsigned n, uint64_t& state) {
    for (unsigned p = n; p > 1; p--) {
        std::swap(v[p - 1], v[splitmix64(state) % p]);
    }
}

/// How block `index` of a kernel's launch number `launch` runs its threads. The
/// kernel's launches take six turns. Orders: blocks alternately forward and
/// reverse, then alternately reverse and forward, then every block shuffled, and
/// again. Warps: together in blocks 0, 1, 4, 5, 8, ... and alone in blocks 2, 3, 6,
/// 7, ... for three turns, the other way round for the next three. So each block
/// runs each of the six ways within six launches, and
/// - warps together, every pair of a block's threads has run both ways round by the
///   kernel's first launch if it has two blocks or more (blocks 0 and 1), by its
///   second if it has one;
/// - each warp alone, every pair of a block's warps has run one wholly before the
///   other and the other way round by its first launch if it has four blocks or
///   more (blocks 2 and 3), its second with three, its fourth with two and its fifth
///   with one.
Turn turn_of(uint64_t launch, uint64_t index) {
    Turn turn;
    switch (launch % 3) {
        case 0: turn.order = index % 2 == 0 ? Order::Forward : Order::Reverse; break;
        case 1: turn.order = index % 2 == 0 ? Order::Reverse : Order::Forward; break;
        default: turn.order = Order::Shuffled;
    }
    turn.warps_alone = (index / 2 + launch / 3) % 2 == 1;
    return turn;
}

/// Sets how block `index` of `launch` runs its threads (`turn_of`, or what
/// `CUDA_EMU_ORDER` and `CUDA_EMU_WARPS` fix): their order, and for each the
/// positions of those it runs with. The shuffle is seeded by the launch and the
/// block; with warps alone it shuffles the warps, then each warp's lanes.
void set_schedule(Worker& w, const Launch& launch, uint64_t index) {
    w.turn = turn_of(launch.sequence, index);
    if (int order = fixed_order(); order >= 0) w.turn.order = Order(order);
    if (int warps = fixed_warps(); warps >= 0) w.turn.warps_alone = warps == 1;
    unsigned* schedule = w.schedule.data();
    for (unsigned p = 0; p < w.count; p++) {
        schedule[p] = w.turn.order == Order::Reverse ? w.count - 1 - p : p;
    }
    if (w.turn.order == Order::Shuffled) {
        uint64_t state = launch.sequence * 0x100000001b3ull ^ index;
        if (!w.turn.warps_alone) {
            shuffle(schedule, w.count, state);
        } else {
            const unsigned warps = (w.count + 31) / 32;
            unsigned warp_order[kMaxThreads / 32];
            for (unsigned i = 0; i < warps; i++) warp_order[i] = i;
            shuffle(warp_order, warps, state);
            unsigned p = 0;
            for (unsigned i = 0; i < warps; i++) {
                const unsigned lanes = std::min(32u, w.count - 32 * warp_order[i]);
                for (unsigned lane = 0; lane < lanes; lane++) {
                    schedule[p + lane] = 32 * warp_order[i] + lane;
                }
                shuffle(schedule + p, lanes, state);
                p += lanes;
            }
        }
    }
    // Those each thread runs with: the block, or its warp, whose lanes the order
    // then keeps together.
    for (unsigned first = 0, end; first < w.count; first = end) {
        end = first + 1;
        while (end < w.count &&
               (!w.turn.warps_alone || schedule[end] / 32 == schedule[first] / 32)) {
            end++;
        }
        for (unsigned p = first; p < end; p++) {
            Thread& t = w.threads[schedule[p]];
            t.position = p;
            t.first = first;
            t.end = end;
        }
    }
}

/// Poisons this worker's copy of the module's `__shared__` memory (0xff bytes), so
/// that a block reads nothing an earlier block left there.
void poison_shared_memory(const SharedMemory& shared) {
    if (shared.bytes == 0) return;
    unsigned long index[2] = {shared.tls_module, 0};
    std::memset(__tls_get_addr(index), 0xff, shared.bytes);
}

/// Runs block `index` of the launch on this host thread; false on a fault.
bool run_block(Worker& w, const Launch& launch, uint64_t index) {
    const cuemu_uint3 g = launch.grid, b = launch.block;
    cuemu_uint3 block_idx = {unsigned(index % g.x), unsigned(index / g.x % g.y),
                             unsigned(index / (uint64_t(g.x) * g.y))};
    w.launch = &launch;
    w.count = b.x * b.y * b.z;
    set_schedule(w, launch, index);
    poison_shared_memory(launch.shared);
    w.live = w.count;
    w.exited = 0;
    w.at_barrier = 0;
    w.barrier_opened = false;
    w.faulted = false;
    for (unsigned i = 0; i < (w.count + 31) / 32; i++) {
        w.warps[i].arrived = 0;
    }
    for (unsigned i = 0; i < w.count; i++) {
        Thread& t = w.threads[i];
        t.ids = {{i % b.x, i / b.x % b.y, i / (b.x * b.y)}, block_idx, b, g};
        t.linear = i;
        t.state = State::Ready;
        prepare(t.fiber, thread_main, &t);
    }
    while (w.live > 0 && !w.faulted) {
        bool ran = false;
        for (unsigned p = 0; p < w.count && !w.faulted;) {
            Thread& t = w.threads[w.schedule[p]];
            if (t.state != State::Ready) {
                p++;
                continue;
            }
            w.cursor = p;
            tl_thread = &t;
            resume(w.scheduler, t.fiber);
            ran = true;
            if (w.barrier_opened) {
                w.barrier_opened = false;
                break;  // the threads after the barrier run in the block's order
            }
            // Threads handed off to each other up to the cursor. Warps together: the
            // pass goes on after it; a warp alone: from its first lane again, until
            // none of its lanes can go on (all wait at the barrier or have exited).
            const Thread& last = w.threads[w.schedule[w.cursor]];
            p = w.turn.warps_alone ? last.first : w.cursor + 1;
        }
        if (!ran && !w.faulted) {
            // Nobody can go on: describe who waits where.
            std::string waits;
            for (unsigned i = 0; i < (w.count + 31) / 32; i++) {
                unsigned arrived = w.warps[i].arrived;
                if (arrived != 0) {
                    const Thread& t = w.threads[i * 32 + __builtin_ctz(arrived)];
                    waits += format("; warp %u: lanes 0x%08x wait in %s at %s with mask 0x%08x",
                                    i, arrived, op_name(t.op), site(t.file, t.line).c_str(),
                                    t.mask);
                }
            }
            if (w.at_barrier > 0) {
                waits += format("; %u of %u threads wait at __syncthreads() at %s", w.at_barrier,
                                w.count, site(w.barrier_file, w.barrier_line).c_str());
            }
            w.faulted = true;
            w.fault = format("kernel %s, block (%u,%u,%u) (threads run in %s): deadlock, no "
                             "thread can go on",
                             launch.kernel.name, block_idx.x, block_idx.y, block_idx.z,
                             turn_name(w.turn).c_str()) +
                      waits;
        }
    }
    if (w.faulted) {
        for (unsigned i = 0; i < w.count; i++) {
            if (w.threads[i].state != State::Exited) {
                forget_stack(w.threads[i].fiber);
            }
        }
    }
    tl_thread = nullptr;
    return !w.faulted;
}

}  // namespace

std::string execute(const Launch& launch) {
    uint64_t blocks = uint64_t(launch.grid.x) * launch.grid.y * launch.grid.z;
    std::atomic<bool> faulted{false};
    std::mutex fault_mutex;
    std::string fault;
    parallel_for(blocks, [&](size_t i) {
        if (faulted.load(std::memory_order_relaxed)) return;
        Worker& w = worker();
        if (!run_block(w, launch, i)) {
            std::lock_guard<std::mutex> lock(fault_mutex);
            if (!faulted.exchange(true)) fault = w.fault;
        }
    });
    return fault;
}

}  // namespace cuemu

using namespace cuemu;

extern "C" {

const cuemu_thread_ids* cuemu_self(void) { return &tl_thread->ids; }

void cuemu_syncthreads(const char* file, int line) {
    Worker& w = worker();
    Thread& t = *tl_thread;
    if (w.exited > 0) {
        fault_here(format("__syncthreads() at %s is never reached by the %u thread(s) of the "
                          "block that have exited",
                          site(file, line).c_str(), w.exited));
    }
    if (w.at_barrier > 0 && (w.barrier_line != line || w.barrier_file != file)) {
        fault_here(format("waits at __syncthreads() at %s while %u thread(s) wait at the one "
                          "at %s",
                          site(file, line).c_str(), w.at_barrier,
                          site(w.barrier_file, w.barrier_line).c_str()));
    }
    w.barrier_file = file;
    w.barrier_line = line;
    if (++w.at_barrier == w.count) {
        // The barrier opens. The last thread to arrive waits too, so that the code
        // after the barrier runs in the block's order from its first thread.
        w.at_barrier = 0;
        for (unsigned i = 0; i < w.count; i++) {
            if (w.threads[i].state == State::AtBarrier) w.threads[i].state = State::Ready;
        }
        w.barrier_opened = true;
        leave(w.scheduler, t.fiber, false);
        return;
    }
    t.state = State::AtBarrier;
    wait(t);
}

uint64_t cuemu_warp(int op, unsigned mask, uint64_t value, int lane_arg, int width,
                    const char* file, int line) {
    Worker& w = worker();
    Thread& t = *tl_thread;
    const unsigned lane = t.linear % 32;
    const unsigned base = t.linear - lane;
    Warp& warp = w.warps[t.linear / 32];
    if (!(mask & (1u << lane))) {
        fault_here(format("lane %u calls %s at %s with mask 0x%08x, which leaves it out", lane,
                          op_name(op), site(file, line).c_str(), mask));
    }
    if (warp.arrived == 0) {
        // The first lane checks the mask for all: a lane that exits later while
        // named by it is caught when it exits.
        if (width < 1 || width > 32 || (width & (width - 1)) != 0) {
            fault_here(format("%s at %s with width %d: a power of two from 1 to 32", op_name(op),
                              site(file, line).c_str(), width));
        }
        for (unsigned l = 0; l < 32; l++) {
            if (!(mask & (1u << l))) continue;
            if (base + l >= w.count) {
                fault_here(format("%s at %s: mask 0x%08x names lane %u, which this block of %u "
                                  "threads does not have",
                                  op_name(op), site(file, line).c_str(), mask, l, w.count));
            }
            if (w.threads[base + l].state == State::Exited) {
                fault_here(format("%s at %s: mask 0x%08x names lane %u, which has exited",
                                  op_name(op), site(file, line).c_str(), mask, l));
            }
        }
    } else {
        const Thread& first = w.threads[base + __builtin_ctz(warp.arrived)];
        if (first.mask != mask || first.op != op || first.line != line || first.file != file) {
            fault_here(format("lane %u calls %s at %s with mask 0x%08x while lanes 0x%08x wait "
                              "in %s at %s with mask 0x%08x",
                              lane, op_name(op), site(file, line).c_str(), mask, warp.arrived,
                              op_name(first.op), site(first.file, first.line).c_str(),
                              first.mask));
        }
    }
    t.op = op;
    t.mask = mask;
    t.value = value;
    t.lane_arg = lane_arg;
    t.width = width;
    t.file = file;
    t.line = line;
    warp.arrived |= 1u << lane;
    if (warp.arrived != mask) {
        t.state = State::InWarp;
        wait(t);
        return t.result;
    }
    // Every lane is here: compute each lane's result, then let them all go.
    uint64_t ballot = 0;
    for (unsigned l = 0; l < 32 && op == CUEMU_BALLOT; l++) {
        if ((mask & (1u << l)) && w.threads[base + l].value != 0) ballot |= 1u << l;
    }
    for (unsigned l = 0; l < 32; l++) {
        if (!(mask & (1u << l))) continue;
        Thread& u = w.threads[base + l];
        const unsigned segment = l & ~unsigned(width - 1);
        int src = int(l);
        switch (op) {
            case CUEMU_SHFL_IDX: src = int(segment + unsigned(u.lane_arg) % unsigned(width)); break;
            case CUEMU_SHFL_XOR: {
                int x = int(l) ^ u.lane_arg;
                src = x < int(segment + width) ? x : int(l);
                break;
            }
            case CUEMU_SHFL_DOWN: {
                int x = int(l) + u.lane_arg;
                src = x < int(segment + width) ? x : int(l);
                break;
            }
            case CUEMU_SHFL_UP: {
                int x = int(l) - u.lane_arg;
                src = x >= int(segment) ? x : int(l);
                break;
            }
            default: break;
        }
        if (op == CUEMU_BALLOT) {
            u.result = ballot;
        } else if (op == CUEMU_SYNCWARP) {
            u.result = 0;
        } else {
            if (src < 0 || src > 31 || !(mask & (1u << src))) {
                fault_here(format("%s at %s: lane %u reads lane %d, which is not in the mask "
                                  "0x%08x",
                                  op_name(op), site(file, line).c_str(), l, src, mask));
            }
            u.result = w.threads[base + src].value;
        }
        if (&u != &t) u.state = State::Ready;
    }
    warp.arrived = 0;
    return t.result;
}

void cuemu_kernel_fault(const char* file, int line, const char* what) {
    fault_here(std::string(what) + " at " + site(file, line));
}
}
