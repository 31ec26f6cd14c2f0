// Paged causal attention with grouped-query heads over variable-length sequences, with the
// context split into fixed partitions (flash-decoding) and staged through shared memory.
//
// Grid: (tiles, num_kv_heads, num_parts); block: tile_tokens * group warps. A tile is up to
// `tile_tokens` consecutive tokens of one sequence (consecutive positions): the `tiles`
// array holds (first token, token count) pairs, or is null, when every tile is one token
// (tile i = token i; decode steps). Warp w = t * group + g of block (tile, kvh, j) computes,
// for query head kvh * group + g of the tile's token t, the attention over positions
// [j * P, min((j + 1) * P, context)) of its sequence, where context = position + 1 and
// P = ATTN_PARTITION. Blocks whose partition starts past the tile's longest context exit at
// once, so a launch may name more partitions than its longest context needs (a captured
// CUDA graph sizes them for the longest context it may ever see).
//
// The block walks its partition ATTN_CHUNK positions at a time. All its threads copy a
// chunk's key and value rows (one kv head) into shared memory together, 16 bytes per copy,
// asynchronously (cp.async) and one chunk ahead of the arithmetic, so that the loads of a
// chunk are in flight at once instead of one row after another, and the rows serve every
// query head of the group and every token of the tile. Then each warp takes the chunk:
// lane l computes the score of position base + l (a dot product over the head dimension
// with the query, kept in shared memory), the warp updates its online softmax (running max
// and sum) and its weighted sum of values, lane l holding dimensions l, l + 32, ...
//
// A token whose context fits in one partition writes its output directly. Otherwise each
// partition writes (value sum, max, sum) to `partials` and attention_merge combines them in
// partition order. A token's result depends only on its own query and context, never on
// the batch, the tile it shares or the launch shape: every warp does the same arithmetic
// on the same values in the same order, wherever its token sits.

// TANDEM_ATTN_PARTITION is set by the Rust side (kernels.rs), which sizes the launches.
#define ATTN_PARTITION TANDEM_ATTN_PARTITION
#define ATTN_CHUNK 32       // positions staged at a time: one per lane
#define ATTN_MAX_PER_LANE 8 // head_dim <= 32 * ATTN_MAX_PER_LANE

struct AttnShape {
    int num_heads;
    int num_kv_heads;
    int head_dim;
    int block_size;
    int max_blocks;  // row length of block_tables
    float scale;     // 1 / sqrt(head_dim)
    int num_parts;   // partitions per (token, head) in `partials` (grid z)
    int tile_tokens; // tokens per tile: the block has tile_tokens * group warps
};

__device__ __forceinline__ float warp_max(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    }
    return v;
}

// Dot product of one key row (`d` elements of act_t, 16-byte aligned) with `q` (shared).
__device__ __forceinline__ float dot_key(const act_t* key, const float* q, int d) {
    float acc = 0.0f;
#if TANDEM_ACT_BF16
    const uint4* k8 = reinterpret_cast<const uint4*>(key);
    for (int i = 0; i < d / 8; ++i) {
        uint4 w = k8[i];
        const float* qi = q + 8 * i;
        acc += qi[0] * __uint_as_float(w.x << 16);
        acc += qi[1] * __uint_as_float(w.x & 0xffff0000u);
        acc += qi[2] * __uint_as_float(w.y << 16);
        acc += qi[3] * __uint_as_float(w.y & 0xffff0000u);
        acc += qi[4] * __uint_as_float(w.z << 16);
        acc += qi[5] * __uint_as_float(w.z & 0xffff0000u);
        acc += qi[6] * __uint_as_float(w.w << 16);
        acc += qi[7] * __uint_as_float(w.w & 0xffff0000u);
    }
#else
    const float4* k4 = reinterpret_cast<const float4*>(key);
    for (int i = 0; i < d / 4; ++i) {
        float4 w = k4[i];
        const float* qi = q + 4 * i;
        acc += qi[0] * w.x;
        acc += qi[1] * w.y;
        acc += qi[2] * w.z;
        acc += qi[3] * w.w;
    }
#endif
    return acc;
}

// Bytes of one staged key or value row: padded by 16 so that the lanes of a quarter warp,
// each reading 16 bytes of its own row at the same offset, fall on distinct banks.
__device__ __forceinline__ int staged_row_bytes(int d) {
    return d * (int)sizeof(act_t) + 16;
}

// Copies 16 bytes from global to shared memory; asynchronously where the device can
// (sm_80 and later: cp.async, completed by copies_wait).
__device__ __forceinline__ void copy16_to_shared(unsigned char* dst, const unsigned char* src) {
#if __CUDA_ARCH__ >= 800
    unsigned addr = (unsigned)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(addr), "l"(src) : "memory");
