// Attention on tensor cores (bf16 only; `CudaOptions::tensor_core_attention`).
//
// The tiled attention in attention.cu runs every product on CUDA cores, one position per
// lane; in a prefill of thousands of tokens that dominates the step. Here a warp holds 16
// query rows of the block's kv head (tokens x the group's query heads, below) and
// multiplies them with the staged key rows through mma.sync
// (m16n8k16, bf16 inputs, f32 accumulation; tensor_core.cu), keeps FlashAttention-2's
// online softmax in registers, and multiplies the probabilities (rounded to bf16) with the
// value rows the same way. The result differs from attention.cu's in rounding (bf16
// probabilities, the tensor cores' accumulation order), so when this kernel is chosen it
// serves every step, decode steps too (tiles of one token): a row's result depends only
// on its own context, since the chunks start at multiples of CHUNK whatever the tile, a
// chunk wholly outside a row's view leaves its state unchanged bit for bit, and each
// element of an mma comes from its own row and column (given finite values: a tile stages
// the value rows of its later tokens, which an earlier row weighs by exact zeros, and
// 0 * inf would not be zero). The softmax state's arithmetic is rounded explicitly, so that
// no contraction the compiler chooses differs between launch shapes. Decode then stays
// bitwise equal to scoring, and a sequence to itself alone, as with attention.cu.
//
// Grid: (tiles, num_kv_heads, num_parts), or (tiles, num_kv_heads, 1) when the blocks fold
// their partitions themselves; block: TC_WARPS warps per slice of the head's columns (one
// slice, but two in attention_tc_256: below). A tile is up to TC_ROWS / group consecutive
// tokens of one sequence at consecutive positions (the `tiles` table as in attention.cu,
// built for that many tokens), and the block's TC_ROWS query rows are its (token, query
// head of the kv head's group) pairs, token-major; warp w takes rows [16 w, 16 w + 16) (of
// slice w % slices: [16 (w / slices), ..)). The context is split into the partitions
// paged_attention uses, counted the same way. In the kernels of a block per partition, a
// block takes one partition (flash-decoding: a decode step's long context spreads over many
// blocks) and attention_tc_merge folds the partial results of a token spanning several; in
// the `_fold` kernels, the block walks every partition and folds each as it closes it
// (fold_term, the same operations in the same order; the fold's value sums take dynamic
// shared memory, OJ * 512 bytes a warp). Either way a token's partitions are computed alike
// in a prefill tile and in a decode step. The block walks the positions from the first any
// token of the tile sees to the last token's position, a chunk at a time: its threads copy
// the chunk's key and value rows of the block's kv head into shared memory by cp.async
// (zeros past the last position), the next chunk's copies in flight while each warp
// computes on this one: its scores, the positions each row does not see masked (after its
// own: causal; before its window), its running maxima and sums, and the values' sum.
// Fragments come from shared memory by ldmatrix: the key rows as B of the scores, the value
// rows transposed as B of the values.
//
// One kernel per bound on the head dimension (and its `_fold` twin), so that registers hold
// what the head needs: attention_tc_64 serves head dimensions 16 to 64, attention_tc_128 80
// to 128 and attention_tc_256 144 to 256 (multiples of 16). A chunk is 64, 32 and 16
// positions, so that two stages of keys and values stay within 48 KiB of static shared
// memory. A warp of attention_tc_256 could not hold its rows' query fragments and all 256
// columns of their value sums without spilling, so the head's columns are split in two
// slices (SLICES): two warps take the same 16 rows, both compute the rows' scores and
// softmax (the same operations on the same values: the same bits), and each sums the values
// of its half of the columns (16-column pairs alternate between the slices). A column's sum
// is the same chain of products whichever warp computes it.

#define TC_WARPS 4
#define TC_ROWS (16 * TC_WARPS)

