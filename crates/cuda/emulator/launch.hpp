// Launching an emulated kernel by name with cuLaunchKernel's argument convention: `args[i]`
// points to the value of parameter i. The build script's generated program lists its
// kernels in a table of `Kernel` entries, each calling its kernel with unpacked arguments.

#pragma once

#include <stddef.h>

#include <utility>

#include "cuda_cpu.hpp"

namespace tandem_emu {

struct Kernel {
    const char* name;
    size_t arity;
    void (*call)(void** args);
};

template <class F>
struct Arity;
template <class... A>
struct Arity<void (*)(A...)> {
    static constexpr size_t value = sizeof...(A);
};

template <class... A, size_t... I>
void call_unpacked(void (*k)(A...), void** args, std::index_sequence<I...>) {
    k(*static_cast<typename std::remove_cv<A>::type*>(args[I])...);
}

// Calls kernel K with the values `args` point to.
template <auto K>
void call(void** args) {
    call_unpacked(K, args, std::make_index_sequence<Arity<decltype(K)>::value>{});
}

template <auto K>
constexpr Kernel entry(const char* name) {
    return Kernel{name, Arity<decltype(K)>::value, &call<K>};
}

// Runs kernel `name` of `table` on `grid` blocks of `block` threads (x only) with `shared`
// bytes of dynamic shared memory in `dynamic` (`capacity` bytes). Returns 0, or -1 with a
// message in `err` (also when a block wrote past its `shared` bytes).
int launch(const Kernel* table, size_t count, const char* name, const unsigned* grid,
           unsigned block, unsigned shared, unsigned char* dynamic, size_t capacity,
           void** args, size_t num_args, char* err, size_t err_len);

} // namespace tandem_emu
