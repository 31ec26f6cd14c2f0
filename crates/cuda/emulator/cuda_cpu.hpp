// The CUDA built-ins that tandem's kernels use, on the CPU: thread and block indices, block
// and warp barriers, warp shuffles, atomics, bit casts and the rounding intrinsics. The
// build script includes this header before the kernel program (compiled as C++) so that
// the kernels in kernels/*.cu run unchanged on a CPU without a GPU, for tests.
//
// Execution model (runtime.cpp): the blocks of a launch run one after another; within a
// block every CUDA thread is a fiber with its own stack, run until it reaches a barrier
// (__syncthreads, a warp shuffle, __syncwarp) or returns. A barrier releases once every
// thread of its scope that has not returned has arrived; a launch where no thread can go on
// fails with a message instead of hanging (a barrier some threads of the block skip, or a
// warp shuffle reached by only part of a warp). The build script turns each `__shared__`
// declaration into a reference to one buffer of the OS thread running the launch (tests run
// in parallel), which is exactly shared memory when blocks run one at a time; the buffers
// are filled with garbage (all ones: NaN as floats) before every block, as dynamic shared
// memory is, so a read of shared memory no thread of the block wrote shows.
//
// Arithmetic is the CPU's IEEE arithmetic with contraction off (-ffp-contract=off): the
// __d*_rn / __f*_rn intrinsics are the same separately rounded operations as on the GPU;
// expf, sqrtf and friends are the C library's, which may differ from CUDA's by an ulp.

#pragma once

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <type_traits>

namespace tandem_emu {

struct Dim3 {
    unsigned x, y, z;
};

const Dim3& thread_idx();
const Dim3& block_idx();
const Dim3& block_dim();
const Dim3& grid_dim();

// Waits for every live thread of the block.
void sync_block();
// Waits for every live lane of the calling thread's warp.
void sync_warp();
// sync_warp for the `.aligned` warp-wide matrix operations, which need all 32 lanes:
// traps if any lane of the warp has returned (or the block's last warp is partial).
void sync_full_warp();
// Lane `lane`'s slot of the calling warp's exchange area (8 bytes per lane).
uint64_t& warp_slot(unsigned lane);
// Lane `lane`'s 16 words of the calling warp's fragment area (warp-wide matrix operations).
uint64_t* warp_area(unsigned lane);

// One round of a warp shuffle: each lane publishes `v`, then reads lane `src`'s value.
template <class T>
T shuffle(T v, unsigned src) {
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "shuffle of 8 bytes");
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof(T));
    unsigned lane = thread_idx().x & 31u;
    warp_slot(lane) = bits;
    sync_warp();
    uint64_t got = warp_slot(src & 31u);
    sync_warp(); // every lane has read before any lane publishes again
    T out;
    memcpy(&out, &got, sizeof(T));
    return out;
}

template <class To, class From>
inline To bit_cast(From v) {
    static_assert(sizeof(To) == sizeof(From), "bit cast of equal sizes");
    To out;
    memcpy(&out, &v, sizeof(To));
    return out;
}

// cp.async (sm_80 and later: attention.cu's copy16_to_shared, copies_commit, copies_wait),
// adversarially: a thread's 16-byte copy from global to shared memory garbles its
// destination when issued and is only queued; `async_commit` closes the group of copies
// queued since the last one, and `async_wait(pending)` performs every committed group but
// the `pending` most recent, in order. A kernel that reads staged bytes before waiting for
// their group, or waits for the wrong number of groups, or lets a copy overwrite bytes
// another thread may still be reading (no barrier between), reads garbage, as it may on a
// GPU.
void async_copy16(void* dst, const void* src);
void async_commit();
void async_wait(unsigned pending);

// The buffer of `__shared__` declaration `id` (`bytes` bytes, 64-byte aligned), garbage
// at the start of each block.
void* static_shared(unsigned id, size_t bytes);

template <class T>
T& shared_static(unsigned id) {
    static_assert(std::is_trivially_copyable<T>::value, "shared memory holds plain data");
    return *static_cast<T*>(static_shared(id, sizeof(T)));
}

} // namespace tandem_emu

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __align__(n) __attribute__((aligned(n)))