// One step of the fold of a token's partitions, in partition order: the running (max M,
// sum L, value sums O) and a partition's (m, l, o) become, with M' = max(M, m),
// L * e^(M - M') + l * e^(m - M') and the same of O and o. Rounded explicitly (no
// contraction the compiler may choose differently in another kernel), so that the block
// that folds its partitions itself and attention_tc_merge, folding what partitions wrote,
// compute the same bits.
__device__ __forceinline__ float fold_term(float acc, float acc_scale, float x, float x_scale) {
    return __fmaf_rn(x, x_scale, __fmul_rn(acc, acc_scale));
}

// One fold step's scales for a partition whose maximum `m` is finite: the fold's maximum
// `fold_m` becomes max(fold_m, m), and `a`, `b` scale the fold and the partition. Returns
// false when the fold was empty: the partition is then taken as it is (a fold from nothing
// would turn -0 into +0, where a partition that writes its output directly keeps it).
__device__ __forceinline__ bool fold_scales(float& fold_m, float m, float& a, float& b) {
    if (fold_m == NEG_INF) {
        fold_m = m;
        return false;
    }
    float next = fmaxf(fold_m, m);
    a = expf(fold_m - next);
    b = expf(m - next);
    fold_m = next;
    return true;
}

// A value of the fold after a step with `fold_scales`'s result.
__device__ __forceinline__ float fold_value(bool folds, float acc, float a, float x, float b) {
    return folds ? fold_term(acc, a, x, b) : x;
}

template <int D, int SLICES, bool FOLD>
__device__ __forceinline__ void attention_tc_tiles(const float* q, const act_t* k_cache,
                                                   const act_t* v_cache,
                                                   const int* block_tables,
                                                   const int* token_seq, const int* positions,
                                                   const int* tiles, act_t* out,
                                                   float* partials, AttnShape s) {
#if TANDEM_ACT_BF16
    constexpr int CHUNK = D <= 64 ? 64 : (D <= 128 ? 32 : 16); // positions staged at a time
    constexpr int OJ = D / 8 / SLICES; // value tiles of 8 columns a warp sums
    static_assert(ATTN_PARTITION % CHUNK == 0, "a chunk never crosses a partition");
    constexpr int STRIDE = D + 8; // bf16 per staged row: 16-byte aligned, conflict-free
    __shared__ __align__(16) bf16_bits ks[2][CHUNK * STRIDE];
    __shared__ __align__(16) bf16_bits vs[2][CHUNK * STRIDE];
    int d = s.head_dim;
    int lane = threadIdx.x & 31;
    int warp = (threadIdx.x >> 5) / SLICES; // the warp's rows
    int slice = (threadIdx.x >> 5) % SLICES; // and its columns of the values
    // Value tile j of the warp: columns [col_of(j), col_of(j) + 8), real when below d.
    auto col_of = [&](int j) { return ((j >> 1) * SLICES + slice) * 16 + (j & 1) * 8; };
    int g = lane >> 2;
    int t = lane & 3;
    // Rows are (token, query head) pairs of the kv head's group, token-major: row r is
    // token r / group, head kvh * group + r % group, so that the group's heads share every
    // staged key and value row (a decode step's one token still fills `group` rows).
    int kvh = blockIdx.y;
    int group = s.num_heads / s.num_kv_heads;
    i64 first = tiles[2 * blockIdx.x];
    int count = tiles[2 * blockIdx.x + 1];
    int p0 = positions[first];
    int last = p0 + count - 1; // the tile's last position
    // Partition blockIdx.z, counted as paged_attention counts it (from the partition of the
    // tile's first window start); the block takes the tile's positions in it, from the
    // chunk holding the first one any token sees: chunks start at multiples of CHUNK
    // wherever the window starts, so that a token meets the same chunks in any tile.
    // FOLD: the block walks every partition of the tile and folds them itself (grid z is
    // 1; `partials` unused).
    constexpr bool fold = FOLD;
    int first_seen = window_start(p0, s.window);
    int part = first_seen / ATTN_PARTITION + (int)blockIdx.z;
    int part_start = part * ATTN_PARTITION;
    int start = max(fold ? 0 : part_start, first_seen / CHUNK * CHUNK);
    // One past the block's positions.
    int end = fold ? last + 1 : min(last + 1, part_start + ATTN_PARTITION);
    if (start >= end) {
        return; // the whole block, before any barrier
    }
    const int* table = block_tables + (i64)token_seq[first] * s.max_blocks;
    int q_dim = s.num_heads * d;
    int kv_dim = s.num_kv_heads * d;
    int ksteps = d / 16; // column steps of the scores
    int row0 = warp * 16; // the warp's first row in the tile
    int rows = count * group;
    bool active = row0 < rows;

    // The warp's 16 query rows as A fragments, one per 16 columns of d.
    u32 qa[D / 16][4];
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        if (kk < ksteps) {
#pragma unroll
            for (int r = 0; r < 4; ++r) {
                int row = row0 + g + ((r & 1) ? 8 : 0);
                int col = kk * 16 + 2 * t + ((r & 2) ? 8 : 0);
                float2 v = make_float2(0.0f, 0.0f);
                if (row < rows) {
                    i64 token = first + row / group;
                    int h = kvh * group + row % group;
                    v = *reinterpret_cast<const float2*>(q + token * q_dim + h * d + col);
                }
                qa[kk][r] = pack_bf16(v.x, v.y);
            }
        }
    }
    float o[OJ][4];
