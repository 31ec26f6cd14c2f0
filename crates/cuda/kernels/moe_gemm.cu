// The experts' products on tensor cores (bf16 storage): moe.cu's expert_matvec computes a
// route's outputs on CUDA cores, which suits a decode step (a few routes per expert) but
// leaves a prefill chunk, where an expert may have hundreds of routes, far from the tensor
// cores' rate. Here a block multiplies up to GEMM_ROUTES routes of one expert (their rows
// gathered from x) with GEMM_OUTPUTS of the expert's weight rows through mma.sync, reading
// each weight once per GEMM_ROUTES routes. The weights may be dense (expert_gemm) or Q8_0
// or Q4_1 codes (expert_gemm_q8, _q4), expanded to bf16 as they are staged, value for
// value as q8_dequant and q4_dequant expand a dense layer's matrix before its product.
//
// A route's result never depends on the other routes of its tile or on which tile it is
// in: each of its outputs is the same chain of m16n8k16 products over the width, GEMM_K
// columns at a time in ascending order, whatever the tile's other rows hold (the tensor
// cores compute each element of a product from its own row and column). So a decode step
// and a prefill chunk give a token the same bits, and a batch never changes a sequence's
// result: the runner uses expert_gemm for every bf16 step, not only for long ones. (The
// quantized ones serve long steps only: a decode step multiplies from the codes with
// expert_matvec_q8/_q4, whose rounding differs, as a dense quantized layer's does.)
//
// Tiles: moe_group numbers each expert's tiles (tile_offsets: expert e's tiles are
// tile_offsets[e] .. tile_offsets[e + 1], ceil(count / GEMM_ROUTES) of them); block x of
// the grid takes tile x (blocks past the last tile return), block y outputs
// [GEMM_OUTPUTS y, GEMM_OUTPUTS (y + 1)). The four warps split the tile two by two: warp w
// takes the routes [32 (w % 2), 32 (w % 2) + 32) (two mma tiles of 16; the second only if
// it has a route) and the outputs [32 (w / 2), 32 (w / 2) + 32) (four tiles of 8), so that
// a fragment loaded from shared memory (by ldmatrix, tensor_core.cu) serves two or four
// products, and a step with a route or two per expert keeps two warps busy, not one.
// The routes' rows and the weight rows are staged GEMM_K columns at a time through shared
// memory by cp.async, GEMM_STAGES - 1 steps ahead of the arithmetic (attention.cu's
// copy16_to_shared, copies_commit, copies_wait): a decode step has a route or two per
// expert and streams the weights, so what bounds it is the bytes in flight, three steps of
// every weight row.

#define GEMM_ROUTES 64  // routes of a tile: 32 per warp
#define GEMM_OUTPUTS 64 // outputs of a block
#define GEMM_K 32       // columns staged at a time
#define GEMM_STRIDE (GEMM_K + 8) // bf16 per staged row: 16-byte aligned, conflict-free
#define GEMM_WARP_OUTPUTS 32     // outputs of a warp: four mma tiles of 8
#define GEMM_THREADS 128
#define GEMM_STAGES 4 // column steps in shared memory: three in flight while one is used

// The experts' weights in each format the layers may have, staged as bf16 in two parts:
// `fetch` starts reading the 8 values of columns [k0 + 8 piece, k0 + 8 piece + 8) of weight
// row `row` ([rows, width], the experts stacked) for 16-byte aligned shared memory at `dst`,
// and `expand` writes what it read there. A dense row is copied asynchronously by `fetch`
// alone; a quantized one's codes are loaded into registers by `fetch` and expanded by
// `expand` after the step's products, so that the loads' latency overlaps them (stores
// right after the loads would wait for them). k0 is a multiple of 32, so a quantized piece
// lies in one block.
struct DenseTiles { // the storage type: copied as is, asynchronously
    struct Codes {}; // nothing held: the copy lands in shared memory by itself
    const act_t* w;
    __device__ __forceinline__ Codes fetch(bf16_bits* dst, i64 row, int width, int k0,
                                           int piece) const {
        copy16_to_shared(reinterpret_cast<unsigned char*>(dst),
                         reinterpret_cast<const unsigned char*>(w + row * width + k0 + piece * 8));
        return Codes{};
    }
    __device__ __forceinline__ void expand(bf16_bits*, Codes) const {}
};

