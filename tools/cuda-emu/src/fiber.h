// Fibers: the GPU threads of a block, each with its own stack, switched by hand
// (a few instructions on x86-64; ucontext elsewhere), with AddressSanitizer told
// of every switch so it checks the fibers' stacks like any other.
#pragma once

#include <cstddef>

#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace cuemu {

struct Fiber {
#if defined(__x86_64__)
    void* sp = nullptr;
#else
    ucontext_t context;
#endif
    char* stack = nullptr;  // lowest usable address (a guard page lies below)
    size_t stack_size = 0;
    void* asan_fake_stack = nullptr;
};

/// The stack a worker thread schedules its fibers from.
struct Scheduler {
    Fiber self;
    const void* stack_bottom = nullptr;
    size_t stack_size = 0;
};

/// Prepares `fiber` to run `entry(arg)` from the top of its stack on the next
/// `resume`; `entry` never returns (it ends with `leave(…, true)`).
void prepare(Fiber& fiber, void (*entry)(void*), void* arg);
/// Runs `fiber` until it leaves.
void resume(Scheduler& scheduler, Fiber& fiber);
/// Returns from the running `fiber` to the scheduler; `finished` when it will never
/// be resumed.
void leave(Scheduler& scheduler, Fiber& fiber, bool finished);
/// Switches from the running fiber `from` straight to `to` (prepared or left).
void hand_off(Fiber& from, Fiber& to, bool finished);
/// Marks a fiber's stack clean again after it was abandoned mid-way (a fault).
void forget_stack(Fiber& fiber);

}  // namespace cuemu
