// Paged causal attention with grouped-query heads over variable-length sequences, with the
// context split into fixed partitions (flash-decoding) and staged through shared memory.
//
// Grid: (tiles, num_kv_heads, num_parts); block: tile_tokens * group warps. A tile is up to
// `tile_tokens` consecutive tokens of one sequence (consecutive positions): the `tiles`
// array holds (first token, token count) pairs, or is null, when every tile is one token
// (tile i = token i; decode steps). Warp w = t * group + g of block (tile, kvh, j) computes,
// for query head kvh * group + g of the tile's token t, the attention over the positions
// of partition [j * P, (j + 1) * P) that the token sees: [window start, context), where
// context = position + 1, P = ATTN_PARTITION and the window starts at 0, or, on a layer
// with a sliding window of W positions, at max(0, context - W). Partition j is counted
// from the partition of the tile's first window start (0 without a window), j = z + that,
// so that a windowed layer's launch needs only the few partitions a window spans, not one
// per partition of the longest context: those blocks would all exit at once, and at long
// contexts they outnumber the working ones many times over. Blocks whose partition lies
// outside every window of the tile exit at once, so a launch may name more partitions
// than its longest context needs (a captured CUDA graph sizes them for the longest context
// it may ever see).
//
// The block walks its partition ATTN_CHUNK positions at a time. All its threads copy a
// chunk's key and value rows (one kv head) into shared memory together, 16 bytes per copy,
// asynchronously (cp.async) and one chunk ahead of the arithmetic, so that the loads of a
// chunk are in flight at once instead of one row after another, and the rows serve every
// query head of the group and every token of the tile. Where a position's row sits in the
// cache is looked up in the block table once per chunk, two chunks ahead: the first warp's
// lanes, one per position, list the rows' byte offsets in shared memory, and the copies
// read them from there. Then each warp takes the chunk:
// lane l computes the score of position base + l (a dot product over the head dimension
// with the query, kept in shared memory), the warp updates its online softmax (running max
// and sum) and its weighted sum of values, lane l holding dimensions l, l + 32, ...
//
// A token whose window fits in one partition writes its output directly. Otherwise each
// partition writes (value sum, max, sum) to `partials`, in slots counted from the partition
// of the token's own window start, and attention_merge combines them in partition order.
// A token's result depends only on its own query and context, never on the batch, the
// tile it shares or the launch shape: every warp does the same arithmetic on the same
// values in the same order, wherever its token sits.

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
    float scale;     // of the query-key products: 1 / sqrt(head_dim), or the model's
    int num_parts;   // partitions per (token, head) in `partials` (grid z)
    int tile_tokens; // tokens per tile: the block has tile_tokens * group warps
    int window;      // positions a token sees on this layer (itself included); 0: all
};

// The first position a token at `position` attends to.
__device__ __forceinline__ int window_start(int position, int window) {
    return window > 0 ? max(0, position + 1 - window) : 0;
}

__device__ __forceinline__ float warp_max(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    }
    return v;
}

