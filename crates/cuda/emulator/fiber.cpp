// Fiber switching (see fiber.hpp).

#include "fiber.hpp"

#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && defined(__linux__)

// tandem_emu_switch(void** save, void* load): pushes the callee-saved registers and the
// x87 control word and MXCSR, stores the stack pointer in *save, loads `load` and pops
// the same from there. A fresh fiber's stack is laid out as if it had switched away (see
// fiber_init), with tandem_emu_fiber_start as the return address.
asm(R"(
    .text
    .globl tandem_emu_switch
    .type tandem_emu_switch, @function
tandem_emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $16, %rsp
    fnstcw (%rsp)
    stmxcsr 8(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    fldcw (%rsp)
    ldmxcsr 8(%rsp)
    addq $16, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size tandem_emu_switch, .-tandem_emu_switch

    .globl tandem_emu_fiber_start
    .type tandem_emu_fiber_start, @function
tandem_emu_fiber_start:
    call *%r12
    ud2
    .size tandem_emu_fiber_start, .-tandem_emu_fiber_start
    .section .note.GNU-stack,"",@progbits
    .text
)");

extern "C" void tandem_emu_switch(void** save, void* load);
extern "C" void tandem_emu_fiber_start();

namespace tandem_emu {

void fiber_switch(FiberContext* from, FiberContext* to) { tandem_emu_switch(&from->sp, to->sp); }

void fiber_init(FiberContext* c, char* stack, size_t size, void (*entry)()) {
    uintptr_t top = ((uintptr_t)stack + size) & ~(uintptr_t)15;
    // From the saved stack pointer up: control words (16 bytes), r15, r14, r13, r12, rbx,
    // rbp, the return address. After `ret` the stack pointer is top - 16, 16-byte
    // aligned, so the `call` in tandem_emu_fiber_start enters `entry` as the ABI wants.
    uint64_t* sp = (uint64_t*)(top - 88);
    memset(sp, 0, 88);
    uint16_t fpcw = 0x037f;   // the x87 default: round to nearest, all exceptions masked
    uint32_t mxcsr = 0x1f80;  // the SSE default: likewise, no flush to zero
    memcpy(&sp[0], &fpcw, sizeof fpcw);
    memcpy(&sp[1], &mxcsr, sizeof mxcsr);
    sp[5] = (uint64_t)(uintptr_t)entry; // r12
    sp[8] = (uint64_t)(uintptr_t)&tandem_emu_fiber_start;
    c->sp = sp;
}

} // namespace tandem_emu

#else

namespace tandem_emu {

void fiber_switch(FiberContext* from, FiberContext* to) {
    swapcontext(&from->context, &to->context);
}

void fiber_init(FiberContext* c, char* stack, size_t size, void (*entry)()) {
    getcontext(&c->context);
    c->context.uc_stack.ss_sp = stack;
    c->context.uc_stack.ss_size = size;
    c->context.uc_link = nullptr;
    makecontext(&c->context, entry, 0);
}

} // namespace tandem_emu

#endif
