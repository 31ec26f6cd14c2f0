// Teacher-forced log-probabilities where the logits are: per row of logits, the maximum and
// the sum of exp(x - max) that the host's log-softmax takes (tandem_kernels::exp_sum), and
// the target's logit. The host then forms log p = x_t - (max + ln(sum)) exactly as it does
// for logits it holds, so a row's log-probability is bitwise the host's while only 16
// bytes per row cross to the host instead of the vocabulary's logits.
//
// Bitwise the host's sum: every exp is the host's polynomial in f64 with separately rounded
// operations (the __d*_rn intrinsics are never fused into multiply-adds), and the sum keeps
// the host's order: 8 partial sums, partial j adding the elements i = j (mod 8) in
// ascending order, combined as ((s0 + s4) + (s2 + s6)) + ((s1 + s5) + (s3 + s7)). Only the
// additions are sequential; the exps of a tile of the row are computed in parallel first.

#define LP_TILE 2048 // elements of a row whose exps are staged at a time (a multiple of 8)

// exp(x) for x <= 0, as tandem_kernels::exp_sum::exp_nonpositive computes it: x = k ln2 + r
// with k rounded to nearest, r reduced with a two-part ln2, e^r by its Taylor polynomial
// to degree 13 in Horner form, 2^k from its exponent bits; inputs below -708 clamped.
__device__ double exp_nonpositive(double x) {
    const double log2_e = __longlong_as_double(0x3FF71547652B82FEll);
    const double ln2_hi = __longlong_as_double(0x3FE62E42FEE00000ll);
    const double ln2_lo = __longlong_as_double(0x3DEA39EF35793C76ll);
    const double shifter = 6755399441055744.0; // 1.5 * 2^52
    // 1 / i! for i = 13, 12, ..., 2, each the correctly rounded quotient.
    const double inv_fact[12] = {
        1.0 / 6227020800.0, 1.0 / 479001600.0, 1.0 / 39916800.0, 1.0 / 3628800.0,
        1.0 / 362880.0,     1.0 / 40320.0,     1.0 / 5040.0,     1.0 / 720.0,
        1.0 / 120.0,        1.0 / 24.0,        1.0 / 6.0,        1.0 / 2.0,
    };
    if (x < -708.0) {
        x = -708.0;
    }
    double t = __dadd_rn(__dmul_rn(x, log2_e), shifter);
    double k = __dadd_rn(t, -shifter);
    double r = __dadd_rn(__dadd_rn(x, -__dmul_rn(k, ln2_hi)), -__dmul_rn(k, ln2_lo));
    double p = inv_fact[0];
#pragma unroll
    for (int i = 1; i < 12; ++i) {
        p = __dadd_rn(__dmul_rn(p, r), inv_fact[i]);
    }
    p = __dadd_rn(__dmul_rn(p, r), 1.0);
    p = __dadd_rn(__dmul_rn(p, r), 1.0);
    // t is shifter + k exactly, so the difference of the bit patterns is k (>= -1022).
    long long k_int = __double_as_longlong(t) - __double_as_longlong(shifter);
    double scale = __longlong_as_double((k_int + 1023) << 52);
    return __dmul_rn(p, scale);
}

// logits: [rows, vocab] f32; targets: [rows] or null (a negative target or null: none);
// row_max: [rows] f32; row_sum: [rows] f64 (0 when the row holds a NaN or an infinity);
// target_logit: [rows] f32.
// Grid: rows; block: LP_THREADS threads (a multiple of 32, at least 64). Warp 0's first 8
// lanes add; the other warps compute the exps of the next tile meanwhile.
// Shared memory: 2 * LP_TILE doubles (static).
#define LP_THREADS 256
extern "C" __global__ void logit_exp_sums(const float* logits, const int* targets, int vocab,
                                          float* row_max, double* row_sum,
                                          float* target_logit) {
    __shared__ double exps[2][LP_TILE];
    __shared__ float scratch[32];
    __shared__ int bad_shared;
    i64 row = blockIdx.x;
    const float* x = logits + row * (i64)vocab;
    int warp = threadIdx.x >> 5;
    int lane = threadIdx.x & 31;

    // The maximum (exact in any order) and whether every value is finite.
    float m = NEG_INF;
    int bad = 0;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        float v = x[i];
        bad |= !isfinite(v);
        m = fmaxf(m, v);
    }
    if (threadIdx.x == 0) {
        bad_shared = 0;
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
    }
    __syncthreads();
    if (lane == 0) {
        scratch[warp] = m;
    }
    if (bad) {
        atomicOr(&bad_shared, 1);
    }
    __syncthreads();
    m = NEG_INF;
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) {
        m = fmaxf(m, scratch[w]);
    }
    if (bad_shared || !isfinite(m)) {
        if (threadIdx.x == 0) {
            row_max[row] = m;
            row_sum[row] = 0.0;
            target_logit[row] = 0.0f;
        }
        return; // uniform: every thread read the same flag and maximum
    }

    // Iteration k: warps 1.. compute the exps of tile k into buffer k % 2 while lanes 0-7
    // of warp 0 add tile k - 1's from the other buffer, in the host's order.
    int tiles = (vocab + LP_TILE - 1) / LP_TILE;
    int workers = blockDim.x - 32;
    double acc = 0.0; // partial sum `lane` of lanes 0-7 of warp 0
    for (int k = 0; k <= tiles; ++k) {
        if (warp > 0 && k < tiles) {
            double* e = exps[k & 1];
            int base = k * LP_TILE;
            int len = min(LP_TILE, vocab - base);
            for (int o = threadIdx.x - 32; o < len; o += workers) {
                e[o] = exp_nonpositive((double)__fsub_rn(x[base + o], m));
            }
        }
        if (warp == 0 && lane < 8 && k > 0) {
            const double* e = exps[(k - 1) & 1];
            int len = min(LP_TILE, vocab - (k - 1) * LP_TILE);
            for (int o = lane; o < len; o += 8) {
                acc = __dadd_rn(acc, e[o]);
            }
        }
        __syncthreads();
    }
    // Lanes 0-7 of warp 0 hold s0..s7; combine them as the host does.
    double s0 = __shfl_sync(0xffffffffu, acc, 0);
    double s1 = __shfl_sync(0xffffffffu, acc, 1);
    double s2 = __shfl_sync(0xffffffffu, acc, 2);
    double s3 = __shfl_sync(0xffffffffu, acc, 3);
    double s4 = __shfl_sync(0xffffffffu, acc, 4);
    double s5 = __shfl_sync(0xffffffffu, acc, 5);
    double s6 = __shfl_sync(0xffffffffu, acc, 6);
    double s7 = __shfl_sync(0xffffffffu, acc, 7);
    if (threadIdx.x == 0) {
        double a = __dadd_rn(__dadd_rn(s0, s4), __dadd_rn(s2, s6));
        double b = __dadd_rn(__dadd_rn(s1, s5), __dadd_rn(s3, s7));
        row_max[row] = m;
        row_sum[row] = __dadd_rn(a, b);
        int t = targets != 0 ? targets[row] : -1;
        target_logit[row] = t >= 0 && t < vocab ? x[t] : 0.0f;
    }
}
