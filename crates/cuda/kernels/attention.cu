// Paged causal attention with grouped-query heads over variable-length sequences.
//
// Grid: (n tokens, num_heads); block: ATTN_WARPS warps. One block computes one query row of
// one head: the token at position p of its sequence attends to positions 0..=p of that
// sequence, whose keys and values it reads through the sequence's block table (the new
// tokens' K/V were stored by qkv_rope_store before this kernel runs). Warp w takes positions
// w, w + ATTN_WARPS, ...; within a warp, lane l holds dimensions l, l + 32, ... of the head
// (head_dim is a multiple of 32, at most 32 * ATTN_MAX_PER_LANE). Each warp keeps an online
// softmax (running max, running sum, weighted value sum) in f32; the warps' partial results
// are merged at the end.

#define ATTN_WARPS 4
#define ATTN_MAX_PER_LANE 8

struct AttnShape {
    int num_heads;
    int num_kv_heads;
    int head_dim;
    int block_size;
    int max_blocks; // row length of block_tables
    float scale;    // 1 / sqrt(head_dim)
};

// q: [n, num_heads * head_dim] f32; k_cache, v_cache: [num_slots, kv_dim] act_t;
// block_tables: [num_seqs, max_blocks]; token_seq: [n] sequence of each token;
// positions: [n] position of each token; out: [n, num_heads * head_dim] act_t.
extern "C" __global__ void paged_attention(const float* q, const act_t* k_cache,
                                           const act_t* v_cache, const int* block_tables,
                                           const int* token_seq, const int* positions,
                                           act_t* out, AttnShape s) {
    __shared__ float part_max[ATTN_WARPS];
    __shared__ float part_sum[ATTN_WARPS];
    __shared__ float part_acc[ATTN_WARPS][32 * ATTN_MAX_PER_LANE];
    int d = s.head_dim;
    int per_lane = d / 32;
    int lane = threadIdx.x & 31;
    int warp = threadIdx.x >> 5;
    i64 token = blockIdx.x;
    int h = blockIdx.y;
    int kv_dim = s.num_kv_heads * d;
    int kv_col = (h / (s.num_heads / s.num_kv_heads)) * d;
    const int* table = block_tables + (i64)token_seq[token] * s.max_blocks;
    int context = positions[token] + 1;

    float qr[ATTN_MAX_PER_LANE];
    float acc[ATTN_MAX_PER_LANE];
    const float* qrow = q + token * (i64)(s.num_heads * d) + h * d;
    for (int i = 0; i < ATTN_MAX_PER_LANE; ++i) {
        qr[i] = i < per_lane ? qrow[lane + 32 * i] : 0.0f;
        acc[i] = 0.0f;
    }
    float run_max = NEG_INF;
    float run_sum = 0.0f;
    for (int p = warp; p < context; p += ATTN_WARPS) {
        i64 slot = (i64)table[p / s.block_size] * s.block_size + p % s.block_size;
        i64 base = slot * kv_dim + kv_col;
        float dot = 0.0f;
        for (int i = 0; i < per_lane; ++i) {
            dot += qr[i] * load_act(k_cache, base + lane + 32 * i);
        }
        float score = warp_sum(dot) * s.scale;
        float new_max = fmaxf(run_max, score);
        float correction = expf(run_max - new_max);
        float weight = expf(score - new_max);
        run_sum = run_sum * correction + weight;
        for (int i = 0; i < per_lane; ++i) {
            acc[i] = acc[i] * correction + weight * load_act(v_cache, base + lane + 32 * i);
        }
        run_max = new_max;
    }
    if (lane == 0) {
        part_max[warp] = run_max;
        part_sum[warp] = run_sum;
    }
    for (int i = 0; i < per_lane; ++i) {
        part_acc[warp][lane + 32 * i] = acc[i];
    }
    __syncthreads();
    // Merge: every thread takes dimensions threadIdx.x, + blockDim.x, ... of the head.
    float total_max = NEG_INF;
    for (int w = 0; w < ATTN_WARPS; ++w) {
        total_max = fmaxf(total_max, part_max[w]);
    }
    float total_sum = 0.0f;
    for (int w = 0; w < ATTN_WARPS; ++w) {
        // A warp that saw no position has max -inf and weight exp(-inf) = 0.
        total_sum += part_sum[w] * expf(part_max[w] - total_max);
    }
    i64 dst = token * (i64)(s.num_heads * d) + h * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float v = 0.0f;
        for (int w = 0; w < ATTN_WARPS; ++w) {
            v += part_acc[w][i] * expf(part_max[w] - total_max);
        }
        store_act(out, dst + i, v / total_sum);
    }
}
