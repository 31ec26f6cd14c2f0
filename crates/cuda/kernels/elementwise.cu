// Small element-wise kernels: the embedding gather, the gated activation of the MLP, the
// gather of stored final hidden states for the LM head and the logits' soft cap. One
// thread block per row, threads stride the row; the activation spreads each row over
// several blocks (a decode step has only a few long rows).

// table: [vocab, width] act_t; tokens: [n]; x: [n, width] f32 = the rows times `scale`
// (1, or Gemma's sqrt(hidden size)).
extern "C" __global__ void embed_gather(const act_t* table, const int* tokens, float* x,
                                        int width, float scale) {
    i64 row = blockIdx.x;
    i64 src = (i64)tokens[row] * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        x[row * width + i] = load_act(table, src + i) * scale;
    }
}

// gate_up: [n, 2 * ff] f32, gate in the first half of a row, up in the second;
// out: [n, ff] act_t = act(gate) * up, where act is SiLU, computed as
// gate / (1 + exp(-gate)) (`gelu` 0: SwiGLU), or GELU's tanh approximation,
// 0.5 gate (1 + tanh(y)), y = sqrt(2 / pi) (gate + 0.044715 gate^3) (`gelu` 1: GeGLU),
// computed as gate / (1 + exp(-2 y)), the same function, as the CPU computes it: one
// exponential, and no cancellation where tanh(y) nears -1.
// Grid: (n rows, ceil(ff / blockDim.x)); one element per thread.
extern "C" __global__ void gated_activation(const float* gate_up, act_t* out, int ff,
                                            int gelu) {
    i64 row = blockIdx.x;
    int i = blockIdx.y * blockDim.x + threadIdx.x;
    if (i >= ff) {
        return;
    }
    const float* g = gate_up + row * 2 * ff;
    float x = g[i];
    float a;
    if (gelu) {
        float two_y = 1.5957692f * (x + 0.044715f * x * x * x);
        a = x / (1.0f + expf(-two_y));
    } else {
        a = x / (1.0f + expf(-x));
    }
    store_act(out, row * ff + i, a * g[ff + i]);
}

// x: [n, width] f32 = cap * tanh(x / cap) (`final_logit_softcapping`), in place.
// Grid: (n rows, ceil(width / blockDim.x)); one element per thread.
extern "C" __global__ void soft_cap(float* x, int width, float cap) {
    int i = blockIdx.y * blockDim.x + threadIdx.x;
    if (i < width) {
        i64 at = (i64)blockIdx.x * width + i;
        x[at] = tanhf(x[at] / cap) * cap;
    }
}

// hidden_store: [num_slots, width] f32; slots: [rows]; out: [rows, width] act_t. Rows past
// `rows` of `out` (padding up to the LM head's fixed tile) are zeroed by the caller.
extern "C" __global__ void gather_hidden(const float* hidden_store, const i64* slots,
                                         act_t* out, int width) {
    i64 row = blockIdx.x;
    const float* src = hidden_store + slots[row] * width;
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        store_act(out, row * width + i, src[i]);
    }
}

// The tokens an overlapped step carries from the step before (`launched_steps.rs`): for
// each of `count` triples (row, from_output, output), tokens[row] = picks[from_output],
// where a negative pick (a row the step before could not draw) reads as token 0, and
// carried[output] = that pick as drawn: the token the row's penalties count once more
// (processing.cu); every other of the step's `outputs` output rows gets -1. picks: that
// step's [output rows] tokens as `sample_rows` wrote them; triples: [count, 3]. One block:
// threads stride the outputs, then the triples; rows and outputs are distinct, so no two
// threads write one value.
extern "C" __global__ void carry_tokens(int* tokens, const int* picks, const int* triples,
                                        int count, int* carried, int outputs) {
    for (int i = threadIdx.x; i < outputs; i += blockDim.x) {
        carried[i] = -1;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < count; i += blockDim.x) {
        int pick = picks[triples[3 * i + 1]];
        tokens[triples[3 * i]] = pick < 0 ? 0 : pick;
        carried[triples[3 * i + 2]] = pick;
    }
}
