// Prefill attention on tensor cores (bf16 only; `CudaOptions::tensor_core_attention`).
//
// The tiled attention in attention.cu runs every product on CUDA cores, one position per
// lane; in a prefill of thousands of tokens that dominates the step. Here a warp holds 16
// query rows of one head and multiplies them with 64 staged key rows at a time through
// mma.sync (m16n8k16, bf16 inputs, f32 accumulation), keeps FlashAttention-2's online
// softmax in registers, and multiplies the probabilities (rounded to bf16) with the value
// rows the same way. The result differs from attention.cu's in rounding (bf16
// probabilities, the tensor cores' accumulation order), so steps that use it do not match
// decode steps bit for bit; `--batch-invariant` keeps attention.cu everywhere.
//
// Grid: (tiles, num_heads); block: TC_WARPS warps. A tile is up to TC_ROWS consecutive
// tokens of one sequence at consecutive positions (the `tiles` table as in attention.cu,
// built for TC_ROWS tokens); warp w takes the tile's tokens [16 w, 16 w + 16). The block
// walks the positions from the first token's window start (0 without a sliding window) to
// the last token's position TC_CHUNK at a time: all its threads copy the chunk's key and
// value rows of the head's kv head into shared memory (zeros outside that range), then
// each warp computes its scores, masks the positions each row does not see (after its own:
// causal; before its window), updates its running maxima and sums, and accumulates the
// values.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 with .bf16): lane = 4 g + t. A (16 x 16,
// row-major) registers: {A[g][2t], A[g][2t+1]}, {A[g+8][2t], ..}, {A[g][2t+8], ..},
// {A[g+8][2t+8], ..}; B (16 x 8, k x n): {B[2t][g], B[2t+1][g]}, {B[2t+8][g], B[2t+9][g]};
// C (16 x 8): C[g][2t], C[g][2t+1], C[g+8][2t], C[g+8][2t+1]. The lower 16 bits of a
// register hold the element of the lower index.

#define TC_WARPS 4
#define TC_ROWS (16 * TC_WARPS)
#define TC_CHUNK 64
#define TC_MAX_DIM 128
#define TC_STRIDE (TC_MAX_DIM + 8) // bf16 per staged row: 16-byte aligned, conflict-free

