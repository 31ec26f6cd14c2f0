// The mixture-of-experts MLP (Mixtral, Qwen3-MoE), as the CPU computes it
// (tandem_model::transformer::moe): the router's scores of every expert, a softmax, the k
// heaviest experts (ties to the lower index), their weights divided by their sum where the
// model says so; then each (token, chosen expert) pair, a "route", runs that expert's gated
// MLP on the token's normed row; each token adds its routes' outputs times their weights in
// ascending expert order.
//
// The experts' products run per route (expert_matvec): a warp computes one output of one
// route, its lanes striding the row in a fixed order, so a route's result depends only on
// its own row and expert, never on the batch — at the cost of reading an expert once per
// route that chose it, not once per step (a decode step at batch 1 reads exactly its
// experts; larger batches read some twice).

// scores: [n, num_experts] f32; experts: [n, k] i32 and weights: [n, k] f32, heaviest
// first. Grid: n blocks of 32 threads; the first thread routes the block's token (k is
// small: 2 to 10 in released models).
extern "C" __global__ void moe_route(const float* scores, int* experts, float* weights,
                                     int num_experts, int k, int normalize) {
    if (threadIdx.x != 0) {
        return;
    }
    const float* s = scores + (i64)blockIdx.x * num_experts;
    int* ex = experts + (i64)blockIdx.x * k;
    float* w = weights + (i64)blockIdx.x * k;
    float max = NEG_INF;
    for (int e = 0; e < num_experts; ++e) {
        max = fmaxf(max, s[e]);
    }
    float sum = 0.0f;
    for (int e = 0; e < num_experts; ++e) {
        sum += expf(s[e] - max);
    }
    for (int j = 0; j < k; ++j) {
        ex[j] = -1;
        w[j] = NEG_INF;
    }
    // Insertion into the k best so far; a NaN weight ranks last but still fills an empty
    // slot.
    for (int e = 0; e < num_experts; ++e) {
        float weight = expf(s[e] - max) / sum;
        float rank = weight != weight ? NEG_INF : weight;
        int pos = 0;
        while (pos < k && !(rank > w[pos] || ex[pos] < 0)) {
            ++pos;
        }
        if (pos == k) {
            continue;
        }
        for (int j = k - 1; j > pos; --j) {
            ex[j] = ex[j - 1];
            w[j] = w[j - 1];
        }
        ex[pos] = e;
        w[pos] = weight;
    }
    if (normalize) {
        float total = 0.0f;
        for (int j = 0; j < k; ++j) {
            total += w[j];
        }
        for (int j = 0; j < k; ++j) {
            w[j] /= total;
        }
    }
}

// y[r, j] = x[r / per_token] · W[experts[r]][j] for every route r and output j < m:
// x: [rows / per_token, width] act_t (per_token = k: the tokens' normed rows, shared by
// their routes; 1: one row per route); W: [num_experts, m, width] act_t; y: [rows, m] f32.
// Grid: (rows, ceil(m / 8)); block: 256 threads, warp w computing output j = 8 y + w: lane
// l takes elements l, l + 32, ... of the row, then the lanes' sums are added in a fixed
// tree.
extern "C" __global__ void expert_matvec(const act_t* x, const act_t* w, const int* experts,
                                         float* y, int per_token, int m, int width) {
    int lane = threadIdx.x & 31;
    int j = blockIdx.y * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (j >= m) {
        return; // a whole warp: no warp-level operation follows for it
    }
    i64 r = blockIdx.x;
    i64 xrow = r / per_token * (i64)width;
    i64 wrow = ((i64)experts[r] * m + j) * (i64)width;
    float acc = 0.0f;
    for (int i = lane; i < width; i += 32) {
        acc += load_act(x, xrow + i) * load_act(w, wrow + i);
    }
    acc = warp_sum(acc);
    if (lane == 0) {
        y[r * m + j] = acc;
    }
}

// out[t] = sum over token t's k routes, in ascending expert order, of weight * y[route]:
// y: [n * k, width] f32 (route t * k + j); experts, weights: [n, k]; out: [n, width] f32.
// Grid: n blocks; threads stride the row.
extern "C" __global__ void moe_combine(const float* y, const int* experts, const float* weights,
                                       float* out, int k, int width) {
    i64 t = blockIdx.x;
    const int* ex = experts + t * k;
    const float* w = weights + t * k;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        float acc = 0.0f;
        int prev = -1;
        for (int step = 0; step < k; ++step) {
            // The route of the next expert above `prev` (a token's experts are distinct).
            int best = -1;
            for (int j = 0; j < k; ++j) {
                if (ex[j] > prev && (best < 0 || ex[j] < ex[best])) {
                    best = j;
                }
            }
            if (best < 0) {
                break; // not reached: moe_route fills every slot with a distinct expert
            }
            prev = ex[best];
            acc += w[best] * y[(t * k + best) * (i64)width + i];
        }
        out[t * width + i] = acc;
    }
}
