// Per-position log-probabilities from llama.cpp (libllama, built by build_llama_cpp.sh) for
// token ids given on stdin (comma-separated), evaluated in one batch with logits for every
// position. Prints one JSON object:
//   {"token_logprobs": [null, lp1, ...], "argmax": [a0, a1, ...]}
// where token_logprobs[i] = log p(tokens[i] | tokens[..i]) and argmax[i] is the most likely
// token after tokens[..=i] (tandem score's layout). Built by bench/quant_fidelity.py.
//
// usage: llama_logprobs MODEL.gguf THREADS [f32kv] < ids.txt   (f32kv: an f32 KV cache
// instead of llama.cpp's default f16, for the fp32 reference)
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "llama.h"

static void quiet(enum ggml_log_level level, const char *text, void *user) {
    (void)level; (void)text; (void)user;
}

int main(int argc, char **argv) {
    if (argc != 3 && argc != 4) {
        fprintf(stderr, "usage: %s MODEL.gguf THREADS [f32kv] < ids\n", argv[0]);
        return 2;
    }
    int cap = 1 << 16, n = 0;
    llama_token *ids = malloc(sizeof(llama_token) * cap);
    int v;
    while (n < cap && scanf("%d,", &v) == 1) ids[n++] = v;
    if (n < 2) { fprintf(stderr, "need at least 2 token ids\n"); return 2; }

    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) { fprintf(stderr, "cannot load %s\n", argv[1]); return 1; }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n; cp.n_batch = n; cp.n_ubatch = n;
    cp.n_threads = cp.n_threads_batch = atoi(argv[2]);
    if (argc == 4) cp.type_k = cp.type_v = GGML_TYPE_F32;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) { fprintf(stderr, "cannot create a context\n"); return 1; }
    const int vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

    struct llama_batch batch = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) {
        batch.token[i] = ids[i];
        batch.pos[i] = i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = 1;
    }
    batch.n_tokens = n;
    if (llama_decode(ctx, batch) != 0) { fprintf(stderr, "llama_decode failed\n"); return 1; }

    printf("{\"token_logprobs\": [null");
    int *argmax = malloc(sizeof(int) * n);
    for (int i = 0; i < n; i++) {
        const float *logits = llama_get_logits_ith(ctx, i);
        double max = logits[0];
        int best = 0;
        for (int t = 1; t < vocab; t++) if (logits[t] > max) { max = logits[t]; best = t; }
        double sum = 0;
        for (int t = 0; t < vocab; t++) sum += exp((double)logits[t] - max);
        argmax[i] = best;
        if (i + 1 < n) printf(", %.9g", (double)logits[ids[i + 1]] - max - log(sum));
    }
    printf("], \"argmax\": [");
    for (int i = 0; i < n; i++) printf(i ? ", %d" : "%d", argmax[i]);
    printf("]}\n");
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
