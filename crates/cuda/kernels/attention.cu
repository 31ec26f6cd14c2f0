// Paged causal attention with grouped-query heads over variable-length sequences, with the
// context split into fixed partitions (flash-decoding).
//
// Grid: (n tokens, num_kv_heads, num_parts); block: one warp per query head of the kv
// head's group. Warp g of block (t, kvh, j) computes, for query head kvh * group + g of
// token t, the attention over positions [j * P, min((j + 1) * P, context)) of t's sequence,
// where context = position + 1 and P = ATTN_PARTITION. The warps of a block read the same
// keys and values (one kv head), so a group's reads are shared through L1. Blocks whose
// partition starts past the context exit at once, so a launch may name more partitions
// than its longest context needs (a captured CUDA graph sizes them for the longest context
// it may ever see).
//
// Within a partition a warp takes 32 positions at a time: lane l computes the score of
// position base + l (a dot product over the head dimension with the query, kept in shared
// memory), then the warp updates its online softmax (running max and sum) and its weighted
// sum of values, lane l holding dimensions l, l + 32, ... of the head.
//
// A token whose context fits in one partition writes its output directly. Otherwise each
// partition writes (value sum, max, sum) to `partials` and attention_merge combines them in
// partition order. A token's result depends only on its own query and context, never on
// the batch or the launch shape: every launch computes the same arithmetic per token.

// TANDEM_ATTN_PARTITION is set by the Rust side (kernels.rs), which sizes the launches.
#define ATTN_PARTITION TANDEM_ATTN_PARTITION
#define ATTN_MAX_PER_LANE 8 // head_dim <= 32 * ATTN_MAX_PER_LANE

struct AttnShape {
    int num_heads;
    int num_kv_heads;
    int head_dim;
    int block_size;
    int max_blocks; // row length of block_tables
    float scale;    // 1 / sqrt(head_dim)
    int num_parts;  // partitions per (token, head) in `partials` (grid z)
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

// q: [n, num_heads * head_dim] f32; k_cache, v_cache: [num_slots, kv_dim] act_t;
// block_tables: [num_seqs, max_blocks]; token_seq: [n] sequence of each token;
// positions: [n] position of each token; out: [n, num_heads * head_dim] act_t;
// partials: [n, num_heads, num_parts, head_dim + 2] f32 (value sum, max, sum).
// Dynamic shared memory: group * head_dim floats.
extern "C" __global__ void paged_attention(const float* q, const act_t* k_cache,
                                           const act_t* v_cache, const int* block_tables,
                                           const int* token_seq, const int* positions,
                                           act_t* out, float* partials, AttnShape s) {
    extern __shared__ float q_shared[];
    int d = s.head_dim;
    int per_lane = d / 32;
    int group = s.num_heads / s.num_kv_heads;
    int lane = threadIdx.x & 31;
    int g = threadIdx.x >> 5;
    i64 token = blockIdx.x;
    int kvh = blockIdx.y;
    int part = blockIdx.z;
    int h = kvh * group + g;
    int context = positions[token] + 1;
    int start = part * ATTN_PARTITION;
    if (start >= context) {
        return;
    }
    int end = min(context, start + ATTN_PARTITION);
    int kv_dim = s.num_kv_heads * d;
    const act_t* keys = k_cache + kvh * d;
    const act_t* values = v_cache + kvh * d;
    const int* table = block_tables + (i64)token_seq[token] * s.max_blocks;
    float* qs = q_shared + g * d;
    const float* qrow = q + token * (i64)(s.num_heads * d) + h * d;
    for (int i = lane; i < d; i += 32) {
        qs[i] = qrow[i];
    }
    __syncwarp();

    float acc[ATTN_MAX_PER_LANE];
#pragma unroll
    for (int i = 0; i < ATTN_MAX_PER_LANE; ++i) {
        acc[i] = 0.0f;
    }
    float run_max = NEG_INF;
    float run_sum = 0.0f;
    for (int base = start; base < end; base += 32) {
        int p = base + lane;
        float score = NEG_INF;
        i64 slot = 0;
        if (p < end) {
            slot = (i64)table[p / s.block_size] * s.block_size + p % s.block_size;
            score = dot_key(keys + slot * kv_dim, qs, d) * s.scale;
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
        int count = min(32, end - base);
        for (int j = 0; j < count; ++j) {
            float wj = __shfl_sync(0xffffffffu, weight, j);
            i64 sj = __shfl_sync(0xffffffffu, slot, j);
            const act_t* vrow = values + sj * kv_dim;
#pragma unroll
            for (int i = 0; i < ATTN_MAX_PER_LANE; ++i) {
                if (i < per_lane) {
                    acc[i] += wj * load_act(vrow, lane + 32 * i);
                }
            }
        }
        run_max = new_max;
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