#define threadIdx (::tandem_emu::thread_idx())
#define blockIdx (::tandem_emu::block_idx())
#define blockDim (::tandem_emu::block_dim())
#define gridDim (::tandem_emu::grid_dim())
#define warpSize 32

struct __attribute__((aligned(16))) uint4 {
    unsigned x, y, z, w;
};
struct __attribute__((aligned(16))) float4 {
    float x, y, z, w;
};
struct __attribute__((aligned(8))) uint2 {
    unsigned x, y;
};
struct __attribute__((aligned(8))) float2 {
    float x, y;
};

inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) {
    return uint4{x, y, z, w};
}
inline float2 make_float2(float x, float y) { return float2{x, y}; }

inline void __syncthreads() { ::tandem_emu::sync_block(); }
inline void __syncwarp(unsigned = 0xffffffffu) { ::tandem_emu::sync_warp(); }

template <class T>
inline T __shfl_sync(unsigned, T v, int src) {
    return ::tandem_emu::shuffle(v, (unsigned)src);
}
template <class T>
inline T __shfl_xor_sync(unsigned, T v, int mask) {
    return ::tandem_emu::shuffle(v, (threadIdx.x & 31u) ^ (unsigned)mask);
}
template <class T>
inline T __shfl_down_sync(unsigned, T v, unsigned delta) {
    unsigned lane = threadIdx.x & 31u;
    return ::tandem_emu::shuffle(v, lane + delta < 32 ? lane + delta : lane);
}
template <class T>
inline T __shfl_up_sync(unsigned, T v, unsigned delta) {
    unsigned lane = threadIdx.x & 31u;
    return ::tandem_emu::shuffle(v, lane >= delta ? lane - delta : lane);
}

// Fibers never run at the same time, so a read-modify-write is atomic as it stands.
template <class T>
inline T atomicOr(T* p, T v) {
    T old = *p;
    *p = old | v;
    return old;
}
template <class T>
inline T atomicAdd(T* p, T v) {
    T old = *p;
    *p = old + v;
    return old;
}
template <class T>
inline T atomicMin(T* p, T v) {
    T old = *p;
    *p = v < old ? v : old;
    return old;
}
template <class T>
inline T atomicMax(T* p, T v) {
    T old = *p;
    *p = old < v ? v : old;
    return old;
}

inline float __int_as_float(int v) { return ::tandem_emu::bit_cast<float>(v); }
inline float __uint_as_float(unsigned v) { return ::tandem_emu::bit_cast<float>(v); }
inline int __float_as_int(float v) { return ::tandem_emu::bit_cast<int>(v); }
inline unsigned __float_as_uint(float v) { return ::tandem_emu::bit_cast<unsigned>(v); }
inline double __longlong_as_double(long long v) { return ::tandem_emu::bit_cast<double>(v); }
inline long long __double_as_longlong(double v) { return ::tandem_emu::bit_cast<long long>(v); }

inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline float rsqrtf(float v) { return 1.0f / sqrtf(v); }
inline float __expf(float v) { return expf(v); }
inline float __logf(float v) { return logf(v); }
inline float __fdividef(float a, float b) { return a / b; }
template <class T>
inline T __ldg(const T* p) {
    return *p;
}

