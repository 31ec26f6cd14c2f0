// The per-head post-processing of the fused q/k/v projection, fused with the KV write:
// bias add (Qwen2), per-head RMSNorm of q and k (Qwen3), RoPE of q and k, and the store of
// k and v into the paged cache at each token's slot.
//
// Grid: (n tokens, num_heads + 2 * num_kv_heads heads); block: head_dim rounded up to a
// multiple of 32 threads. Head index h < num_heads is a query head, then key heads, then
// value heads, in the order of a qkv row: [q (num_heads * d) | k (kv_dim) | v (kv_dim)].

struct QkvShape {
    int num_heads;
    int num_kv_heads;
    int head_dim;
    int neox;      // 1: dimension i pairs with i + d/2; 0: 2i pairs with 2i + 1
    int has_bias;  // bias: [qkv_dim]
    int has_qk_norm; // qk_norm: [2, head_dim] (q weights, then k weights)
    float eps;
};

// qkv: [n, qkv_dim] f32 (the projection output); bias: [qkv_dim] or null;
// qk_norm: [2, head_dim] or null; cos, sin: [n, head_dim / 2] (each token's angles);
// slots: [n] slot of each token; q_out: [n, num_heads * head_dim] f32;
// k_cache, v_cache: [num_slots, kv_dim] act_t (this layer's planes).
extern "C" __global__ void qkv_rope_store(const float* qkv, const float* bias,
                                          const float* qk_norm, const float* cos_table,
                                          const float* sin_table, const i64* slots,
                                          float* q_out, act_t* k_cache, act_t* v_cache,
                                          QkvShape s) {
    __shared__ float head[1024];
    __shared__ float scratch[32];
    int d = s.head_dim;
    int half = d / 2;
    int q_dim = s.num_heads * d;
    int kv_dim = s.num_kv_heads * d;
    i64 token = blockIdx.x;
    int h = blockIdx.y;
    int j = threadIdx.x;
    // Offset of this head within a qkv row.
    int col = h * d;
    i64 src = token * (q_dim + 2 * kv_dim) + col;
    float v = 0.0f;
    if (j < d) {
        v = qkv[src + j];
        if (s.has_bias) {
            v += bias[col + j];
        }
    }
    bool is_q = h < s.num_heads;
    bool is_k = !is_q && h < s.num_heads + s.num_kv_heads;
    if (!is_q && !is_k) { // a value head: store and done
        if (j < d) {
            store_act(v_cache, slots[token] * kv_dim + (col - q_dim - kv_dim) + j, v);
        }
        return;
    }
    if (s.has_qk_norm) { // uniform over the block: every thread takes part in the sum
        float scale = 1.0f / sqrtf(block_sum(v * v, scratch) / (float)d + s.eps);
        if (j < d) {
            v = v * scale * qk_norm[(is_q ? 0 : d) + j];
        }
    }
    if (j < d) {
        head[j] = v;
    }
    __syncthreads();
    if (j >= half) {
        return;
    }
    int a = s.neox ? j : 2 * j;
    int b = s.neox ? j + half : 2 * j + 1;
    float c = cos_table[token * half + j];
    float sn = sin_table[token * half + j];
    float x0 = head[a];
    float x1 = head[b];
    float r0 = x0 * c - x1 * sn;
    float r1 = x0 * sn + x1 * c;
    if (is_q) {
        i64 dst = token * q_dim + col;
        q_out[dst + a] = r0;
        q_out[dst + b] = r1;
    } else {
        i64 dst = slots[token] * kv_dim + (col - q_dim);
        store_act(k_cache, dst + a, r0);
        store_act(k_cache, dst + b, r1);
    }
}
