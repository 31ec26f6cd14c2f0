// Fibers: a stack and saved registers per emulated CUDA thread, switched cooperatively.
// On x86-64 Linux a few instructions save and restore the callee-saved registers (no
// system call, unlike swapcontext, which also saves the signal mask: the attention tests
// switch tens of millions of times); elsewhere ucontext.

#pragma once

#include <stddef.h>

#if !(defined(__x86_64__) && defined(__linux__))
#include <ucontext.h>
#endif

namespace tandem_emu {

#if defined(__x86_64__) && defined(__linux__)
struct FiberContext {
    void* sp = nullptr; // the stack pointer at the fiber's last switch
};
#else
struct FiberContext {
    ucontext_t context;
};
#endif

// Saves the running context in `from` and resumes `to`.
void fiber_switch(FiberContext* from, FiberContext* to);

// Prepares `c` to run `entry` on `stack` (`size` bytes) when first switched to. `entry`
// must never return: it ends by switching away for good.
void fiber_init(FiberContext* c, char* stack, size_t size, void (*entry)());

} // namespace tandem_emu
