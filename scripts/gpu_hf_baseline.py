"""transformers `generate` on the GPU, the baseline tandem-cuda is compared with (used by
scripts/gpu_cli_check.sh and gpu_speed_check.sh): random prompts of 512 tokens, then new
tokens with EOS ignored, with the dynamic or the static KV cache; one JSON line per
configuration.

    python3 scripts/gpu_hf_baseline.py MODEL_DIR [BATCHES [CACHES [NEW_TOKENS]]]

BATCHES is a comma-separated list (default 1,32), CACHES likewise (default dynamic,static),
NEW_TOKENS defaults to 64. The warm-up generates as many tokens as the timed run, so that
the static cache's compiled step (its shapes are the cache's length) is not compiled again
inside the timed run.
"""
import json
import sys
import time

import torch
from transformers import AutoModelForCausalLM

path = sys.argv[1]
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).cuda().eval()
vocab = model.config.vocab_size
batches = [int(b) for b in (sys.argv[2] if len(sys.argv) > 2 else "1,32").split(",")]
caches = (sys.argv[3] if len(sys.argv) > 3 else "dynamic,static").split(",")
new_tokens = int(sys.argv[4]) if len(sys.argv) > 4 else 64
for cache in caches:
    for b in batches:
        ids = torch.randint(0, vocab - 1, (b, 512), device="cuda",
                            generator=torch.Generator("cuda").manual_seed(0))
        kw = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                  pad_token_id=0)
        if cache == "static":
            kw["cache_implementation"] = "static"
        with torch.no_grad():
            model.generate(ids, **kw)  # warm-up, the same shapes
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            model(ids)
            torch.cuda.synchronize()
            prefill = time.perf_counter() - t0
            t0 = time.perf_counter()
            model.generate(ids, **kw)
            torch.cuda.synchronize()
            total = time.perf_counter() - t0
        decode = max(total - prefill, 1e-9)
        print(json.dumps({"engine": f"transformers-{cache}", "batch": b, "prompt_len": 512,
                          "gen_len": new_tokens, "prefill_tok_per_s": b * 512 / prefill,
                          "decode_tok_per_s": b * new_tokens / decode}))
