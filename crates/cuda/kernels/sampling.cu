// Sampling one token per logits row where the logits are: greedy, or temperature, top-k,
// top-p and min-p with one uniform number per row drawn by the host from the request's own
// stream, from the row processing.cu left (a -inf there cannot be chosen). Only the chosen
// ids cross to the host (then logit_exp_sums gives their raw log-probabilities, and
// top_logits the raw rows' most likely tokens). tandem_model::row_sampling is the host
// reference of this algorithm.
//
// The distribution is the host sampler's (tandem_engine's `sample`): with l the row, m its
// maximum, T the temperature (a -inf weighs 0, so it never survives the draw),
//   1. top-k keeps the k largest l, ties to the lower id (order: l by total order, then id);
//   2. weights w = exp((l - m) / T) in f64, total = the sum over the top-k survivors;
//   3. top-p keeps, in that same order, the shortest prefix whose mass reaches
//      top_p * total;
//   4. min-p keeps w >= min_p (the largest weight is exactly 1);
//   5. the draw walks the survivors in id order and takes the first whose cumulative
//      weight exceeds u * (their total); if rounding never does, the last one of positive
//      weight.
// Every reduction is a fixed tree over fixed thread ranges, so a row's token depends only
// on its logits, its parameters and its u, never on the batch or the run.
//
// A row is read a few times, not sorted: once for its maximum, 4 radix passes for top-k (4
// more only when the boundary value is tied and not all of its elements fit), 8 passes for
// top-p (a digit of 4 bits each; after the first, only the elements near the boundary are
// weighed) and one to count its ties, and 2 for the draw.
//
// Grid: rows; block: SAMPLE_THREADS threads (a multiple of 32).

#define SAMPLE_THREADS 256

struct RowSampling {
    float temperature; // 0: greedy
    int top_k;         // <= 0: off
    float top_p;       // >= 1: off
    float min_p;       // <= 0: off
    double uniform;    // in [0, 1)
};

// Larger floats get larger keys (the total order: -0 below +0); for finite values.
__device__ __forceinline__ u32 order_key(float v) {
    u32 b = __float_as_uint(v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// The float whose order_key is `k`.
__device__ __forceinline__ float value_of_key(u32 k) {
    return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

__device__ __forceinline__ double warp_sum_f64(double v) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    }
    return v;
}

// Integer sum, maximum and minimum over the block; every thread gets them.
// `scratch`: 32 ints.
__device__ int block_sum_int(int v, int* scratch) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    }
    __syncthreads();
    if ((threadIdx.x & 31) == 0) {
        scratch[threadIdx.x >> 5] = v;
    }
    __syncthreads();
    int total = 0;
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) {
        total += scratch[w];
    }
    return total;
}

__device__ int block_min_int(int v, int* scratch) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        v = min(v, __shfl_xor_sync(0xffffffffu, v, offset));
    }
    __syncthreads();
    if ((threadIdx.x & 31) == 0) {
        scratch[threadIdx.x >> 5] = v;
    }
    __syncthreads();
    int out = v;
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) {
        out = min(out, scratch[w]);
    }
    return out;
}

__device__ float block_max_f32(float v, float* scratch) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    }
    __syncthreads();
    if ((threadIdx.x & 31) == 0) {
        scratch[threadIdx.x >> 5] = v;
    }
    __syncthreads();
    float out = v;
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) {
        out = fmaxf(out, scratch[w]);
    }
    return out;
}

// The top-p search decides this many bits of the boundary key per pass over the row.
#define TOP_P_DIGIT_BITS 4
#define TOP_P_DIGITS (1 << TOP_P_DIGIT_BITS)

// Each of the TOP_P_DIGITS values summed over the block in a fixed order, into `out`
// (shared), which every thread may read on return. `scratch`: one row per warp.
__device__ void block_sums_digits(double (&v)[TOP_P_DIGITS],
                                  double (*scratch)[TOP_P_DIGITS], double* out) {
    int lane = threadIdx.x & 31;
    int warp = threadIdx.x >> 5;
#pragma unroll
    for (int d = 0; d < TOP_P_DIGITS; ++d) {
        double s = warp_sum_f64(v[d]);
        if (lane == 0) {
            scratch[warp][d] = s;
        }
    }
    __syncthreads();
    if (threadIdx.x < TOP_P_DIGITS) {
        double s = 0.0;
        for (int w = 0; w < (int)(blockDim.x >> 5); ++w) {
            s += scratch[w][threadIdx.x];
        }
        out[threadIdx.x] = s;
    }
    __syncthreads();
}