#pragma unroll
    for (int j = 0; j < OJ; ++j) {
        o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    }
    float m_run[2] = {NEG_INF, NEG_INF}; // rows g and g + 8
    float l_run[2] = {0.0f, 0.0f};       // this lane's share of the rows' sums
    int pos_row[2] = {p0 + (row0 + g) / group, p0 + (row0 + g + 8) / group};
    // The rows' sums over the quad of lanes that holds them.
    float l_row[2];
    auto row_sums = [&]() {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            float l = l_run[half];
            l = __fadd_rn(l, __shfl_xor_sync(0xffffffffu, l, 1));
            l = __fadd_rn(l, __shfl_xor_sync(0xffffffffu, l, 2));
            l_row[half] = l;
        }
    };
    // When folding: the partitions so far, folded (see fold_term), and the fold of the
    // partition just walked into them, which then starts afresh. A partition in which a
    // row sees nothing (max still -inf) leaves the row's fold as it is. The fold's value
    // sums, a second set of the warp's accumulators, live in dynamic shared memory, each
    // lane's own (OJ * 128 floats a warp, lane-minor: no bank conflicts, no barrier): in
    // registers they would spill at 128 columns and cost a block per multiprocessor at 64.
    float fold_m[2] = {NEG_INF, NEG_INF};
    float fold_l[2] = {0.0f, 0.0f};
    float* fold_s = reinterpret_cast<float*>(attn_shared) + (threadIdx.x >> 5) * (OJ * 128) + lane;
    auto fold_o = [&](int j, int c) -> float& { return fold_s[(j * 4 + c) * 32]; };
    if (fold) {
#pragma unroll
        for (int j = 0; j < OJ; ++j) {
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                fold_o(j, c) = 0.0f;
            }
        }
    }
    auto close_partition = [&]() {
        row_sums();
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            if (m_run[half] != NEG_INF) {
                float a = 0.0f, b = 0.0f;
                bool folds = fold_scales(fold_m[half], m_run[half], a, b);
                fold_l[half] = fold_value(folds, fold_l[half], a, l_row[half], b);
#pragma unroll
                for (int j = 0; j < OJ; ++j) {
#pragma unroll
                    for (int c = 2 * half; c < 2 * half + 2; ++c) {
                        fold_o(j, c) = fold_value(folds, fold_o(j, c), a, o[j][c], b);
                    }
                }
            }
            m_run[half] = NEG_INF;
            l_run[half] = 0.0f;
#pragma unroll
            for (int j = 0; j < OJ; ++j) {
                o[j][2 * half] = o[j][2 * half + 1] = 0.0f;
            }
        }
    };

    // Queues the copies of positions [c0, c0 + CHUNK) into stage `buf` as one group; rows
    // past the last position are zeros (a zero probability times a value row nobody wrote
    // could be NaN). The stage must be one no thread still reads.
    int pieces = d / 8; // 16-byte pieces of a row
    auto stage = [&](int buf, int c0) {
        for (int u = threadIdx.x; u < 2 * CHUNK * pieces; u += blockDim.x) {
            int plane = u >= CHUNK * pieces;
            int rest = u - plane * CHUNK * pieces;
            int r = rest / pieces;
            int c = rest - r * pieces;
            int p = c0 + r;
            bf16_bits* dst = (plane ? vs[buf] : ks[buf]) + r * STRIDE + c * 8;
            if (p < end) {
                i64 slot = (i64)table[p / s.block_size] * s.block_size + p % s.block_size;
                const act_t* src = (plane ? v_cache : k_cache) + slot * kv_dim + kvh * d + c * 8;
                copy16_to_shared(reinterpret_cast<unsigned char*>(dst),
                                 reinterpret_cast<const unsigned char*>(src));
            } else {
                *reinterpret_cast<uint4*>(dst) = make_uint4(0u, 0u, 0u, 0u);
            }
        }
        copies_commit();
    };

    stage(0, start);
    int buf = 0;
    for (int c0 = start; c0 < end; c0 += CHUNK, buf ^= 1) {
        copies_wait(0); // this thread's copies of chunk c0 have landed
        // Every thread's have, and every thread is done with the other stage (the previous
        // chunk), which the next chunk's copies overwrite.
        __syncthreads();
        if (c0 + CHUNK < end) {
            stage(buf ^ 1, c0 + CHUNK);
        }
        if (!active) {
            continue; // uniform over the warp; no barrier until the next chunk's
        }
        if (fold && c0 % ATTN_PARTITION == 0 && c0 != start) {
            close_partition(); // chunk c0 starts the next partition
        }
        const bf16_bits* kt = ks[buf];
        const bf16_bits* vt = vs[buf];
        // Scores of the warp's 16 rows against the chunk's positions: tiles of 8, each the
        // chain of products over d in ascending order.
        float sc[CHUNK / 8][4];
#pragma unroll
        for (int nt = 0; nt < CHUNK / 8; ++nt) {
            sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
        }
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk) {
            if (kk < ksteps) {
#pragma unroll
                for (int np = 0; np < CHUNK / 16; ++np) {
                    u32 b[4];
                    frag_b_pair_row(b, kt + np * 16 * STRIDE + kk * 16, STRIDE);
                    mma_16816(sc[2 * np], qa[kk], b);
                    mma_16816(sc[2 * np + 1], qa[kk], b + 2);
                }
            }
        }
        // Scale, causal mask, the rows' new maxima (over the 4 lanes of a row).
        float mx[2] = {NEG_INF, NEG_INF};
