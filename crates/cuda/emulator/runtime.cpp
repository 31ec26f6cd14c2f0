// The emulator's scheduler: a block's CUDA threads as fibers, barriers that release when
// every live thread of their scope has arrived, deadlock detection, and odd blocks run in
// reverse thread order (races between a block's threads show as different results).

#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#if defined(__unix__) || defined(__APPLE__)
#include <sys/mman.h>
#include <unistd.h>
#define TANDEM_EMU_GUARD_PAGES 1
#endif

#include "fiber.hpp"
#include "launch.hpp"

namespace tandem_emu {
namespace {

// Bytes of each fiber's stack: kernels keep a few hundred bytes of locals.
constexpr size_t STACK_BYTES = 128 << 10;
constexpr unsigned MAX_THREADS = 1024;

struct Barrier {
    unsigned arrived = 0;
    unsigned generation = 0;
};

// A queued cp.async copy of 16 bytes.
struct AsyncCopy {
    void* dst;
    const void* src;
};

struct Fiber {
    FiberContext context;
    Dim3 index;
    bool done = false;
    const Barrier* waiting = nullptr; // the barrier it waits at, if any
    unsigned generation = 0;          // that barrier's generation when it arrived
    std::vector<AsyncCopy> copies;    // queued, oldest first
    std::vector<size_t> group_ends;   // committed groups: their ends in `copies`
};

// The block being run.
struct Block {
    Dim3 index, dim, grid;
    std::vector<Fiber> fibers;
    unsigned live = 0; // threads that have not returned
    std::vector<unsigned> warp_live;
    Barrier block_barrier;
    std::vector<Barrier> warp_barriers;
    std::vector<uint64_t> slots; // 32 per warp
    std::vector<uint64_t> areas; // 32 * 16 per warp
    FiberContext scheduler;
    size_t current = 0;
    void (*call)(void**) = nullptr;
    void** args = nullptr;
};

// The block being run by this OS thread's launch.
thread_local Block* running = nullptr;

// Buffers of the program's `__shared__` declarations, by id (see static_shared).
struct SharedBuffer {
    std::unique_ptr<unsigned char, decltype(&free)> bytes{nullptr, &free};
    size_t size = 0;
};
thread_local std::unordered_map<unsigned, SharedBuffer> shared_buffers;

// Fills every shared buffer with all ones, as a block finds shared memory.
void poison_shared() {
    for (auto& entry : shared_buffers) {
        memset(entry.second.bytes.get(), 0xff, entry.second.size);
    }
}

// The fibers' stacks, each above an inaccessible guard page where the system allows it, so
// a stack overflow faults at once instead of overwriting the next fiber's stack.
class Stacks {
  public:
    explicit Stacks(unsigned count) {
#ifdef TANDEM_EMU_GUARD_PAGES
        page_ = (size_t)sysconf(_SC_PAGESIZE);
        stride_ = page_ + STACK_BYTES;
        len_ = stride_ * count;
        void* p = mmap(nullptr, len_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) {
            return;
        }
        base_ = static_cast<char*>(p);
        for (unsigned t = 0; t < count; ++t) {
            mprotect(base_ + t * stride_, page_, PROT_NONE);
        }
#else
        stride_ = STACK_BYTES;
        owned_.reset(new char[(size_t)count * STACK_BYTES]);
        base_ = owned_.get();
#endif
    }
    ~Stacks() {
#ifdef TANDEM_EMU_GUARD_PAGES
        if (base_ != nullptr) {
            munmap(base_, len_);
        }
#endif
    }
    Stacks(const Stacks&) = delete;
    Stacks& operator=(const Stacks&) = delete;

    bool ok() const { return base_ != nullptr; }
    // The lowest address of thread t's stack.
    char* stack(unsigned t) const { return base_ + (size_t)t * stride_ + page_; }