// d += a · b for one m16n8k16 tile.
__device__ __forceinline__ void mma_16816(float* d, const u32* a, const u32* b) {
#ifdef TANDEM_EMULATOR
    tandem_emu_mma_bf16_16816(d, a, b);
#else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// Two floats as a bf16 pair (lo: the lower index), rounded to nearest even.
__device__ __forceinline__ u32 pack_bf16(float lo, float hi) {
    return (u32)f32_to_bf16(lo) | ((u32)f32_to_bf16(hi) << 16);
}

__device__ __forceinline__ u32 pair_at(const bf16_bits* p) {
    return (u32)p[0] | ((u32)p[1] << 16);
}

// q: [n, num_heads * d] f32; k_cache, v_cache: [slots, kv_dim] bf16; out: [n, q_dim] bf16.
// The other arguments as paged_attention's (attention.cu); s.tile_tokens is TC_ROWS.
extern "C" __global__ void attention_tc(const float* q, const act_t* k_cache,
                                        const act_t* v_cache, const int* block_tables,
                                        const int* token_seq, const int* positions,
                                        const int* tiles, act_t* out, AttnShape s) {
#if TANDEM_ACT_BF16
    __shared__ __align__(16) bf16_bits ks[TC_CHUNK * TC_STRIDE];
    __shared__ __align__(16) bf16_bits vs[TC_CHUNK * TC_STRIDE];
    int d = s.head_dim;
    int lane = threadIdx.x & 31;
    int warp = threadIdx.x >> 5;
    int g = lane >> 2;
    int t = lane & 3;
    int h = blockIdx.y;
    int kvh = h / (s.num_heads / s.num_kv_heads);
    i64 first = tiles[2 * blockIdx.x];
    int count = tiles[2 * blockIdx.x + 1];
    int p0 = positions[first];
    int last = p0 + count - 1; // the tile's last position
    // The chunk holding the first position any token sees: chunks start at multiples of
    // TC_CHUNK wherever the window starts, so that a token meets the same chunks in any tile.
    int lowest = window_start(p0, s.window) / TC_CHUNK * TC_CHUNK;
    const int* table = block_tables + (i64)token_seq[first] * s.max_blocks;
    int q_dim = s.num_heads * d;
    int kv_dim = s.num_kv_heads * d;
    int ksteps = d / 16;
    int dtiles = d / 8;
    int row0 = warp * 16; // the warp's first row in the tile
    bool active = row0 < count;

    // The warp's 16 query rows as A fragments, one per 16 columns of d.
    u32 qa[TC_MAX_DIM / 16][4];
#pragma unroll
    for (int kk = 0; kk < TC_MAX_DIM / 16; ++kk) {
        if (kk < ksteps) {
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                int row = row0 + g + ((r & 1) ? 8 : 0);
                int col = kk * 16 + 2 * t + ((r & 2) ? 8 : 0);
                float lo = 0.0f, hi = 0.0f;
                if (row < count) {
                    const float* src = q + (first + row) * (i64)q_dim + h * d + col;
                    lo = src[0];
                    hi = src[1];
                }
                qa[kk][r] = pack_bf16(lo, hi);
            }
        }
    }
    float o[TC_MAX_DIM / 8][4];
#pragma unroll
    for (int j = 0; j < TC_MAX_DIM / 8; ++j) {
        o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    }
    float m_run[2] = {NEG_INF, NEG_INF}; // rows g and g + 8
    float l_run[2] = {0.0f, 0.0f};       // this lane's share of the rows' sums
    int pos_row[2] = {p0 + row0 + g, p0 + row0 + g + 8};

    int pieces = d * 2 / 16; // 16-byte pieces of a row
    for (int c0 = lowest; c0 <= last; c0 += TC_CHUNK) {
        __syncthreads(); // the previous chunk is no longer read
        for (int u = threadIdx.x; u < 2 * TC_CHUNK * pieces; u += blockDim.x) {
            int plane = u >= TC_CHUNK * pieces;
            int rest = u - plane * TC_CHUNK * pieces;
            int r = rest / pieces;
            int c = rest - r * pieces;
            int p = c0 + r;
            uint4 v = make_uint4(0u, 0u, 0u, 0u);
            if (p <= last) {
                i64 slot = (i64)table[p / s.block_size] * s.block_size + p % s.block_size;
                const act_t* src = (plane ? v_cache : k_cache) + slot * kv_dim + kvh * d;
                v = reinterpret_cast<const uint4*>(src)[c];
            }
            bf16_bits* dst = (plane ? vs : ks) + r * TC_STRIDE;
            reinterpret_cast<uint4*>(dst)[c] = v;
        }
        __syncthreads();
        if (!active) {
            continue; // uniform over the warp; no barrier until the next chunk's
        }
        // Scores of the warp's 16 rows against the chunk's 64 positions: 8 tiles of 8.
        float sc[TC_CHUNK / 8][4];
#pragma unroll
        for (int nt = 0; nt < TC_CHUNK / 8; ++nt) {
            sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < TC_MAX_DIM / 16; ++kk) {
                if (kk < ksteps) {
                    const bf16_bits* krow = ks + (nt * 8 + g) * TC_STRIDE + kk * 16 + 2 * t;
                    u32 b[2] = {pair_at(krow), pair_at(krow + 8)};
                    mma_16816(sc[nt], qa[kk], b);
                }
            }
        }
        // Scale, causal mask, the rows' new maxima (over the 4 lanes of a row).
        float mx[2] = {NEG_INF, NEG_INF};
#pragma unroll
        for (int nt = 0; nt < TC_CHUNK / 8; ++nt) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                int p = c0 + nt * 8 + 2 * t + (i & 1);
                int half = i >> 1;
                int row_pos = pos_row[half];
                bool seen = p <= row_pos && p >= window_start(row_pos, s.window);
                float v = seen ? sc[nt][i] * s.scale : NEG_INF;
                sc[nt][i] = v;
                mx[half] = fmaxf(mx[half], v);
            }
        }
        float corr[2];
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            mx[half] = fmaxf(mx[half], __shfl_xor_sync(0xffffffffu, mx[half], 1));
            mx[half] = fmaxf(mx[half], __shfl_xor_sync(0xffffffffu, mx[half], 2));
            float new_m = fmaxf(m_run[half], mx[half]);
            // A row with no position yet (past the tile's tokens) keeps zeros.
            corr[half] = new_m == NEG_INF ? 1.0f : expf(m_run[half] - new_m);
            m_run[half] = new_m;
            l_run[half] *= corr[half];
        }
#pragma unroll
        for (int j = 0; j < TC_MAX_DIM / 8; ++j) {
            o[j][0] *= corr[0];
            o[j][1] *= corr[0];
            o[j][2] *= corr[1];
            o[j][3] *= corr[1];
        }
        // Probabilities, as bf16 A fragments of 16 positions each, times the values.
#pragma unroll
        for (int kk = 0; kk < TC_CHUNK / 16; ++kk) {
            float pr[2][4];
#pragma unroll
            for (int x = 0; x < 2; ++x) {
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    int half = i >> 1;
                    float v = sc[2 * kk + x][i];
                    float p = m_run[half] == NEG_INF ? 0.0f : expf(v - m_run[half]);
                    pr[x][i] = p;
                    l_run[half] += p;
                }
            }
            u32 pa[4] = {pack_bf16(pr[0][0], pr[0][1]), pack_bf16(pr[0][2], pr[0][3]),
                         pack_bf16(pr[1][0], pr[1][1]), pack_bf16(pr[1][2], pr[1][3])};
#pragma unroll
            for (int j = 0; j < TC_MAX_DIM / 8; ++j) {
                if (j < dtiles) {
                    const bf16_bits* v0 = vs + (kk * 16 + 2 * t) * TC_STRIDE + j * 8 + g;
                    u32 b[2] = {(u32)v0[0] | ((u32)v0[TC_STRIDE] << 16),
                                (u32)v0[8 * TC_STRIDE] | ((u32)v0[9 * TC_STRIDE] << 16)};
                    mma_16816(o[j], pa, b);
                }
            }
        }
    }
    if (!active) {
        return;
    }
    float l_row[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        float l = l_run[half];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        l_row[half] = l;
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        int row = row0 + g + 8 * half;
        if (row < count) {
            i64 dst = (first + row) * (i64)q_dim + h * d;
#pragma unroll
            for (int j = 0; j < TC_MAX_DIM / 8; ++j) {
                if (j < dtiles) {
                    int col = j * 8 + 2 * t;
                    store_act(out, dst + col, o[j][2 * half] / l_row[half]);
                    store_act(out, dst + col + 1, o[j][2 * half + 1] / l_row[half]);
                }
            }
        }
    }
#endif
}