#pragma unroll
        for (int nt = 0; nt < CHUNK / 8; ++nt) {
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                int p = c0 + nt * 8 + 2 * t + (i & 1);
                int half = i >> 1;
                int row_pos = pos_row[half];
                bool seen = p <= row_pos && p >= window_start(row_pos, s.window);
                float v = seen ? __fmul_rn(sc[nt][i], s.scale) : NEG_INF;
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
            corr[half] = new_m == NEG_INF ? 1.0f : expf(__fsub_rn(m_run[half], new_m));
            m_run[half] = new_m;
            l_run[half] = __fmul_rn(l_run[half], corr[half]);
        }
#pragma unroll
        for (int j = 0; j < OJ; ++j) {
            o[j][0] = __fmul_rn(o[j][0], corr[0]);
            o[j][1] = __fmul_rn(o[j][1], corr[0]);
            o[j][2] = __fmul_rn(o[j][2], corr[1]);
            o[j][3] = __fmul_rn(o[j][3], corr[1]);
        }
        // Probabilities, as bf16 A fragments of 16 positions each, times the values.
#pragma unroll
        for (int kk = 0; kk < CHUNK / 16; ++kk) {
            float pr[2][4];
#pragma unroll
            for (int x = 0; x < 2; ++x) {
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    int half = i >> 1;
                    float v = sc[2 * kk + x][i];
                    float p = m_run[half] == NEG_INF ? 0.0f : expf(__fsub_rn(v, m_run[half]));
                    pr[x][i] = p;
                    l_run[half] = __fadd_rn(l_run[half], p);
                }
            }
            u32 pa[4] = {pack_bf16(pr[0][0], pr[0][1]), pack_bf16(pr[0][2], pr[0][3]),
                         pack_bf16(pr[1][0], pr[1][1]), pack_bf16(pr[1][2], pr[1][3])};