  private:
    char* base_ = nullptr;
    size_t page_ = 0;
    size_t stride_ = 0;
    size_t len_ = 0;
    std::unique_ptr<char[]> owned_;
};

Fiber& me() { return running->fibers[running->current]; }
unsigned my_warp() { return me().index.x >> 5; }

void release(Barrier& b) {
    b.arrived = 0;
    b.generation += 1;
}

void arrive(Barrier& b, unsigned expected) {
    unsigned generation = b.generation;
    b.arrived += 1;
    if (b.arrived >= expected) {
        release(b);
        return;
    }
    Fiber& f = me();
    f.waiting = &b;
    f.generation = generation;
    fiber_switch(&f.context, &running->scheduler);
}

void fiber_main() {
    running->call(running->args);
    Fiber& f = me();
    f.done = true;
    unsigned w = my_warp();
    running->live -= 1;
    running->warp_live[w] -= 1;
    // Threads that return no longer count: a barrier the others wait at may now be full.
    Barrier& b = running->block_barrier;
    if (b.arrived > 0 && b.arrived >= running->live) {
        release(b);
    }
    Barrier& wb = running->warp_barriers[w];
    if (wb.arrived > 0 && wb.arrived >= running->warp_live[w]) {
        release(wb);
    }
    fiber_switch(&f.context, &running->scheduler); // never resumed
}

bool runnable(const Fiber& f) {
    return !f.done && (f.waiting == nullptr || f.waiting->generation != f.generation);
}

std::string deadlock_report(const Block& b) {
    std::string s = "deadlock in block (" + std::to_string(b.index.x) + ", " +
                    std::to_string(b.index.y) + ", " + std::to_string(b.index.z) + "): ";
    unsigned at_block = 0, at_warp = 0;
    for (const Fiber& f : b.fibers) {
        if (f.done) {
            continue;
        }
        if (f.waiting == &b.block_barrier) {
            at_block += 1;
        } else {
            at_warp += 1;
        }
    }
    s += std::to_string(at_block) + " threads wait at __syncthreads and " +
         std::to_string(at_warp) + " at a warp barrier of " + std::to_string(b.live) +
         " live threads (a barrier skipped by some threads, or a shuffle by part of a warp)";
    return s;
}

// Runs one block to completion; returns an empty string or what went wrong. Between two
// barriers each thread runs alone until it waits, in thread order, or from the last thread
// to the first when `reverse`: a thread that reads what another wrote without a barrier
// between them sees the write in one order and not in the other, so a test whose kernel
// lacks a barrier gets different results from its odd and its even blocks.
std::string run_block(Block& b, const Stacks& stacks, bool reverse) {
    unsigned threads = b.dim.x;
    unsigned warps = (threads + 31) / 32;
    b.fibers.assign(threads, Fiber{});
    b.live = threads;
    b.warp_live.assign(warps, 0);
    for (unsigned t = 0; t < threads; ++t) {
        b.warp_live[t / 32] += 1;
    }
    b.block_barrier = Barrier{};
    b.warp_barriers.assign(warps, Barrier{});
    b.slots.assign(32 * (size_t)warps, 0);
    b.areas.assign(32 * 16 * (size_t)warps, 0);
    for (unsigned t = 0; t < threads; ++t) {
        Fiber& f = b.fibers[t];
        f.index = Dim3{t, 0, 0};
        fiber_init(&f.context, stacks.stack(t), STACK_BYTES, fiber_main);
    }
    while (b.live > 0) {
        bool progressed = false;
        for (size_t i = 0; i < threads; ++i) {
            size_t t = reverse ? threads - 1 - i : i;
            Fiber& f = b.fibers[t];
            if (!runnable(f)) {
                continue;
            }
            f.waiting = nullptr;
            b.current = t;
            progressed = true;
            fiber_switch(&b.scheduler, &f.context);
        }
        if (!progressed) {
            return deadlock_report(b);
        }
    }
    return std::string();
}

} // namespace

void* static_shared(unsigned id, size_t bytes) {
    SharedBuffer& b = shared_buffers[id];
    if (b.size != bytes) {
        size_t rounded = (bytes + 63) / 64 * 64;
        b.bytes.reset(static_cast<unsigned char*>(aligned_alloc(64, rounded == 0 ? 64 : rounded)));
        if (b.bytes == nullptr) {
            abort(); // no memory for a few KiB: nothing sensible is left to do
        }
        b.size = bytes;
        memset(b.bytes.get(), 0xff, bytes);
    }
    return b.bytes.get();
}

void async_copy16(void* dst, const void* src) {
    if (((uintptr_t)dst | (uintptr_t)src) % 16 != 0) {
        __builtin_trap(); // cp.async of 16 bytes needs both addresses 16-byte aligned
    }
    // Until its group is waited for, the destination holds neither the old bytes nor the
    // new ones for sure: garbage now (a thread still reading the old bytes without a barrier
    // since sees it), the copy's bytes at the wait.
    memset(dst, 0xff, 16);
    me().copies.push_back(AsyncCopy{dst, src});
}

void async_commit() {
    Fiber& f = me();
    f.group_ends.push_back(f.copies.size());
}

void async_wait(unsigned pending) {
    Fiber& f = me();
    if (f.group_ends.size() <= pending) {
        return;
    }
    size_t groups = f.group_ends.size() - pending;
    size_t end = f.group_ends[groups - 1];
    for (size_t i = 0; i < end; ++i) {
        memcpy(f.copies[i].dst, f.copies[i].src, 16);
    }
    f.copies.erase(f.copies.begin(), f.copies.begin() + (ptrdiff_t)end);
    f.group_ends.erase(f.group_ends.begin(), f.group_ends.begin() + (ptrdiff_t)groups);
    for (size_t& e : f.group_ends) {
        e -= end;
    }
}

const Dim3& thread_idx() { return me().index; }
const Dim3& block_idx() { return running->index; }
const Dim3& block_dim() { return running->dim; }
const Dim3& grid_dim() { return running->grid; }

void sync_block() { arrive(running->block_barrier, running->live); }

void sync_warp() {
    unsigned w = my_warp();
    arrive(running->warp_barriers[w], running->warp_live[w]);
}

void sync_full_warp() {
    if (running->warp_live[my_warp()] != 32) {
        __builtin_trap();
    }
    sync_warp();
}

uint64_t& warp_slot(unsigned lane) { return running->slots[32 * (size_t)my_warp() + lane]; }

uint64_t* warp_area(unsigned lane) {
    return &running->areas[16 * (32 * (size_t)my_warp() + lane)];
}

// Bytes past a launch's dynamic shared memory checked after each block, and their pattern.
constexpr size_t GUARD_BYTES = 4096;
constexpr unsigned char GUARD_BYTE = 0xa5;

int launch(const Kernel* table, size_t count, const char* name, const unsigned* grid,
           unsigned block, unsigned shared, unsigned char* dynamic, size_t capacity,
           void** args, size_t num_args, char* err, size_t err_len) {
    auto fail = [&](const std::string& msg) {
        snprintf(err, err_len, "%s: %s", name, msg.c_str());
        return -1;
    };
    const Kernel* k = nullptr;
    for (size_t i = 0; i < count; ++i) {
        if (strcmp(table[i].name, name) == 0) {
            k = &table[i];
        }
    }
    if (k == nullptr) {
        return fail("no such kernel in the emulated program");
    }
    if (num_args != k->arity) {
        return fail("launched with " + std::to_string(num_args) + " arguments; the kernel takes " +
                    std::to_string(k->arity));
    }
    if (block == 0 || block > MAX_THREADS) {
        return fail("blocks of " + std::to_string(block) + " threads (1 to 1024)");
    }
    if (shared > capacity) {
        return fail(std::to_string(shared) + " bytes of dynamic shared memory, more than the " +
                    std::to_string(capacity) + " the emulator holds");
    }
    if (running != nullptr) {
        return fail("a launch from inside a kernel");
    }
    Stacks stacks(block);
    if (!stacks.ok()) {
        return fail("no memory for " + std::to_string(block) + " fiber stacks");
    }
    size_t guard = std::min(GUARD_BYTES, capacity - shared);
    Block b;
    b.dim = Dim3{block, 1, 1};
    b.grid = Dim3{grid[0], grid[1], grid[2]};
    b.call = k->call;
    b.args = args;
    running = &b;
    std::string problem;
    for (unsigned z = 0; z < grid[2] && problem.empty(); ++z) {
        for (unsigned y = 0; y < grid[1] && problem.empty(); ++y) {
            for (unsigned x = 0; x < grid[0] && problem.empty(); ++x) {
                b.index = Dim3{x, y, z};
                // Shared memory starts as garbage: all ones (NaN as floats) makes a read
                // of bytes nobody stored show. The bytes past the launch's dynamic shared
                // memory hold a guard pattern, so that a block writing past its share
                // (which a GPU may not report) fails the launch.
                memset(dynamic, 0xff, shared);
                memset(dynamic + shared, GUARD_BYTE, guard);
                poison_shared();
                bool odd = ((size_t)z * grid[1] * grid[0] + (size_t)y * grid[0] + x) % 2 == 1;
                problem = run_block(b, stacks, odd);
                for (size_t i = 0; i < guard && problem.empty(); ++i) {
                    if (dynamic[shared + i] != GUARD_BYTE) {
                        problem = "a block wrote past its " + std::to_string(shared) +
                                  " bytes of dynamic shared memory (at byte " +
                                  std::to_string(shared + i) + ")";
                    }
                }
            }
        }
    }
    running = nullptr;
    return problem.empty() ? 0 : fail(problem);
}

} // namespace tandem_emu