#else
    *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
#endif
}

// Closes the group of copies issued since the last call.
__device__ __forceinline__ void copies_commit() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

// Waits until at most `pending` (0 or 1) committed groups of this thread's copies are
// still in flight.
__device__ __forceinline__ void copies_wait(int pending) {
#if __CUDA_ARCH__ >= 800
    if (pending == 0) {
        asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    } else {
        asm volatile("cp.async.wait_group 1;\n" ::: "memory");
    }
#endif
}

// Issues the copies of the key and value rows of positions [base, min(base + ATTN_CHUNK,
// end)) into `stage` (keys: ATTN_CHUNK rows of `row_bytes`, then values alike). Every thread
// of the block takes 16-byte pieces, consecutive threads consecutive pieces of a row.
__device__ __forceinline__ void stage_chunk(unsigned char* stage, const act_t* keys,
                                            const act_t* values, const int* table, int base,
                                            int end, int kv_dim, int d, int block_size,
                                            int row_bytes) {
    int pieces = d * (int)sizeof(act_t) / 16; // per row
    int rows = min(ATTN_CHUNK, end - base);
    int per_plane = rows * pieces;
    for (int u = threadIdx.x; u < 2 * per_plane; u += blockDim.x) {
        int plane = u >= per_plane; // 0: keys, 1: values
        int rest = u - plane * per_plane;
        int r = rest / pieces;
        int c = rest - r * pieces;
        int p = base + r;
        i64 slot = (i64)table[p / block_size] * block_size + p % block_size;
        const act_t* row = (plane ? values : keys) + slot * kv_dim;
        unsigned char* dst = stage + (plane * ATTN_CHUNK + r) * row_bytes + c * 16;
        copy16_to_shared(dst, reinterpret_cast<const unsigned char*>(row) + c * 16);
    }
}