struct Q8Tiles { // Q8_0 (q8.cu): code * d, rounded to bf16
    struct Codes {
        uint2 c;
        float d;
    };
    const unsigned char* q; // [rows, width] int8
    const float* scales;    // [rows, width / 32]
    __device__ __forceinline__ Codes fetch(bf16_bits*, i64 row, int width, int k0,
                                           int piece) const {
        Codes r;
        r.c = *reinterpret_cast<const uint2*>(q + row * width + k0 + piece * 8);
        r.d = scales[row * (width / Q8_BLOCK) + k0 / Q8_BLOCK];
        return r;
    }
    __device__ __forceinline__ void expand(bf16_bits* dst, Codes r) const {
        u32 v[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            u32 word = i < 2 ? r.c.x : r.c.y;
            int sh = 16 * (i & 1);
            float lo = (float)(int)(signed char)((word >> sh) & 0xffu) * r.d;
            float hi = (float)(int)(signed char)((word >> (sh + 8)) & 0xffu) * r.d;
            v[i] = pack_bf16(lo, hi);
        }
        *reinterpret_cast<uint4*>(dst) = make_uint4(v[0], v[1], v[2], v[3]);
    }
};

struct Q4Tiles { // Q4_1 (q4.cu): code * d + mn, rounded to bf16
    struct Codes {
        uint2 c;
        u32 dm;
        int nibble;
    };
    const unsigned char* q; // [rows, width / 32] blocks of 16 bytes
    const u32* scales;      // [rows, width / 32]: f16 d and mn
    __device__ __forceinline__ Codes fetch(bf16_bits*, i64 row, int width, int k0,
                                           int piece) const {
        // Values 8 piece .. 8 piece + 7 of the block: the low nibbles of bytes 0-7 and
        // 8-15, then the high nibbles of the same bytes.
        int b = k0 / Q4_BLOCK;
        const unsigned char* block = q + row * (width / 2) + b * (Q4_BLOCK / 2);
        Codes r;
        r.c = *reinterpret_cast<const uint2*>(block + 8 * (piece & 1));
        r.dm = scales[row * (width / Q4_BLOCK) + b];
        r.nibble = 4 * (piece >> 1);
        return r;
    }
    __device__ __forceinline__ void expand(bf16_bits* dst, Codes r) const {
        float d = f16_to_f32(r.dm & 0xffffu);
        float mn = f16_to_f32(r.dm >> 16);
        u32 v[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            u32 word = i < 2 ? r.c.x : r.c.y;
            int sh = 16 * (i & 1) + r.nibble;
            float lo = (float)((word >> sh) & 15u) * d + mn;
            float hi = (float)((word >> (sh + 8)) & 15u) * d + mn;
            v[i] = pack_bf16(lo, hi);
        }
        *reinterpret_cast<uint4*>(dst) = make_uint4(v[0], v[1], v[2], v[3]);
    }
};

