"""transformers `generate` on the GPU, the baseline tandem-cuda is compared with (used by
scripts/gpu_cli_check.sh): batch 1 and 32, random prompts of 512 tokens, 64 new tokens
(EOS ignored), eager and static KV cache; one JSON line per configuration.

    python3 scripts/gpu_hf_baseline.py MODEL_DIR [BATCHES [CACHES]]

BATCHES is a comma-separated list (default 1,32), CACHES likewise (default dynamic,static).
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
for cache in caches:
    for b in batches:
        ids = torch.randint(0, vocab - 1, (b, 512), device="cuda",
                            generator=torch.Generator("cuda").manual_seed(0))
        kw = dict(max_new_tokens=64, min_new_tokens=64, do_sample=False, pad_token_id=0)
        if cache == "static":
            kw["cache_implementation"] = "static"
        with torch.no_grad():
            model.generate(ids, **{**kw, "max_new_tokens": 2, "min_new_tokens": 2})  # warm-up
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
                          "gen_len": 64, "prefill_tok_per_s": b * 512 / prefill,
                          "decode_tok_per_s": b * 64 / decode}))