// CUDA's integer and mixed min/max overloads.
template <class A, class B>
inline typename std::common_type<A, B>::type min(A a, B b) {
    typedef typename std::common_type<A, B>::type C;
    return (C)b < (C)a ? (C)b : (C)a;
}
template <class A, class B>
inline typename std::common_type<A, B>::type max(A a, B b) {
    typedef typename std::common_type<A, B>::type C;
    return (C)a < (C)b ? (C)b : (C)a;
}

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 with d as both C and D: a
// warp-collective operation. Every lane publishes its fragments (layouts in
// kernels/tensor_core.cu, after the PTX ISA), then computes its four outputs with f32
// products summed over k in ascending order (the hardware's order of accumulation is its
// own: results may differ from a GPU's in the last bits, never in layout).
inline void tandem_emu_mma_bf16_16816(float* d, const unsigned* a, const unsigned* b) {
    unsigned lane = threadIdx.x & 31u;
    uint32_t* mine = reinterpret_cast<uint32_t*>(::tandem_emu::warp_area(lane));
    for (int i = 0; i < 4; ++i) {
        mine[i] = a[i];
        mine[6 + i] = ::tandem_emu::bit_cast<uint32_t>(d[i]);
    }
    mine[4] = b[0];
    mine[5] = b[1];
    ::tandem_emu::sync_full_warp();
    float A[16][16], B[16][8], C[16][8];
    auto lo = [](uint32_t v) { return ::tandem_emu::bit_cast<float>(v << 16); };
    auto hi = [](uint32_t v) { return ::tandem_emu::bit_cast<float>(v & 0xffff0000u); };
    for (unsigned l = 0; l < 32; ++l) {
        const uint32_t* r = reinterpret_cast<const uint32_t*>(::tandem_emu::warp_area(l));
        unsigned g = l >> 2, t = l & 3u;
        A[g][2 * t] = lo(r[0]);
        A[g][2 * t + 1] = hi(r[0]);
        A[g + 8][2 * t] = lo(r[1]);
        A[g + 8][2 * t + 1] = hi(r[1]);
        A[g][2 * t + 8] = lo(r[2]);
        A[g][2 * t + 9] = hi(r[2]);
        A[g + 8][2 * t + 8] = lo(r[3]);
        A[g + 8][2 * t + 9] = hi(r[3]);
        B[2 * t][g] = lo(r[4]);
        B[2 * t + 1][g] = hi(r[4]);
        B[2 * t + 8][g] = lo(r[5]);
        B[2 * t + 9][g] = hi(r[5]);
        C[g][2 * t] = ::tandem_emu::bit_cast<float>(r[6]);
        C[g][2 * t + 1] = ::tandem_emu::bit_cast<float>(r[7]);
        C[g + 8][2 * t] = ::tandem_emu::bit_cast<float>(r[8]);
        C[g + 8][2 * t + 1] = ::tandem_emu::bit_cast<float>(r[9]);
    }
    ::tandem_emu::sync_warp(); // every lane has read before any publishes again
    unsigned g = lane >> 2, t = lane & 3u;
    for (int i = 0; i < 4; ++i) {
        unsigned row = g + ((i & 2) ? 8u : 0u);
        unsigned col = 2 * t + (unsigned)(i & 1);
        float acc = 0.0f;
        for (int k = 0; k < 16; ++k) {
            acc += A[row][k] * B[k][col];
        }
        d[i] = C[row][col] + acc;
    }
}

// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16 (kernels/tensor_core.cu): a
// warp-collective load. Every lane publishes the address of its row (lane l: row l % 8 of
// matrix l / 8, 16 bytes, 16-byte aligned or the instruction faults), then register i of
// lane 4 g + t receives matrix i's elements (g, 2t) and (g, 2t + 1), or with `trans` its
// elements (2t, g) and (2t + 1, g), the first in the lower 16 bits.
inline void tandem_emu_ldmatrix_x4(unsigned* r, const void* row, bool trans) {
    if ((uintptr_t)row % 16 != 0) {
        __builtin_trap();
    }
    unsigned lane = threadIdx.x & 31u;
    ::tandem_emu::warp_area(lane)[0] = (uint64_t)(uintptr_t)row;
    ::tandem_emu::sync_full_warp();
    auto element = [](unsigned matrix, unsigned i, unsigned j) {
        uint64_t at = ::tandem_emu::warp_area(8 * matrix + i)[0];
        return (unsigned)reinterpret_cast<const uint16_t*>((uintptr_t)at)[j];
    };
    unsigned g = lane >> 2, t = lane & 3u;
    for (unsigned i = 0; i < 4; ++i) {
        unsigned lo = trans ? element(i, 2 * t, g) : element(i, g, 2 * t);
        unsigned hi = trans ? element(i, 2 * t + 1, g) : element(i, g, 2 * t + 1);
        r[i] = lo | (hi << 16);
    }
    ::tandem_emu::sync_warp(); // every lane has read before any publishes again
}
