#include "fiber.h"

#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>

#include <cstdint>
#include <cstdlib>

namespace cuemu {

#if defined(__x86_64__)
extern "C" void cuemu_fiber_switch(void** save_sp, void* load_sp);
extern "C" void cuemu_fiber_start();
// Saves the callee-saved registers and the stack pointer of the current context,
// then loads the other's (kernels leave the SSE and x87 control words alone).
asm(R"(
    .text
    .globl cuemu_fiber_switch
    .type cuemu_fiber_switch, @function
cuemu_fiber_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size cuemu_fiber_switch, .-cuemu_fiber_switch

    .globl cuemu_fiber_start
    .type cuemu_fiber_start, @function
cuemu_fiber_start:
    movq %r12, %rdi
    callq *%r13
    ud2
    .size cuemu_fiber_start, .-cuemu_fiber_start
)");

void prepare(Fiber& fiber, void (*entry)(void*), void* arg) {
    auto top = reinterpret_cast<uintptr_t>(fiber.stack + fiber.stack_size) & ~uintptr_t(15);
    // Popped by the switch: r15, r14, r13 (entry), r12 (arg), rbx, rbp, then the
    // return into cuemu_fiber_start, which leaves the stack 16-byte aligned.
    auto* frame = reinterpret_cast<uint64_t*>(top - 16 - 7 * 8);
    frame[0] = 0;
    frame[1] = 0;
    frame[2] = reinterpret_cast<uint64_t>(entry);
    frame[3] = reinterpret_cast<uint64_t>(arg);
    frame[4] = 0;
    frame[5] = 0;
    frame[6] = reinterpret_cast<uint64_t>(&cuemu_fiber_start);
    fiber.sp = frame;
}

static void switch_to(Fiber& from, Fiber& to) { cuemu_fiber_switch(&from.sp, to.sp); }
#else
static void start(unsigned int entry_hi, unsigned int entry_lo, unsigned int arg_hi,
                  unsigned int arg_lo) {
    auto join = [](unsigned int hi, unsigned int lo) { return (uint64_t(hi) << 32) | lo; };
    auto entry = reinterpret_cast<void (*)(void*)>(join(entry_hi, entry_lo));
    entry(reinterpret_cast<void*>(join(arg_hi, arg_lo)));
}

void prepare(Fiber& fiber, void (*entry)(void*), void* arg) {
    getcontext(&fiber.context);
    fiber.context.uc_stack.ss_sp = fiber.stack;
    fiber.context.uc_stack.ss_size = fiber.stack_size;
    fiber.context.uc_link = nullptr;
    auto e = reinterpret_cast<uint64_t>(entry);
    auto a = reinterpret_cast<uint64_t>(arg);
    makecontext(&fiber.context, reinterpret_cast<void (*)()>(start), 4, unsigned(e >> 32),
                unsigned(e), unsigned(a >> 32), unsigned(a));
}

static void switch_to(Fiber& from, Fiber& to) { swapcontext(&from.context, &to.context); }
#endif

void resume(Scheduler& scheduler, Fiber& fiber) {
    __sanitizer_start_switch_fiber(&scheduler.self.asan_fake_stack, fiber.stack,
                                   fiber.stack_size);
    switch_to(scheduler.self, fiber);
    __sanitizer_finish_switch_fiber(scheduler.self.asan_fake_stack, nullptr, nullptr);
}

void leave(Scheduler& scheduler, Fiber& fiber, bool finished) {
    __sanitizer_start_switch_fiber(finished ? nullptr : &fiber.asan_fake_stack,
                                   scheduler.stack_bottom, scheduler.stack_size);
    switch_to(fiber, scheduler.self);
    __sanitizer_finish_switch_fiber(fiber.asan_fake_stack, nullptr, nullptr);
}

void hand_off(Fiber& from, Fiber& to, bool finished) {
    __sanitizer_start_switch_fiber(finished ? nullptr : &from.asan_fake_stack, to.stack,
                                   to.stack_size);
    switch_to(from, to);
    __sanitizer_finish_switch_fiber(from.asan_fake_stack, nullptr, nullptr);
}

void forget_stack(Fiber& fiber) { __asan_unpoison_memory_region(fiber.stack, fiber.stack_size); }

}  // namespace cuemu