// Block-shared state of the selections.
struct SelectShared {
    int hist[256];
    u32 prefix;
    u32 rank;
    u32 count;
};

// The value at `rank` (0-based) among { value(i) : i < n, pred(i) } in descending
// (`descending`) or ascending order, by radix selection, 8 bits at a time from the top.
// `rank` must be below the number of such i. On return `sh->rank` is the rank among the
// elements equal to the result (those before it in the order: ties) and `sh->count` their
// number. Block-wide.
template <class Value, class Pred>
__device__ u32 radix_select(int n, Value value, Pred pred, u32 rank, bool descending,
                            SelectShared* sh) {
    u32 prefix = 0;
    u32 mask = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += blockDim.x) {
            sh->hist[b] = 0;
        }
        __syncthreads();
        for (int i = threadIdx.x; i < n; i += blockDim.x) {
            if (pred(i)) {
                u32 v = value(i);
                if ((v & mask) == prefix) {
                    atomicAdd(&sh->hist[(v >> shift) & 255u], 1);
                }
            }
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            u32 r = rank;
            int digit = 0;
            for (int k = 0; k < 256; ++k) {
                int d = descending ? 255 - k : k;
                u32 count = (u32)sh->hist[d];
                if (r < count) {
                    digit = d;
                    break;
                }
                r -= count;
            }
            sh->prefix = prefix | ((u32)digit << shift);
            sh->rank = r;
            sh->count = (u32)sh->hist[digit];
        }
        __syncthreads();
        prefix = sh->prefix;
        rank = sh->rank;
        mask |= 255u << shift;
        __syncthreads(); // everyone has read before the next pass writes
    }
    return prefix;
}

