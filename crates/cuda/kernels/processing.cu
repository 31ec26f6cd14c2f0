// The logit processors of rows sampled where the logits are (tandem_model's
// logit_processing is the reference): each row lists the tokens whose logit its request's
// logit bias, min_tokens suppression, repetition penalty and presence and frequency
// penalties change, and process_rows rewrites those logits in place before sample_rows
// draws, saving the raw ones; restore_rows puts them back, so that the raw row's
// log-probabilities (logit_exp_sums) and top tokens are read afterwards from the same
// buffer. Every operation is a separately rounded f64 one (no fused multiply-add), then
// one rounding to f32, as on the host.
//
// A row whose input token was carried from the previous step's pick (overlapped steps)
// had its list made before that token was known; `carried[row]` (when given) names the
// token, and it counts once more for the penalties: as the list made after it would say
// (tandem_model's LogitProcessing::with_output), its entry is seen (repetition penalty)
// and one occurrence more (presence and frequency), or, when the list lacks it, it is
// processed as an entry of its own whose raw logit goes to `carried_saved[row]`.
//
// Grid: rows; block: any number of threads (each takes every blockDim.x-th token of the
// row's list; thread 0 the carried token when it is not listed). A row's list holds each
// id once, so no two threads touch the same logit.

struct RowProcessing {
    float repetition_penalty; // > 0; 1 is neutral
    float presence_penalty;
    float frequency_penalty;
    int begin; // the row's tokens: [begin, end) of the token list
    int end;
    int pad;
};

#define ADJUST_SEEN 1u
#define ADJUST_SUPPRESSED 2u

struct TokenAdjustment {
    double bias; // added to the raw logit
    u32 id;
    u32 count; // occurrences in the output
    u32 flags; // ADJUST_SEEN, ADJUST_SUPPRESSED
    u32 pad;
};

// The byte layouts row_kernels.rs writes (append_processing).
static_assert(sizeof(RowProcessing) == 24, "RowProcessing is 24 bytes");
static_assert(sizeof(TokenAdjustment) == 24, "TokenAdjustment is 24 bytes");

// The processed logit of token `t` whose raw logit is `raw`.
__device__ float processed_logit(const RowProcessing& p, const TokenAdjustment& t, float raw) {
    if (t.flags & ADJUST_SUPPRESSED) {
        return NEG_INF;
    }
    double v = __dadd_rn((double)raw, t.bias);
    if (t.flags & ADJUST_SEEN) {
        double r = (double)p.repetition_penalty;
        v = v > 0.0 ? __ddiv_rn(v, r) : __dmul_rn(v, r);
    }
    if (t.count > 0) {
        double penalty = __dadd_rn((double)p.presence_penalty,
                                   __dmul_rn((double)p.frequency_penalty, (double)t.count));
        v = __dsub_rn(v, penalty);
    }
    if (isfinite(v)) { // finite results are clamped to f32's range
        v = fmin(fmax(v, -3.4028234663852886e38), 3.4028234663852886e38);
    }
    return (float)v;
}

// The token a row's penalties count once more (see above), or -1: none carried, a carried
// pick that failed (negative) or one outside the vocabulary, or no penalty to count it.
__device__ int counted_carry(const RowProcessing& p, const int* carried, int vocab) {
    int c = carried ? carried[blockIdx.x] : -1;
    bool penalised = p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f ||
                     p.frequency_penalty != 0.0f;
    return penalised && c >= 0 && c < vocab ? c : -1;
}

// Whether `id` is in the row's (ascending) list.
__device__ bool listed(const TokenAdjustment* tokens, int begin, int end, u32 id) {
    while (begin < end) {
        int mid = begin + (end - begin) / 2;
        u32 m = tokens[mid].id;
        if (m == id) {
            return true;
        }
        if (m < id) {
            begin = mid + 1;
        } else {
            end = mid;
        }
    }
    return false;
}

// `t` with the carried token `c` counted once more when it is `t`'s token.
__device__ TokenAdjustment with_carry(const RowProcessing& p, TokenAdjustment t, int c) {
    if (c >= 0 && t.id == (u32)c) {
        if (p.repetition_penalty != 1.0f) {
            t.flags |= ADJUST_SEEN;
        }
        if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
            t.count += 1;
        }
    }
    return t;
}

// logits: [rows, vocab] f32, processed in place; saved: one f32 per listed token;
// carried: [rows] i32 or null; carried_saved: [rows] f32 (with carried).
extern "C" __global__ void process_rows(float* logits, const RowProcessing* rows,
                                        const TokenAdjustment* tokens, float* saved,
                                        const int* carried, float* carried_saved, int vocab) {
    RowProcessing p = rows[blockIdx.x];
    float* x = logits + (i64)blockIdx.x * vocab;
    int c = counted_carry(p, carried, vocab);
    for (int e = p.begin + (int)threadIdx.x; e < p.end; e += blockDim.x) {
        TokenAdjustment t = with_carry(p, tokens[e], c);
        float raw = x[t.id];
        saved[e] = raw;
        x[t.id] = processed_logit(p, t, raw);
    }
    if (threadIdx.x == 0 && c >= 0 && !listed(tokens, p.begin, p.end, (u32)c)) {
        TokenAdjustment t = with_carry(p, TokenAdjustment{0.0, (u32)c, 0u, 0u, 0u}, c);
        float raw = x[c];
        carried_saved[blockIdx.x] = raw;
        x[c] = processed_logit(p, t, raw);
    }
}

// Undoes process_rows with the same arguments.
extern "C" __global__ void restore_rows(float* logits, const RowProcessing* rows,
                                        const TokenAdjustment* tokens, const float* saved,
                                        const int* carried, const float* carried_saved,
                                        int vocab) {
    RowProcessing p = rows[blockIdx.x];
    float* x = logits + (i64)blockIdx.x * vocab;
    for (int e = p.begin + (int)threadIdx.x; e < p.end; e += blockDim.x) {
        x[tokens[e].id] = saved[e];
    }
    int c = counted_carry(p, carried, vocab);
    if (threadIdx.x == 0 && c >= 0 && !listed(tokens, p.begin, p.end, (u32)c)) {
        x[c] = carried_saved[blockIdx.x];
    }
}
