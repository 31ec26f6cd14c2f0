// Weights stored as Q8_0 on the device (`--cuda-weights q8_0`): each row of a [m, k]
// matrix is cut into blocks of 32 values, stored as 32 int8 codes `q` (`[m, k]` bytes) and
// one f32 scale `d` per block (`[m, k / 32]`); the weight is q * d. 1.125 bytes a weight
// instead of bf16's 2, so a decode step, which reads every weight once, reads less.
//
// Small batches (decode) multiply straight from the codes (q8_matvec); larger ones expand
// a matrix to the storage type (q8_dequant) and run the ordinary product.

#define Q8_BLOCK 32
#define Q8_MAX_ROWS 8 // rows of x q8_matvec takes at once (Q8_MATVEC_ROWS in kernels.rs)

// One block's 32 codes (`words`, 4 to a word, lowest byte first) against the 32 values of x
// from `base`: Σ code · x in value order, before the block's scale.
__device__ __forceinline__ float q8_block_dot(const u32* words, const act_t* x, i64 base) {
    float s = 0.0f;
#pragma unroll
    for (int w = 0; w < 8; ++w) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            int code = (int)(signed char)((words[w] >> (8 * c)) & 0xffu);
            s += (float)code * load_act(x, base + 4 * w + c);
        }
    }
    return s;
}

// y[n, m] = x[n, k] · W[m, k]ᵀ for n <= Q8_MAX_ROWS; x: act_t, y: f32.
// Grid: ceil(m / warps per block); block: 256 threads. Warp w of block b computes column
// j = b * 8 + w: lane l takes blocks l, l + 32, ... of row j, each block's 32 codes
// (32 bytes, two 16-byte loads) against the same 32 values of every x row, scaled once per
// block; then the lanes' sums are added across the warp.
extern "C" __global__ void q8_matvec(const unsigned char* q, const float* scales,
                                     const act_t* x, float* y, int n, int m, int k) {
    int lane = threadIdx.x & 31;
    int j = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (j >= m) {
        return; // a whole warp: no warp-level operation follows for it
    }
    int blocks = k / Q8_BLOCK;
    const unsigned char* row = q + (i64)j * k;
    float acc[Q8_MAX_ROWS];
#pragma unroll
    for (int r = 0; r < Q8_MAX_ROWS; ++r) {
        acc[r] = 0.0f;
    }
    for (int b = lane; b < blocks; b += 32) {
        const uint4* p = reinterpret_cast<const uint4*>(row + b * Q8_BLOCK);
        uint4 lo = p[0];
        uint4 hi = p[1];
        u32 words[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
        float d = scales[(i64)j * blocks + b];
#pragma unroll
        for (int r = 0; r < Q8_MAX_ROWS; ++r) {
            if (r < n) {
                acc[r] += d * q8_block_dot(words, x, (i64)r * k + b * Q8_BLOCK);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < Q8_MAX_ROWS; ++r) {
        if (r < n) { // uniform over the warp
            float total = warp_sum(acc[r]);
            if (lane == 0) {
                y[(i64)r * m + j] = total;
            }
        }
    }
}

// out[j, i] = q[j, i] * d[j, i / 32] in the storage type. Grid: m rows; block: 256 threads.
extern "C" __global__ void q8_dequant(const unsigned char* q, const float* scales, act_t* out,
                                      int k) {
    i64 j = blockIdx.x;
    int blocks = k / Q8_BLOCK;
    for (int i = threadIdx.x; i < k; i += blockDim.x) {
        int code = (int)(signed char)q[j * k + i];
        store_act(out, j * k + i, (float)code * scales[j * blocks + i / Q8_BLOCK]);
    }
}
