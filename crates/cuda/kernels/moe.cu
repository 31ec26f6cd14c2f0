// The mixture-of-experts MLP (Mixtral, Qwen3-MoE), as the CPU computes it
// (tandem_model::transformer::moe): the router's scores of every expert, a softmax, the k
// heaviest experts (ties to the lower index), their weights divided by their sum where the
// model says so; then each (token, chosen expert) pair, a "route", runs that expert's gated
// MLP on the token's normed row; each token adds its routes' outputs times their weights in
// ascending expert order.
//
// The experts' products (expert_matvec) run over the routes grouped by expert (moe_group):
// a warp computes one output of an expert for up to EXPERT_ROUTES of its routes at once,
// each route's sum in the same fixed order wherever it falls, so a route's result depends
// only on its own row and expert, never on the batch. A decode step reads each chosen
// expert once per EXPERT_ROUTES routes that chose it. In bf16 the dense experts' products
// run on tensor cores instead (expert_gemm, moe_gemm.cu); expert_matvec serves f32 and
// the quantized formats.

// scores: [n, num_experts] f32; experts: [n, k] i32 and weights: [n, k] f32, in ascending
// expert order (the order moe_combine adds them in). The rows from *live_rows on pad a
// decode graph's batch: they take no route (expert -1, weight 0), so that they add no
// expert's weights to the step's reads. Grid: n blocks of 32 threads; the first thread
// routes the block's token (k is small: 2 to 10 in released models).
extern "C" __global__ void moe_route(const float* scores, const int* live_rows, int* experts,
                                     float* weights, int num_experts, int k, int normalize) {
    if (threadIdx.x != 0) {
        return;
    }
    const float* s = scores + (i64)blockIdx.x * num_experts;
    int* ex = experts + (i64)blockIdx.x * k;
    float* w = weights + (i64)blockIdx.x * k;
    if ((int)blockIdx.x >= *live_rows) {
        for (int j = 0; j < k; ++j) {
            ex[j] = -1;
            w[j] = 0.0f;
        }
        return;
    }
    float max = NEG_INF;
    for (int e = 0; e < num_experts; ++e) {
        max = fmaxf(max, s[e]);
    }
    float sum = 0.0f;
    for (int e = 0; e < num_experts; ++e) {
        sum += expf(s[e] - max);
    }
    for (int j = 0; j < k; ++j) {
        ex[j] = -1;
        w[j] = NEG_INF;
    }
    // Insertion into the k best so far; a NaN weight ranks last but still fills an empty
    // slot.
    for (int e = 0; e < num_experts; ++e) {
        float weight = expf(s[e] - max) / sum;
        float rank = weight != weight ? NEG_INF : weight;
        int pos = 0;
        while (pos < k && !(rank > w[pos] || ex[pos] < 0)) {
            ++pos;
        }
        if (pos == k) {
            continue;
        }
        for (int j = k - 1; j > pos; --j) {
            ex[j] = ex[j - 1];
            w[j] = w[j - 1];
        }
        ex[pos] = e;
        w[pos] = weight;
    }
    if (normalize) {
        float total = 0.0f;
        for (int j = 0; j < k; ++j) {
            total += w[j];
        }
        for (int j = 0; j < k; ++j) {
            w[j] /= total;
        }
    }
    // From heaviest first (as chosen and normalised) to ascending expert order.
    for (int j = 1; j < k; ++j) {
        int e = ex[j];
        float weight = w[j];
        int i = j;
        for (; i > 0 && ex[i - 1] > e; --i) {
            ex[i] = ex[i - 1];
            w[i] = w[i - 1];
        }
        ex[i] = e;
        w[i] = weight;
    }
}