#pragma unroll
            for (int jj = 0; jj < OJ / 2; ++jj) {
                int col = col_of(2 * jj);
                if (col < d) {
                    u32 b[4];
                    frag_b_pair_col(b, vt + kk * 16 * STRIDE + col, STRIDE);
                    mma_16816(o[2 * jj], pa, b);
                    mma_16816(o[2 * jj + 1], pa, b + 2);
                }
            }
        }
    }
    if (!active) {
        return;
    }
    // Writes row `row0 + g + 8 * half`'s output: its value sums `acc(j, c)` over its sum `l`.
    auto write_output = [&](int half, auto&& acc, float l) {
        int row = row0 + g + 8 * half;
        int h = kvh * group + row % group;
        act_t* dst = out + (first + row / group) * (i64)q_dim + h * d;
#pragma unroll
        for (int j = 0; j < OJ; ++j) {
            if (col_of(j) < d) {
                *reinterpret_cast<u32*>(dst + col_of(j) + 2 * t) =
                    pack_bf16(acc(j, 2 * half) / l, acc(j, 2 * half + 1) / l);
            }
        }
    };
    if (fold) {
        close_partition();
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            if (row0 + g + 8 * half < rows) {
                write_output(half, fold_o, fold_l[half]);
            }
        }
        return;
    }
    row_sums();
    // A row whose window lies in one partition writes its output; otherwise each partition
    // with positions of the row writes (value sum, max, sum) to its slot of `partials`, in
    // paged_attention's layout, and attention_tc_merge folds them.
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        int row = row0 + g + 8 * half;
        int pos = pos_row[half];
        int lo = window_start(pos, s.window);
        int from = max(part_start, lo);
        bool works = row < rows && from < min(pos + 1, part_start + ATTN_PARTITION);
        if (!works) {
            continue;
        }
        i64 token = first + row / group;
        int h = kvh * group + row % group;
        if (lo / ATTN_PARTITION == pos / ATTN_PARTITION) { // the only partition
            write_output(half, [&](int j, int c) { return o[j][c]; }, l_row[half]);
            continue;
        }
        int slot = part - lo / ATTN_PARTITION; // < num_parts: the launch covers every window
        float* partial =
            partials + ((token * s.num_heads + h) * (i64)s.num_parts + slot) * (d + 2);
#pragma unroll
        for (int j = 0; j < OJ; ++j) {
            if (col_of(j) < d) {
                *reinterpret_cast<float2*>(partial + col_of(j) + 2 * t) =
                    make_float2(o[j][2 * half], o[j][2 * half + 1]);
            }
        }
        if (t == 0 && slice == 0) {
            partial[d] = m_run[half];
            partial[d + 1] = l_row[half];
        }
    }
#endif
}

// q: [n, num_heads * d] f32; k_cache, v_cache: [slots, kv_dim] bf16; out: [n, q_dim] bf16.
// The other arguments as paged_attention's (attention.cu), partials and the grid's
// partitions (z) included; s.tile_tokens is ignored (blocks are TC_ROWS rows). The `_fold`
// kernels' blocks fold their partitions themselves (grid z 1, partials unused) and take 512
// bytes of dynamic shared memory per 8 columns of a warp for the fold: 16, 32 and 64 KiB
// (beside the stages, over 48 KiB a block: Kernels::load opts them in where the device
// allows, and otherwise no step folds). Each variant is its own kernel so that the one of a block per partition, which decode
// steps run, keeps its registers.
extern "C" __global__ void attention_tc_64(const float* q, const act_t* k_cache,
                                           const act_t* v_cache, const int* block_tables,
                                           const int* token_seq, const int* positions,
                                           const int* tiles, act_t* out, float* partials,
                                           AttnShape s) {
    attention_tc_tiles<64, 1, false>(q, k_cache, v_cache, block_tables, token_seq,
                                     positions, tiles, out, partials, s);
}