// Dot product of one key row (`d` elements of act_t, 16-byte aligned) with `q` (shared,
// 16-byte aligned), read 16 bytes at a time; the products are summed in dimension order.
// The loops are not unrolled: the sum is one chain of dependent additions anyway, and
// unrolled, the compiler keeps many loads in flight at the cost of registers (with NVRTC
// 13.0 for sm_90 and bf16: 64 instead of 48), which would cut the blocks resident per
// multiprocessor.
__device__ __forceinline__ float dot_key(const act_t* key, const float* q, int d) {
    const float4* q4 = reinterpret_cast<const float4*>(q);
    float acc = 0.0f;
#if TANDEM_ACT_BF16
    const uint4* k8 = reinterpret_cast<const uint4*>(key);
#pragma unroll 1
    for (int i = 0; i < d / 8; ++i) {
        uint4 w = k8[i];
        float4 qa = q4[2 * i];
        float4 qb = q4[2 * i + 1];
        acc += qa.x * __uint_as_float(w.x << 16);
        acc += qa.y * __uint_as_float(w.x & 0xffff0000u);
        acc += qa.z * __uint_as_float(w.y << 16);
        acc += qa.w * __uint_as_float(w.y & 0xffff0000u);
        acc += qb.x * __uint_as_float(w.z << 16);
        acc += qb.y * __uint_as_float(w.z & 0xffff0000u);
        acc += qb.z * __uint_as_float(w.w << 16);
        acc += qb.w * __uint_as_float(w.w & 0xffff0000u);
    }
#else
    const float4* k4 = reinterpret_cast<const float4*>(key);
#pragma unroll 1
    for (int i = 0; i < d / 4; ++i) {
        float4 w = k4[i];
        float4 qi = q4[i];
        acc += qi.x * w.x;
        acc += qi.y * w.y;
        acc += qi.z * w.z;
        acc += qi.w * w.w;
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
#elif defined(TANDEM_EMULATOR)
    tandem_emu::async_copy16(dst, src);
#else
    *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
#endif
}

// Closes the group of copies issued since the last call.
__device__ __forceinline__ void copies_commit() {
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#elif defined(TANDEM_EMULATOR)
    tandem_emu::async_commit();
#endif
}

// Waits until at most `pending` (0, 1 or 2; more waits as for 2) committed groups of this
// thread's copies are still in flight.
__device__ __forceinline__ void copies_wait(int pending) {
#if __CUDA_ARCH__ >= 800
    if (pending == 0) {
        asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    } else if (pending == 1) {
        asm volatile("cp.async.wait_group 1;\n" ::: "memory");
    } else {
        asm volatile("cp.async.wait_group 2;\n" ::: "memory");
    }
#elif defined(TANDEM_EMULATOR)
    tandem_emu::async_wait((unsigned)min(pending, 2));
#endif
}

// Byte offset of position p's row in the cache, from the kv head's row of slot 0.
__device__ __forceinline__ i64 row_offset(const int* table, int p, int block_size,
                                          i64 slot_bytes) {
    return ((i64)table[p / block_size] * block_size + p % block_size) * slot_bytes;
}

// How a thread walks the 16-byte pieces of a chunk's rows: piece u (row u / pieces, column
// u % pieces, the rows being the keys' and then the values') goes to thread u % blockDim.x,
// so consecutive threads copy consecutive pieces of a row. A thread's first piece is
// threadIdx.x and each next one blockDim.x further: counted in rows and columns, so the
// walk needs no division.
struct PieceWalk {
    int row, col;           // the first piece
    int row_step, col_step; // blockDim.x pieces: row_step rows and col_step columns
    int pieces;             // per row
};

// Issues the copies of the key and value rows of a chunk's `rows` positions into `stage`
// (keys: ATTN_CHUNK rows of `row_bytes`, then values alike). Row r of the chunk lies at
// `offsets[r]` bytes from `keys` and from `values`.
__device__ __forceinline__ void stage_chunk(unsigned char* stage, const unsigned char* keys,
                                            const unsigned char* values, const i64* offsets,
                                            int rows, PieceWalk w, int row_bytes) {
    int row = w.row;
    int col = w.col;
    while (row < 2 * rows) {
        int plane = row >= rows; // 0: keys, 1: values
        int r = row - plane * rows;
        const unsigned char* src = (plane ? values : keys) + offsets[r] + col * 16;
        copy16_to_shared(stage + (plane * ATTN_CHUNK + r) * row_bytes + col * 16, src);
        row += w.row_step;
        col += w.col_step;
        if (col >= w.pieces) {
            col -= w.pieces;
            row += 1;
        }
    }
}

// q: [n, num_heads * head_dim] f32; k_cache, v_cache: [num_slots, kv_dim] act_t;
// block_tables: [num_seqs, max_blocks]; token_seq: [n] sequence of each token;
// positions: [n] position of each token; tiles: [tiles, 2] (first token, count) or null;
// out: [n, num_heads * head_dim] act_t;
// partials: [n, num_heads, num_parts, head_dim + 2] f32 (value sum, max, sum).
// Dynamic shared memory: shared_bytes() in attention_tiles.rs — a query row of f32 per
// warp, then two stages of ATTN_CHUNK key rows and ATTN_CHUNK value rows, then the row
// offsets (i64) of two chunks.
extern "C" __global__ void paged_attention(const float* q, const act_t* k_cache,
                                           const act_t* v_cache, const int* block_tables,
                                           const int* token_seq, const int* positions,
                                           const int* tiles, act_t* out, float* partials,
                                           AttnShape s) {
    int d = s.head_dim;
    int per_lane = d / 32;
    int group = s.num_heads / s.num_kv_heads;
    int lane = threadIdx.x & 31;
    int warp = threadIdx.x >> 5;
    int g = warp % group;
    int t = warp / group;
    int kvh = blockIdx.y;
    i64 first = tiles ? tiles[2 * blockIdx.x] : blockIdx.x;
    int count = tiles ? tiles[2 * blockIdx.x + 1] : 1;
    int part = window_start(positions[first], s.window) / ATTN_PARTITION + (int)blockIdx.z;
    // The tile's tokens are consecutive positions of one sequence: the first's window
    // starts first and the last has the longest context; the block stages the positions
    // of the partition that any of them needs.
    // Chunks start at multiples of ATTN_CHUNK, wherever the window starts, so that a token
    // meets the same chunks in any tile.
    int part_start = part * ATTN_PARTITION;
    int lowest = window_start(positions[first], s.window) / ATTN_CHUNK * ATTN_CHUNK;
    int start = max(part_start, lowest);
    int block_end = min(positions[first + count - 1] + 1, part_start + ATTN_PARTITION);
    if (start >= block_end) {
        return; // the whole block, before any barrier
    }
    bool active = t < count;
    i64 token = first + (active ? t : 0);
    int context = positions[token] + 1;
    int lo = window_start(context - 1, s.window);
    int from = max(part_start, lo);
    int end = min(context, part_start + ATTN_PARTITION);
    bool works = active && from < end; // this warp has positions [from, end)
    int h = kvh * group + g;
    const unsigned char* keys = reinterpret_cast<const unsigned char*>(k_cache + kvh * d);
    const unsigned char* values = reinterpret_cast<const unsigned char*>(v_cache + kvh * d);
    const int* table = block_tables + (i64)token_seq[first] * s.max_blocks;
    i64 slot_bytes = (i64)s.num_kv_heads * d * (i64)sizeof(act_t);
    int row_bytes = staged_row_bytes(d);
    int stage_bytes = 2 * ATTN_CHUNK * row_bytes;
    float* qs = reinterpret_cast<float*>(attn_shared) + warp * d; // 16-byte aligned: 32 | d
    unsigned char* stages = attn_shared + (blockDim.x >> 5) * d * sizeof(float);
    // The row offsets of chunk k are at offsets + (k & 1) * ATTN_CHUNK.
    i64* offsets = reinterpret_cast<i64*>(stages + 2 * stage_bytes);
    int pieces = d * (int)sizeof(act_t) / 16;
    PieceWalk walk = {(int)threadIdx.x / pieces, (int)threadIdx.x % pieces,
                      (int)blockDim.x / pieces, (int)blockDim.x % pieces, pieces};
    bool lister = threadIdx.x < ATTN_CHUNK; // lists position base + threadIdx.x of a chunk
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
    for (int k = 0; k < 2; ++k) {
        int p = start + k * ATTN_CHUNK + threadIdx.x;
        if (lister && p < block_end) {
            offsets[k * ATTN_CHUNK + threadIdx.x] = row_offset(table, p, s.block_size, slot_bytes);
        }
    }
    __syncthreads(); // the rows of chunks 0 and 1 are listed
    stage_chunk(stages, keys, values, offsets, min(ATTN_CHUNK, block_end - start), walk,
                row_bytes);
    copies_commit();
    for (int c = 0; c < chunks; ++c) {
        int base = start + c * ATTN_CHUNK;
        // The first warp looks up the rows of chunk c + 2 now and lists them at the end of
        // the iteration, in the place of chunk c's: every thread has read those (to stage
        // chunk c, before the loop or in the previous iteration) by the barrier below.
        int ahead = base + 2 * ATTN_CHUNK + threadIdx.x;
        bool lists = lister && ahead < block_end;
        i64 ahead_offset = lists ? row_offset(table, ahead, s.block_size, slot_bytes) : 0;
        if (c + 1 < chunks) { // the next chunk's copies go out before this one's arithmetic
            int next = base + ATTN_CHUNK;
            stage_chunk(stages + ((c + 1) & 1) * stage_bytes, keys, values,
                        offsets + ((c + 1) & 1) * ATTN_CHUNK, min(ATTN_CHUNK, block_end - next),
                        walk, row_bytes);
            copies_commit();
            copies_wait(1);
        } else {
            copies_wait(0);
        }
        __syncthreads(); // chunk c is in shared memory (and every query row is stored)
        if (works && base < end && base + ATTN_CHUNK > from) {
            const unsigned char* staged_keys = stages + (c & 1) * stage_bytes;
            const unsigned char* staged_values = staged_keys + ATTN_CHUNK * row_bytes;
            int p = base + lane;
            bool seen = p >= from && p < end;
            float score = NEG_INF;
            if (seen) {
                const act_t* key = reinterpret_cast<const act_t*>(staged_keys + lane * row_bytes);
                score = dot_key(key, qs, d) * s.scale;
            }
            // At least one lane holds a position, so new_max is finite.
            float new_max = fmaxf(run_max, warp_max(score));
            float correction = expf(run_max - new_max);
            float weight = seen ? expf(score - new_max) : 0.0f;
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
        if (lists) {
            offsets[(c & 1) * ATTN_CHUNK + threadIdx.x] = ahead_offset;
        }
        // Every warp is done with chunk c before its stage is refilled, and the rows of
        // chunk c + 2 are listed before they are staged.
        __syncthreads();
    }
    if (!works) {
        return;
    }

    if (lo / ATTN_PARTITION == (context - 1) / ATTN_PARTITION) { // the only partition
        i64 dst = token * (i64)(s.num_heads * d) + h * d;
#pragma unroll
        for (int i = 0; i < ATTN_MAX_PER_LANE; ++i) {
            if (i < per_lane) {
                store_act(out, dst + lane + 32 * i, acc[i] / run_sum);
            }
        }
        return;
    }
    int slot = part - lo / ATTN_PARTITION; // < num_parts: the launch covers every window
    float* partial = partials + ((token * s.num_heads + h) * (i64)s.num_parts + slot) * (d + 2);
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
    int first_part = window_start(context - 1, s.window) / ATTN_PARTITION;
    int parts = (context + ATTN_PARTITION - 1) / ATTN_PARTITION; // one past the last
    if (parts - first_part == 1) {
        return;
    }
    // Partition j's results are in slot j - first_part (see paged_attention).
    const float* base = partials + (token * s.num_heads + h) * (i64)s.num_parts * (d + 2);
    float total_max = NEG_INF;
    for (int j = first_part; j < parts; ++j) {
        total_max = fmaxf(total_max, base[(j - first_part) * (d + 2) + d]);
    }
    float total_sum = 0.0f;
    for (int j = first_part; j < parts; ++j) {
        const float* pj = base + (j - first_part) * (d + 2);
        total_sum += pj[d + 1] * expf(pj[d] - total_max);
    }
    i64 dst = token * (i64)(s.num_heads * d) + h * d;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
        float v = 0.0f;
        for (int j = first_part; j < parts; ++j) {
            const float* pj = base + (j - first_part) * (d + 2);
            v += pj[i] * expf(pj[d] - total_max);
        }
        store_act(out, dst + i, v / total_sum);
    }
}