// y[r, j] = x[r / per_token] · W[e][j] for every route r of every expert e and output
// j < m, as expert_matvec's (moe.cu), with W: the stacked [num_experts * m, width]
// matrix in format F and width a multiple of GEMM_K. offsets and order as moe_group
// leaves them; tile_offsets: [num_experts + 1].
template <class F>
__device__ __forceinline__ void expert_tiles(F weights, const act_t* x, const int* order,
                                             const int* offsets, const int* tile_offsets,
                                             float* y, int num_experts, int per_token, int m,
                                             int width) {
#if TANDEM_ACT_BF16
    __shared__ __align__(16) bf16_bits xs[GEMM_STAGES][GEMM_ROUTES * GEMM_STRIDE];
    __shared__ __align__(16) bf16_bits ws[GEMM_STAGES][GEMM_OUTPUTS * GEMM_STRIDE];
    __shared__ int tile_expert;
    int tile = blockIdx.x;
    int tiles = tile_offsets[num_experts];
    // The expert whose tiles hold this one: the e with tile_offsets[e] <= tile <
    // tile_offsets[e + 1], if any (none for a block past the last tile). The threads look
    // at the experts side by side: one round of loads before the weights' copies can start,
    // where a binary search would chain log2(num_experts) of them.
    for (int i = threadIdx.x; i < num_experts; i += GEMM_THREADS) {
        int from = tile_offsets[i];
        int to = tile_offsets[i + 1];
        if ((from <= tile) & (tile < to)) {
            tile_expert = i;
        }
    }
    __syncthreads();
    if (tile >= tiles) {
        return; // the whole block: no barrier follows for it
    }
    int e = tile_expert;
    int first = offsets[e] + (tile - tile_offsets[e]) * GEMM_ROUTES;
    int count = min(GEMM_ROUTES, offsets[e + 1] - first);
    int j0 = blockIdx.y * GEMM_OUTPUTS;
    int lane = threadIdx.x & 31;
    int warp = threadIdx.x >> 5;
    int g = lane >> 2;
    int t = lane & 3;

    // Each thread stages two 16-byte pieces of a route row and two of a weight row per
    // stage: rows threadIdx.x / 4 and threadIdx.x / 4 + 32, piece threadIdx.x % 4. Rows
    // past the tile's routes or the expert's outputs are zeros, written once into every
    // stage's buffers (nothing is staged there later).
    const int pieces = GEMM_K * 2 / 16;
    int piece = threadIdx.x % pieces;
    const act_t* xsrc[2];
    i64 wrow[2]; // -1: past the expert's outputs
#pragma unroll
    for (int i = 0; i < 2; ++i) {
        int r = threadIdx.x / pieces + i * (GEMM_THREADS / pieces);
        xsrc[i] = r < count ? x + (i64)(order[first + r] / per_token) * width + piece * 8 : 0;
        wrow[i] = j0 + r < m ? (i64)e * m + j0 + r : -1;
        for (int s = 0; s < GEMM_STAGES; ++s) {
            for (int c = 0; c < 8; ++c) {
                if (!xsrc[i]) {
                    xs[s][r * GEMM_STRIDE + piece * 8 + c] = 0;
                }
                if (wrow[i] < 0) {
                    ws[s][r * GEMM_STRIDE + piece * 8 + c] = 0;
                }
            }
        }
    }
    // Stages the columns [k0, k0 + GEMM_K) into stage s in two parts: `fetch` queues the
    // routes' copies (and a dense expert's) and loads quantized codes into `codes`, then
    // closes a group of copies whether or not it queued any (so that every step waits for
    // the same count); `expand` stores the values of the codes (nothing for dense ones).
    // Both write stage s only once every thread is done reading it, and the values are
    // there for every thread after the barrier of the step that reads them.
    typename F::Codes codes[2] = {};
    auto fetch = [&](int s, int k0) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            int r = threadIdx.x / pieces + i * (GEMM_THREADS / pieces);
            int at = r * GEMM_STRIDE + piece * 8;
            if (xsrc[i]) {
                copy16_to_shared(reinterpret_cast<unsigned char*>(&xs[s][at]),
                                 reinterpret_cast<const unsigned char*>(xsrc[i] + k0));
            }
            if (wrow[i] >= 0) {
                codes[i] = weights.fetch(&ws[s][at], wrow[i], width, k0, piece);
            }
        }
        copies_commit();
    };
    auto expand = [&](int s) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            int r = threadIdx.x / pieces + i * (GEMM_THREADS / pieces);
            if (wrow[i] >= 0) {
                weights.expand(&ws[s][r * GEMM_STRIDE + piece * 8], codes[i]);
            }
        }
    };

    int routes0 = (warp & 1) * 32; // the warp's first route of the tile
    int outputs0 = (warp >> 1) * GEMM_WARP_OUTPUTS; // its first output of the block's
    bool active = routes0 < count;        // uniform over the warp
    bool upper = routes0 + 16 < count;    // its second tile of 16 routes has one
    float acc[2][GEMM_WARP_OUTPUTS / 8][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
        for (int nt = 0; nt < GEMM_WARP_OUTPUTS / 8; ++nt) {
            acc[mt][nt][0] = acc[mt][nt][1] = acc[mt][nt][2] = acc[mt][nt][3] = 0.0f;
        }
    }
    int steps = width / GEMM_K;
    for (int k = 0; k < GEMM_STAGES - 1; ++k) {
        if (k < steps) {
            fetch(k, k * GEMM_K);
            expand(k);
        } else {
            copies_commit();
        }
    }
    for (int k = 0; k < steps; ++k) {
        int s = k % GEMM_STAGES;
        copies_wait(GEMM_STAGES - 2); // this thread's copies of step k have landed
        // Every thread's have; and every thread is done with step k - 1's stage, which the
        // copies queued next overwrite (and, after the products, the codes loaded next).
        __syncthreads();
        int ahead = k + GEMM_STAGES - 1;
        if (ahead < steps) {
            fetch(ahead % GEMM_STAGES, ahead * GEMM_K);
        } else {
            copies_commit();
        }
        if (active) {
#pragma unroll
            for (int kk = 0; kk < GEMM_K / 16; ++kk) {
                const bf16_bits* xt = &xs[s][routes0 * GEMM_STRIDE + kk * 16];
                const bf16_bits* wt = &ws[s][outputs0 * GEMM_STRIDE + kk * 16];
                u32 a[2][4];
                frag_a_row(a[0], xt, GEMM_STRIDE);
                if (upper) {
                    frag_a_row(a[1], xt + 16 * GEMM_STRIDE, GEMM_STRIDE);
                }
#pragma unroll
                for (int np = 0; np < GEMM_WARP_OUTPUTS / 16; ++np) {
                    u32 b[4];
                    frag_b_pair_row(b, wt + np * 16 * GEMM_STRIDE, GEMM_STRIDE);
                    mma_16816(acc[0][2 * np], a[0], b);
                    mma_16816(acc[0][2 * np + 1], a[0], b + 2);
                    if (upper) {
                        mma_16816(acc[1][2 * np], a[1], b);
                        mma_16816(acc[1][2 * np + 1], a[1], b + 2);
                    }
                }
            }
        }
        if (ahead < steps) {
            expand(ahead % GEMM_STAGES);
        }
    }
    if (!active) {
        return;
    }
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            int row = routes0 + 16 * mt + g + 8 * half;
            if (row < count) {
                float* dst = y + (i64)order[first + row] * m;
#pragma unroll
                for (int nt = 0; nt < GEMM_WARP_OUTPUTS / 8; ++nt) {
                    int j = j0 + outputs0 + nt * 8 + 2 * t;
                    if (j < m) {
                        dst[j] = acc[mt][nt][2 * half];
                    }
                    if (j + 1 < m) {
                        dst[j + 1] = acc[mt][nt][2 * half + 1];
                    }
                }
            }
        }
    }