extern "C" __global__ void sample_rows(const float* logits, const RowSampling* params,
                                       int vocab, int* tokens) {
    __shared__ SelectShared sel;
    __shared__ int iscratch[32];
    __shared__ float fscratch[32];
    __shared__ double chunk_prefix[SAMPLE_THREADS + 1];
    __shared__ double digit_scratch[SAMPLE_THREADS / 32][TOP_P_DIGITS];
    __shared__ double digit_mass[TOP_P_DIGITS];
    i64 row = blockIdx.x;
    const float* x = logits + row * (i64)vocab;
    RowSampling p = params[row];

    // The maximum, and whether the row holds a NaN or +inf (-inf is a token that cannot be
    // chosen: a processed row's suppressed one; a row of nothing else has no token).
    float m = NEG_INF;
    int bad = 0;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        float v = x[i];
        bad |= isnan(v) || (isinf(v) && v > 0.0f);
        m = fmaxf(m, v);
    }
    m = block_max_f32(m, fscratch);
    bad = block_sum_int(bad, iscratch);
    if (bad != 0 || !isfinite(m)) {
        if (threadIdx.x == 0) {
            tokens[row] = -1;
        }
        return; // uniform over the block
    }
    if (p.temperature == 0.0f) { // greedy: the lowest id of the maximum
        int first = vocab;
        for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
            if (x[i] == m) {
                first = i;
                break;
            }
        }
        first = block_min_int(first, iscratch);
        if (threadIdx.x == 0) {
            tokens[row] = first;
        }
        return;
    }
    auto key = [&](int i) { return order_key(x[i]); };
    auto all = [](int) { return true; };

    // 1. top-k: element i survives when (key, -id) ranks at or above (k_key, -k_id). When
    // every element of the boundary value is in, k_id stays past the last id.
    u32 k_key = 0;
    int k_id = vocab;
    if (p.top_k > 0 && p.top_k < vocab) {
        k_key = radix_select(vocab, key, all, (u32)(p.top_k - 1), true, &sel);
        u32 tie_rank = sel.rank;
        u32 ties = sel.count;
        __syncthreads();
        if (tie_rank + 1 < ties) {
            auto id = [](int i) { return (u32)i; };
            auto tied = [&](int i) { return key(i) == k_key; };
            k_id = (int)radix_select(vocab, id, tied, tie_rank, false, &sel);
        }
    }
    auto in_top_k = [&](int i) {
        u32 ki = key(i);
        return ki > k_key || (ki == k_key && i <= k_id);
    };
    double t = (double)p.temperature;
    double md = (double)m;
    auto weight = [&](int i) { return exp(((double)x[i] - md) / t); };

    // 2.-3. top-p: the boundary (p_key, p_id) in the same order, where p_key is the largest
    // key K with mass(key >= K) >= top_p * total, found TOP_P_DIGIT_BITS at a time from the
    // top: each pass sums the weights of the elements whose key agrees with the bits found
    // so far by their next digit, and keeps the largest digit whose mass, with that of
    // every element already known to rank above, reaches the threshold. The first pass
    // sees every top-k survivor, so its digit sums also give the total.
    u32 p_key = 0;
    int p_id = vocab;
    if (p.top_p < 1.0f) {
        double threshold = 0.0;
        double higher = 0.0; // the mass of the elements known to rank above `found`
        u32 found = 0;
        for (int shift = 32 - TOP_P_DIGIT_BITS; shift >= 0; shift -= TOP_P_DIGIT_BITS) {
            u32 decided = shift + TOP_P_DIGIT_BITS >= 32 ? 0u : ~0u << (shift + TOP_P_DIGIT_BITS);
            double mass[TOP_P_DIGITS];
#pragma unroll
            for (int d = 0; d < TOP_P_DIGITS; ++d) {
                mass[d] = 0.0;
            }
            for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
                u32 ki = key(i);
                if ((ki & decided) == found && in_top_k(i)) {
                    double w = weight(i);
                    u32 digit = (ki >> shift) & (TOP_P_DIGITS - 1);
#pragma unroll
                    for (int d = 0; d < TOP_P_DIGITS; ++d) { // registers, not a local array
                        mass[d] += digit == (u32)d ? w : 0.0;
                    }
                }
            }
            block_sums_digits(mass, digit_scratch, digit_mass);
            if (shift + TOP_P_DIGIT_BITS >= 32) {
                double total = 0.0;
                for (int d = 0; d < TOP_P_DIGITS; ++d) {
                    total += digit_mass[d];
                }
                threshold = (double)p.top_p * total;
            }
            // Digit 0 is what is left when no larger one reaches the threshold (only
            // rounding can make the mass of all of `found`'s elements fall short of it).
            u32 digit = 0;
            double run = higher;
            for (int d = TOP_P_DIGITS - 1; d > 0; --d) {
                double with = run + digit_mass[d];
                if (with >= threshold) {
                    digit = (u32)d;
                    break;
                }
                run = with;
            }
            higher = run;
            found |= digit << shift;
        }
        p_key = found;
        // The elements of the boundary value, added one at a time in id order as a
        // sequential walk adds them, until the mass reaches the threshold.
        int ties = 0;
        for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
            ties += (int)(key(i) == p_key && in_top_k(i));
        }
        ties = block_sum_int(ties, iscratch);
        if (ties > 0) { // p_key is a survivor's key unless rounding moved it past one
            double w = exp(((double)value_of_key(p_key) - md) / t);
            int needed = 0;
            double a = higher;
            while (needed < ties) {
                a += w;
                needed += 1;
                if (a >= threshold) {
                    break;
                }
            }
            if (needed < ties) {
                auto id = [](int i) { return (u32)i; };
                auto tied = [&](int i) { return in_top_k(i) && key(i) == p_key; };
                p_id = (int)radix_select(vocab, id, tied, (u32)(needed - 1), false, &sel);
            }
        }
    }
    auto survives = [&](int i) {
        if (!in_top_k(i)) {
            return false;
        }
        u32 ki = key(i);
        if (!(ki > p_key || (ki == p_key && i <= p_id))) {
            return false;
        }
        return p.min_p <= 0.0f || weight(i) >= (double)p.min_p;
    };

    // 4. The draw, in id order: thread j owns ids [j * per, (j + 1) * per).
    int per = (vocab + blockDim.x - 1) / blockDim.x;
    int lo = min(vocab, (int)threadIdx.x * per);
    int hi = min(vocab, lo + per);
    double local = 0.0;
    int last = -1;
    for (int i = lo; i < hi; ++i) {
        if (survives(i)) {
            double w = weight(i);
            if (w > 0.0) {
                local += w;
                last = i;
            }
        }
    }
    __syncthreads();
    chunk_prefix[threadIdx.x + 1] = local;
    __syncthreads();
    if (threadIdx.x == 0) {
        chunk_prefix[0] = 0.0;
        for (int j = 1; j <= (int)blockDim.x; ++j) {
            chunk_prefix[j] = chunk_prefix[j - 1] + chunk_prefix[j];
        }
    }
    __syncthreads();
    double before = chunk_prefix[threadIdx.x];
    double target = p.uniform * chunk_prefix[blockDim.x];
    int chosen = vocab;
    if (before <= target) {
        double run = 0.0;
        for (int i = lo; i < hi; ++i) {
            if (survives(i)) {
                double w = weight(i);
                if (w > 0.0) {
                    run += w;
                    if (before + run > target) {
                        chosen = i;
                        break;
                    }
                }
            }
        }
    }
    chosen = block_min_int(chosen, iscratch);
    if (chosen == vocab) { // rounding never passed the target: the last survivor
        chosen = -block_min_int(-last, iscratch);
    }
    if (threadIdx.x == 0) {
        tokens[row] = chosen;
    }
}

