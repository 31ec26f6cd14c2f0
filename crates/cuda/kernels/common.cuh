// Shared definitions of tandem's CUDA kernels. The Rust side concatenates this file with the
// kernel files into one NVRTC program, so every kernel sees these helpers. No CUDA headers are
// included: bf16 is handled as its raw 16 bits, which keeps the program self-contained.
//
// `act_t` is the storage type of weights, GEMM inputs and the KV cache: bf16 bits when the
// program is compiled with -DTANDEM_ACT_BF16=1, f32 otherwise. All arithmetic is f32.

typedef unsigned short bf16_bits;
typedef unsigned int u32;
typedef long long i64;

// -infinity without math.h (NVRTC programs here include no headers).
#define NEG_INF __int_as_float(0xff800000)

// A block's dynamic shared memory (as many bytes as its launch gives), one declaration for
// the whole program: the attention kernels that take some lay it out each their own way.
extern __shared__ __align__(16) unsigned char attn_shared[];

#if TANDEM_ACT_BF16
typedef bf16_bits act_t;
#else
typedef float act_t;
#endif

__device__ __forceinline__ float bf16_to_f32(bf16_bits v) {
    return __uint_as_float(((u32)v) << 16);
}

// Round to nearest, ties to even; NaN stays a (quiet) NaN.
__device__ __forceinline__ bf16_bits f32_to_bf16(float f) {
    u32 u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) {
        return (bf16_bits)((u >> 16) | 0x0040u);
    }
    u32 lsb = (u >> 16) & 1u;
    return (bf16_bits)((u + 0x7fffu + lsb) >> 16);
}

__device__ __forceinline__ float load_act(const act_t* p, i64 i) {
#if TANDEM_ACT_BF16
    return bf16_to_f32(p[i]);
#else
    return p[i];
#endif
}

__device__ __forceinline__ void store_act(act_t* p, i64 i, float v) {
#if TANDEM_ACT_BF16
    p[i] = f32_to_bf16(v);
#else
    p[i] = v;
#endif
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    }
    return v;
}

// Sum of `v` over the whole block; every thread gets the result. blockDim.x must be a
// multiple of 32 (at most 1024). `scratch` holds at least 32 floats of shared memory.
__device__ float block_sum(float v, float* scratch) {
    int lane = threadIdx.x & 31;
    int warp = threadIdx.x >> 5;
    int num_warps = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads(); // scratch may still be read by a previous call
    if (lane == 0) {
        scratch[warp] = v;
    }
    __syncthreads();
    float total = lane < num_warps ? scratch[lane] : 0.0f;
    return warp_sum(total);
}