extern "C" __global__ void attention_tc_64_fold(const float* q, const act_t* k_cache,
                                                const act_t* v_cache, const int* block_tables,
                                                const int* token_seq, const int* positions,
                                                const int* tiles, act_t* out, float* partials,
                                                AttnShape s) {
    attention_tc_tiles<64, 1, true>(q, k_cache, v_cache, block_tables, token_seq,
                                    positions, tiles, out, partials, s);
}

extern "C" __global__ void attention_tc_128(const float* q, const act_t* k_cache,
                                            const act_t* v_cache, const int* block_tables,
                                            const int* token_seq, const int* positions,
                                            const int* tiles, act_t* out, float* partials,
                                            AttnShape s) {
    attention_tc_tiles<128, 1, false>(q, k_cache, v_cache, block_tables, token_seq,
                                      positions, tiles, out, partials, s);
}

extern "C" __global__ void attention_tc_128_fold(const float* q, const act_t* k_cache,
                                                 const act_t* v_cache, const int* block_tables,
                                                 const int* token_seq, const int* positions,
                                                 const int* tiles, act_t* out, float* partials,
                                                 AttnShape s) {
    attention_tc_tiles<128, 1, true>(q, k_cache, v_cache, block_tables, token_seq,
                                     positions, tiles, out, partials, s);
}

// Blocks of 2 TC_WARPS warps: two slices of the head's columns.
extern "C" __global__ void attention_tc_256(const float* q, const act_t* k_cache,
                                            const act_t* v_cache, const int* block_tables,
                                            const int* token_seq, const int* positions,
                                            const int* tiles, act_t* out, float* partials,
                                            AttnShape s) {
    attention_tc_tiles<256, 2, false>(q, k_cache, v_cache, block_tables, token_seq,
                                      positions, tiles, out, partials, s);
}

extern "C" __global__ void attention_tc_256_fold(const float* q, const act_t* k_cache,
                                                 const act_t* v_cache, const int* block_tables,
                                                 const int* token_seq, const int* positions,
                                                 const int* tiles, act_t* out, float* partials,
                                                 AttnShape s) {
    attention_tc_tiles<256, 2, true>(q, k_cache, v_cache, block_tables, token_seq,
                                     positions, tiles, out, partials, s);
}

// Folds the partitions of every token whose window spans more than one, in partition order
// (fold_term), and writes fold_o / fold_l: what a block that folds its partitions itself
// computes. Grid: (n tokens, num_heads); block: head_dim rounded up to a multiple of 32.
extern "C" __global__ void attention_tc_merge(const float* partials, const int* positions,
                                              act_t* out, AttnShape s) {
    i64 token = blockIdx.x;
    int h = blockIdx.y;
    int d = s.head_dim;
    int pos = positions[token];
    int first_part = window_start(pos, s.window) / ATTN_PARTITION;
    int last_part = pos / ATTN_PARTITION;
    if (first_part == last_part) {
        return; // the partition wrote the output
    }
    const float* base = partials + (token * s.num_heads + h) * (i64)s.num_parts * (d + 2);
    i64 dst = token * (i64)(s.num_heads * d) + h * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float m = NEG_INF;
        float l = 0.0f;
        float v = 0.0f;
        for (int j = first_part; j <= last_part; ++j) {
            const float* pj = base + (j - first_part) * (d + 2);
            if (pj[d] != NEG_INF) {
                float a = 0.0f, b = 0.0f;
                bool folds = fold_scales(m, pj[d], a, b);
                l = fold_value(folds, l, a, pj[d + 1], b);
                v = fold_value(folds, v, a, pj[i], b);
            }
        }
        store_act(out, dst + i, v / l);
    }
}