#define TOP_LOGITS_MAX 20 // the most a row may ask for (MAX_TOP_LOGPROBS on the host)

// The counts[row] (at most TOP_LOGITS_MAX) largest logits of each row, largest first, ties
// to the lower id (values in their total order), as ids and values in the row's
// TOP_LOGITS_MAX slots of `ids` and `values`; nothing for a row whose count is 0. Grid:
// rows; block: SAMPLE_THREADS threads.
extern "C" __global__ void top_logits(const float* logits, const int* counts, int vocab,
                                      int* ids, float* values) {
    __shared__ SelectShared sel;
    __shared__ int found[TOP_LOGITS_MAX];
    __shared__ int num_found;
    i64 row = blockIdx.x;
    int n = min(min(counts[row], TOP_LOGITS_MAX), vocab);
    if (n <= 0) {
        return; // uniform over the block
    }
    const float* x = logits + row * (i64)vocab;
    auto key = [&](int i) { return order_key(x[i]); };
    auto all = [](int) { return true; };
    // The n-th largest (key, -id): every element ranked at or above it is a result.
    u32 k_key = radix_select(vocab, key, all, (u32)(n - 1), true, &sel);
    u32 tie_rank = sel.rank;
    u32 ties = sel.count;
    __syncthreads();
    int k_id = vocab; // when every element of the boundary value is in
    if (tie_rank + 1 < ties) {
        auto id = [](int i) { return (u32)i; };
        auto tied = [&](int i) { return key(i) == k_key; };
        k_id = (int)radix_select(vocab, id, tied, tie_rank, false, &sel);
    }
    if (threadIdx.x == 0) {
        num_found = 0;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        u32 ki = key(i);
        if (ki > k_key || (ki == k_key && i <= k_id)) {
            int slot = atomicAdd(&num_found, 1);
            if (slot < TOP_LOGITS_MAX) {
                found[slot] = i;
            }
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) { // exactly n found, in whatever order the atomics gave: sort
        for (int a = 1; a < n; ++a) {
            int v = found[a];
            int b = a;
            while (b > 0 && (key(found[b - 1]) < key(v) ||
                             (key(found[b - 1]) == key(v) && found[b - 1] > v))) {
                found[b] = found[b - 1];
                --b;
            }
            found[b] = v;
        }
        for (int a = 0; a < n; ++a) {
            ids[row * TOP_LOGITS_MAX + a] = found[a];
            values[row * TOP_LOGITS_MAX + a] = x[found[a]];
        }
    }
}