#endif
}

// The experts' products from the storage type.
extern "C" __global__ void expert_gemm(const act_t* x, const act_t* w, const int* order,
                                       const int* offsets, const int* tile_offsets, float* y,
                                       int num_experts, int per_token, int m, int width) {
    expert_tiles(DenseTiles{w}, x, order, offsets, tile_offsets, y, num_experts, per_token, m,
                 width);
}

// The experts' products from Q8_0 codes (`--cuda-weights q8_0`).
extern "C" __global__ void expert_gemm_q8(const act_t* x, const unsigned char* q,
                                          const float* scales, const int* order,
                                          const int* offsets, const int* tile_offsets,
                                          float* y, int num_experts, int per_token, int m,
                                          int width) {
    expert_tiles(Q8Tiles{q, scales}, x, order, offsets, tile_offsets, y, num_experts,
                 per_token, m, width);
}

// The experts' products from Q4_1 codes (`--cuda-weights q4_1`).
extern "C" __global__ void expert_gemm_q4(const act_t* x, const unsigned char* q,
                                          const u32* scales, const int* order,
                                          const int* offsets, const int* tile_offsets,
                                          float* y, int num_experts, int per_token, int m,
                                          int width) {
    expert_tiles(Q4Tiles{q, scales}, x, order, offsets, tile_offsets, y, num_experts,
                 per_token, m, width);
}