// q: [n, num_heads * head_dim] f32; k_cache, v_cache: [num_slots, kv_dim] act_t;
// block_tables: [num_seqs, max_blocks]; token_seq: [n] sequence of each token;
// positions: [n] position of each token; tiles: [tiles, 2] (first token, count) or null;
// out: [n, num_heads * head_dim] act_t;
// partials: [n, num_heads, num_parts, head_dim + 2] f32 (value sum, max, sum).
// Dynamic shared memory: attention_shared_bytes() in kernels.rs — a query row of f32 per
// warp, then two stages of ATTN_CHUNK key rows and ATTN_CHUNK value rows.
extern "C" __global__ void paged_attention(const float* q, const act_t* k_cache,
                                           const act_t* v_cache, const int* block_tables,
                                           const int* token_seq, const int* positions,
                                           const int* tiles, act_t* out, float* partials,
                                           AttnShape s) {
    extern __shared__ __align__(16) unsigned char attn_shared[];
    int d = s.head_dim;
    int per_lane = d / 32;
    int group = s.num_heads / s.num_kv_heads;
    int lane = threadIdx.x & 31;
    int warp = threadIdx.x >> 5;
    int g = warp % group;
    int t = warp / group;
    int kvh = blockIdx.y;
    int part = blockIdx.z;
    i64 first = tiles ? tiles[2 * blockIdx.x] : blockIdx.x;
    int count = tiles ? tiles[2 * blockIdx.x + 1] : 1;
    // The tile's tokens are consecutive positions of one sequence: the last has the
    // longest context, and the block stages the positions it needs.
    int start = part * ATTN_PARTITION;
    int block_end = min(positions[first + count - 1] + 1, start + ATTN_PARTITION);
    if (start >= block_end) {
        return; // the whole block, before any barrier
    }
    bool active = t < count;
    i64 token = first + (active ? t : 0);
    int context = positions[token] + 1;
    int end = min(context, start + ATTN_PARTITION);
    bool works = active && start < end; // this warp has positions [start, end)
    int h = kvh * group + g;
    int kv_dim = s.num_kv_heads * d;
    const act_t* keys = k_cache + kvh * d;
    const act_t* values = v_cache + kvh * d;
    const int* table = block_tables + (i64)token_seq[first] * s.max_blocks;
    int row_bytes = staged_row_bytes(d);
    int stage_bytes = 2 * ATTN_CHUNK * row_bytes;
    float* qs = reinterpret_cast<float*>(attn_shared) + warp * d;
    unsigned char* stages = attn_shared + (blockDim.x >> 5) * d * sizeof(float);
    if (works) {
        const float* qrow = q + token * (i64)(s.num_heads * d) + h * d;
        for (int i = lane; i < d; i += 32) {
            qs[i] = qrow[i];
        }
    }

    float acc[ATTN_MAX_PER_LANE];
#pragma unroll
    for (int i = 0; i < ATTN_MAX_PER_LANE; ++i) {
        acc[i] = 0.0f;
    }
    float run_max = NEG_INF;
    float run_sum = 0.0f;
    int chunks = (block_end - start + ATTN_CHUNK - 1) / ATTN_CHUNK;
    stage_chunk(stages, keys, values, table, start, block_end, kv_dim, d, s.block_size,
                row_bytes);
    copies_commit();
    for (int c = 0; c < chunks; ++c) {
        int base = start + c * ATTN_CHUNK;
        if (c + 1 < chunks) { // the next chunk's copies go out before this one's arithmetic
            stage_chunk(stages + ((c + 1) & 1) * stage_bytes, keys, values, table,
                        base + ATTN_CHUNK, block_end, kv_dim, d, s.block_size, row_bytes);
            copies_commit();
            copies_wait(1);
        } else {
            copies_wait(0);
        }
        __syncthreads(); // chunk c is in shared memory (and every query row is stored)
        if (works && base < end) {
            const unsigned char* staged_keys = stages + (c & 1) * stage_bytes;
            const unsigned char* staged_values = staged_keys + ATTN_CHUNK * row_bytes;
            int p = base + lane;
            float score = NEG_INF;
            if (p < end) {
                const act_t* key = reinterpret_cast<const act_t*>(staged_keys + lane * row_bytes);
                score = dot_key(key, qs, d) * s.scale;
            }
            // At least one lane holds a position, so new_max is finite.
            float new_max = fmaxf(run_max, warp_max(score));
            float correction = expf(run_max - new_max);
            float weight = p < end ? expf(score - new_max) : 0.0f;
            run_sum = run_sum * correction + warp_sum(weight);
#pragma unroll
            for (int i = 0; i < ATTN_MAX_PER_LANE; ++i) {
                acc[i] *= correction;
            }
            int rows = min(ATTN_CHUNK, end - base);
            for (int j = 0; j < rows; ++j) {
                float wj = __shfl_sync(0xffffffffu, weight, j);
                const act_t* vrow =
                    reinterpret_cast<const act_t*>(staged_values + j * row_bytes);
#pragma unroll
                for (int i = 0; i < ATTN_MAX_PER_LANE; ++i) {
                    if (i < per_lane) {
                        acc[i] += wj * load_act(vrow, lane + 32 * i);
                    }
                }
            }
            run_max = new_max;
        }
        __syncthreads(); // every warp is done with chunk c before its stage is refilled
    }
    if (!works) {
        return;
    }

    if (context <= ATTN_PARTITION) { // the only partition: the result itself
        i64 dst = token * (i64)(s.num_heads * d) + h * d;
#pragma unroll
        for (int i = 0; i < ATTN_MAX_PER_LANE; ++i) {
            if (i < per_lane) {
                store_act(out, dst + lane + 32 * i, acc[i] / run_sum);
            }
        }
        return;
    }
    float* partial = partials + ((token * s.num_heads + h) * (i64)s.num_parts + part) * (d + 2);
#pragma unroll
    for (int i = 0; i < ATTN_MAX_PER_LANE; ++i) {
        if (i < per_lane) {
            partial[lane + 32 * i] = acc[i];
        }
    }
    if (lane == 0) {
        partial[d] = run_max;
        partial[d + 1] = run_sum;
    }
}

// Combines the partitions of every token whose context spans more than one, in partition
// order: out = sum_j acc_j * exp(m_j - M) / sum_j s_j * exp(m_j - M), M = max_j m_j.
// Grid: (n tokens, num_heads); block: head_dim rounded up to a multiple of 32 threads.
extern "C" __global__ void attention_merge(const float* partials, const int* positions,
                                           act_t* out, AttnShape s) {
    i64 token = blockIdx.x;
    int h = blockIdx.y;
    int d = s.head_dim;
    int context = positions[token] + 1;
    if (context <= ATTN_PARTITION) {
        return;
    }
    int parts = (context + ATTN_PARTITION - 1) / ATTN_PARTITION;
    const float* base = partials + (token * s.num_heads + h) * (i64)s.num_parts * (d + 2);
    float total_max = NEG_INF;
    for (int j = 0; j < parts; ++j) {
        total_max = fmaxf(total_max, base[j * (d + 2) + d]);
    }
    float total_sum = 0.0f;
    for (int j = 0; j < parts; ++j) {
        const float* pj = base + j * (d + 2);
        total_sum += pj[d + 1] * expf(pj[d] - total_max);
    }
    i64 dst = token * (i64)(s.num_heads * d) + h * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float v = 0.0f;
        for (int j = 0; j < parts; ++j) {
            const float* pj = base + j * (d + 2);
            v += pj[i] * expf(pj[d] - total_max);
        }
        store_act(out, dst + i, v / total_sum);
    }
}
