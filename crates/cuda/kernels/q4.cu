// Weights stored as Q4_1 on the device (`--cuda-weights q4_1`): each row of a [m, k] matrix
// is cut into blocks of 32 values, each stored as 32 unsigned 4-bit codes `q`, an f16 scale
// `d` and an f16 minimum `mn`; the weight is q * d + mn (asymmetric, ggml's Q4_1: the same
// blocks the CPU's Q4_1 code quantizes and dequantizes, value for value). Layout:
//   codes  [m, k / 32] blocks of 16 bytes: byte t of a block holds the code of value t in
//          its low nibble and that of value t + 16 in its high nibble (ggml's order), so a
//          block is one aligned 16-byte load, and the 32 lanes of a warp reading consecutive
//          blocks read 512 contiguous bytes;
//   scales [m, k / 32] u32: d's f16 bits in the low half, mn's in the high half (ggml's
//          block header), one aligned 4-byte load per block.
// 0.625 bytes a weight (5 bits) instead of bf16's 2, so a decode step, which reads every
// weight once, reads less than a third.
//
// Small batches (decode) multiply straight from the codes (q4_matvec); larger ones expand
// a matrix to the storage type (q4_dequant) and run the ordinary product.

#define Q4_BLOCK 32
#define Q4_MAX_ROWS 8 // rows of x q4_matvec takes at once (Q4_MATVEC_ROWS in product_kernels.rs)

// IEEE half-precision bits to f32, exactly (no CUDA headers in this program).
__device__ __forceinline__ float f16_to_f32(u32 h) {
    u32 sign = (h & 0x8000u) << 16;
    u32 exp = (h >> 10) & 0x1fu;
    u32 mant = h & 0x3ffu;
    if (exp == 0x1fu) { // infinity or NaN
        return __uint_as_float(sign | 0x7f800000u | (mant << 13));
    }
    if (exp == 0) { // zero or subnormal: mant * 2^-24, exact in f32
        float v = (float)mant * 5.9604644775390625e-8f;
        return sign ? -v : v;
    }
    return __uint_as_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

// One block (`words`: its 16 code bytes; `d`, `mn`: its scale and minimum) against the 32
// values of x from `base`, as the CPU's Q4_1 dot computes it: d · Σ q·x + mn · Σ x, values
// t and t + 16 together.
__device__ __forceinline__ float q4_block_dot(const u32* words, float d, float mn,
                                              const act_t* x, i64 base) {
    float qx = 0.0f;
    float sx = 0.0f;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
#pragma unroll
        for (int t = 0; t < 4; ++t) {
            u32 byte = (words[w] >> (8 * t)) & 0xffu;
            float lo = load_act(x, base + 4 * w + t);
            float hi = load_act(x, base + 16 + 4 * w + t);
            qx += (float)(byte & 15u) * lo + (float)(byte >> 4) * hi;
            sx += lo + hi;
        }
    }
    return d * qx + mn * sx;
}

// y[n, m] = x[n, k] · W[m, k]ᵀ for n <= Q4_MAX_ROWS; x: act_t, y: f32.
// Grid: ceil(m / warps per block); block: 256 threads. Warp w of block b computes column
// j = b * 8 + w: lane l takes blocks l, l + 32, ... of row j: its 16 code bytes (one
// 16-byte load) and its d, mn against the same 32 values of every x row, as the CPU's Q4_1
// dot does (d · Σ q·x + mn · Σ x, values t and t + 16 together); then the lanes' sums are
// added across the warp. Every x row goes through the same operations in the same order
// whatever n is, so a row's result does not depend on the rows beside it.
extern "C" __global__ void q4_matvec(const unsigned char* q, const u32* scales, const act_t* x,
                                     float* y, int n, int m, int k) {
    int lane = threadIdx.x & 31;
    int j = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (j >= m) {
        return; // a whole warp: no warp-level operation follows for it
    }
    int blocks = k / Q4_BLOCK;
    const uint4* row = reinterpret_cast<const uint4*>(q + (i64)j * (k / 2));
    float acc[Q4_MAX_ROWS];
#pragma unroll
    for (int r = 0; r < Q4_MAX_ROWS; ++r) {
        acc[r] = 0.0f;
    }
    for (int b = lane; b < blocks; b += 32) {
        uint4 c = row[b];
        u32 words[4] = {c.x, c.y, c.z, c.w};
        u32 dm = scales[(i64)j * blocks + b];
        float d = f16_to_f32(dm & 0xffffu);
        float mn = f16_to_f32(dm >> 16);
#pragma unroll
        for (int r = 0; r < Q4_MAX_ROWS; ++r) {
            if (r < n) {
                acc[r] += q4_block_dot(words, d, mn, x, (i64)r * k + b * Q4_BLOCK);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < Q4_MAX_ROWS; ++r) {
        if (r < n) { // uniform over the warp
            float total = warp_sum(acc[r]);
            if (lane == 0) {
                y[(i64)r * m + j] = total;
            }
        }
    }
}

// out[j, i] = q[j, i] * d + mn of i's block, in the storage type, as the CPU's Q4_1
// dequantization computes it: q * d is exact in f32 (4 by 11 significant bits), so fused
// into an FMA or not, the sum is the one rounding. Grid: m rows; block: 256 threads.
extern "C" __global__ void q4_dequant(const unsigned char* q, const u32* scales, act_t* out,
                                      int k) {
    i64 j = blockIdx.x;
    int blocks = k / Q4_BLOCK;
    const unsigned char* row = q + j * (k / 2);
    for (int i = threadIdx.x; i < k; i += blockDim.x) {
        int b = i / Q4_BLOCK;
        int t = i % Q4_BLOCK;
        u32 byte = row[b * (Q4_BLOCK / 2) + (t & 15)];
        u32 code = t < 16 ? byte & 15u : byte >> 4;
        u32 dm = scales[j * blocks + b];
        float w = (float)code * f16_to_f32(dm & 0xffffu) + f16_to_f32(dm >> 16);
        store_act(out, j * k + i, w);
    }
}