// Groups a step's routes by expert (a padding row's, expert -1, in none): offsets[e] ..
// offsets[e + 1] index into `order` the routes that chose expert e (in no particular order: a route's result never depends on
// the routes it is computed beside), and tile_offsets[e] .. tile_offsets[e + 1] number
// expert e's tiles of `tile_routes` routes (expert_gemm's, moe_gemm.cu). experts: [routes]
// i32; counts: [num_experts] i32, scratch; offsets, tile_offsets: [num_experts + 1] i32;
// order: [routes] i32. One block.
extern "C" __global__ void moe_group(const int* experts, int routes, int num_experts,
                                     int tile_routes, int* counts, int* offsets,
                                     int* tile_offsets, int* order) {
    for (int e = threadIdx.x; e < num_experts; e += blockDim.x) {
        counts[e] = 0;
    }
    __syncthreads();
    for (int r = threadIdx.x; r < routes; r += blockDim.x) {
        if (experts[r] >= 0) {
            atomicAdd(&counts[experts[r]], 1);
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int total = 0;
        int tiles = 0;
        for (int e = 0; e < num_experts; ++e) {
            offsets[e] = total;
            tile_offsets[e] = tiles;
            total += counts[e];
            tiles += (counts[e] + tile_routes - 1) / tile_routes;
            counts[e] = offsets[e]; // the next free place of expert e
        }
        offsets[num_experts] = total;
        tile_offsets[num_experts] = tiles;
    }
    __syncthreads();
    for (int r = threadIdx.x; r < routes; r += blockDim.x) {
        if (experts[r] >= 0) {
            order[atomicAdd(&counts[experts[r]], 1)] = r;
        }
    }
}

#define EXPERT_ROUTES 8 // routes a warp multiplies by each weight it loads

// The experts' matrices, stacked ([num_experts * m, width]), in each format the layers may
// have. `accumulate` adds row `row`'s products with the `count` x rows at `xrow` into `acc`,
// lane `lane` taking its share of the row in a fixed order, each weight loaded once.
struct DenseExperts { // the storage type: lane l takes elements l, l + 32, ...
    const act_t* w;
    __device__ __forceinline__ void accumulate(i64 row, int width, int lane, const act_t* x,
                                               const i64* xrow, int count, float* acc) const {
        i64 wrow = row * width;
        for (int i = lane; i < width; i += 32) {
            float wv = load_act(w, wrow + i);
#pragma unroll
            for (int g = 0; g < EXPERT_ROUTES; ++g) {
                if (g < count) {
                    acc[g] += load_act(x, xrow[g] + i) * wv;
                }
            }
        }
    }
};

struct Q8Experts { // Q8_0 (q8.cu): lane l takes blocks l, l + 32, ... of 32 codes
    const unsigned char* q; // [rows, width] int8
    const float* scales;    // [rows, width / 32]
    __device__ __forceinline__ void accumulate(i64 row, int width, int lane, const act_t* x,
                                               const i64* xrow, int count, float* acc) const {
        int blocks = width / Q8_BLOCK;
        const unsigned char* codes = q + row * width;
        for (int b = lane; b < blocks; b += 32) {
            const uint4* p = reinterpret_cast<const uint4*>(codes + b * Q8_BLOCK);
            uint4 lo = p[0];
            uint4 hi = p[1];
            u32 words[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
            float d = scales[row * blocks + b];
#pragma unroll
            for (int g = 0; g < EXPERT_ROUTES; ++g) {
                if (g < count) {
                    acc[g] += d * q8_block_dot(words, x, xrow[g] + b * Q8_BLOCK);
                }
            }
        }
    }
};

struct Q4Experts { // Q4_1 (q4.cu): lane l takes blocks l, l + 32, ... of 16 code bytes
    const unsigned char* q; // [rows, width / 32] blocks of 16 bytes
    const u32* scales;      // [rows, width / 32]: f16 d and mn
    __device__ __forceinline__ void accumulate(i64 row, int width, int lane, const act_t* x,
                                               const i64* xrow, int count, float* acc) const {
        int blocks = width / Q4_BLOCK;
        const uint4* codes = reinterpret_cast<const uint4*>(q + row * (width / 2));
        for (int b = lane; b < blocks; b += 32) {
            uint4 c = codes[b];
            u32 words[4] = {c.x, c.y, c.z, c.w};
            u32 dm = scales[row * blocks + b];
            float d = f16_to_f32(dm & 0xffffu);
            float mn = f16_to_f32(dm >> 16);
#pragma unroll
            for (int g = 0; g < EXPERT_ROUTES; ++g) {
                if (g < count) {
                    acc[g] += q4_block_dot(words, d, mn, x, xrow[g] + b * Q4_BLOCK);
                }
            }
        }
    }
};

// y[r, j] = x[r / per_token] · W[e][j] for every route r of every expert e (the routes
// order[offsets[e] .. offsets[e + 1]], from moe_group) and output j < m: x: [rows /
// per_token, width] act_t (per_token = k: the tokens' normed rows, shared by their routes;
// 1: one row per route); W: the experts' matrices in format F; y: [routes, m] f32.
// Grid: (num_experts, ceil(m / 8)); block: 256 threads, warp w computing output
// j = 8 y + w of the block's expert for its routes, EXPERT_ROUTES at a time: each weight is
// loaded once for the group's routes, then each route's lane sums are added in a fixed
// tree. A route's result is the same arithmetic whatever group it falls in, so it never
// depends on the rest of the batch; a weight is read once per EXPERT_ROUTES routes that
// chose its expert, not once per route.
template <class F>
__device__ __forceinline__ void expert_products(F weights, const act_t* x, const int* order,
                                                const int* offsets, float* y, int per_token,
                                                int m, int width) {
    int lane = threadIdx.x & 31;
    int j = blockIdx.y * (blockDim.x >> 5) + (threadIdx.x >> 5);
    int e = blockIdx.x;
    int begin = offsets[e];
    int end = offsets[e + 1];
    if (j >= m || begin == end) {
        return; // a whole warp: no warp-level operation follows for it
    }
    i64 row = (i64)e * m + j;
    for (int first = begin; first < end; first += EXPERT_ROUTES) {
        int count = min(EXPERT_ROUTES, end - first); // the same over the warp
        i64 xrow[EXPERT_ROUTES];
        float acc[EXPERT_ROUTES];
#pragma unroll
        for (int g = 0; g < EXPERT_ROUTES; ++g) {
            acc[g] = 0.0f;
            xrow[g] = g < count ? (i64)(order[first + g] / per_token) * width : 0;
        }
        weights.accumulate(row, width, lane, x, xrow, count, acc);
#pragma unroll
        for (int g = 0; g < EXPERT_ROUTES; ++g) {
            if (g < count) { // uniform over the warp
                float sum = warp_sum(acc[g]);
                if (lane == 0) {
                    y[(i64)order[first + g] * m + j] = sum;
                }
            }
        }
    }
}

// The experts' products in the storage type: W [num_experts * m, width] act_t.
extern "C" __global__ void expert_matvec(const act_t* x, const act_t* w, const int* order,
                                         const int* offsets, float* y, int per_token, int m,
                                         int width) {
    expert_products(DenseExperts{w}, x, order, offsets, y, per_token, m, width);
}

// The experts' products from Q8_0 codes (`--cuda-weights q8_0`).
extern "C" __global__ void expert_matvec_q8(const act_t* x, const unsigned char* q,
                                            const float* scales, const int* order,
                                            const int* offsets, float* y, int per_token, int m,
                                            int width) {
    expert_products(Q8Experts{q, scales}, x, order, offsets, y, per_token, m, width);
}

// The experts' products from Q4_1 codes (`--cuda-weights q4_1`).
extern "C" __global__ void expert_matvec_q4(const act_t* x, const unsigned char* q,
                                            const u32* scales, const int* order,
                                            const int* offsets, float* y, int per_token, int m,
                                            int width) {
    expert_products(Q4Experts{q, scales}, x, order, offsets, y, per_token, m, width);
}

// out[t] = sum over token t's k routes, in ascending expert order (moe_route's), of
// weight * y[route]: y: [n * k, width] f32 (route t * k + j); experts, weights: [n, k];
// out: [n, width] f32. A padding row's routes (expert -1) were never computed: its sum is
// 0. Grid: n blocks; threads stride the row.
extern "C" __global__ void moe_combine(const float* y, const int* experts,
                                       const float* weights, float* out, int k, int width) {
    i64 t = blockIdx.x;
    const float* w = weights + t * k;
    const int* ex = experts + t * k;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < k; ++j) {
            if (ex[j] >= 0) {
                acc += w[j] * y[(t * k + j) * (i64)width + i];
            }
        }
        out[t * width + i] = acc;
    }
}
