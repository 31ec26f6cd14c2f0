#!/usr/bin/env python3
"""The CUDA speed issue's goals table, from one run of scripts/gpu_speed_check.sh.

    python3 scripts/gpu_goals.py OUTDIR [MODEL_CONFIG_JSON]

Reads OUTDIR/speed.txt (`tandem bench` and transformers JSON lines), OUTDIR/peak.json
(scripts/gpu_peak.py), OUTDIR/profile_llama3.2-1b.json (`cuda_score profile`) and
OUTDIR/serve.txt (bench/serve_load.py), and prints a Markdown table: each workload, what was
measured, the goal, and whether it is met. A figure that is missing says so.

The HBM roofline of a decode step is its bytes (weights + the KV read, as `tandem bench`
counts them in `decode_total_gb_per_s`) over 4.8 TB/s, the H200's HBM rate; the measured copy
rate of the same device is shown beside it. The prefill goal counts the layers' matrix
products, 2 x their weights FLOPs per token, from MODEL_CONFIG_JSON (default: the 1B shape's
config.json that scripts/make_gpu_models.py wrote); the attention's products (~7 % more at
2,048 tokens) and the LM head of the last rows are not credited.
"""
import json
import os
import sys

from gpu_compare import load  # a JSON file, or None

HBM_GB_PER_S = 4800.0


def lines(path):
    try:
        with open(path) as f:
            return [json.loads(x) for x in f if x.strip().startswith("{")]
    except OSError:
        return []


def find(rows, **want):
    for r in rows:
        if all(r.get(k) == v for k, v in want.items()):
            return r
    return None


def layer_flop_per_token(config_path):
    c = load(config_path)
    if not c:
        return None
    h, layers = c["hidden_size"], c["num_hidden_layers"]
    head_dim = c.get("head_dim") or h // c["num_attention_heads"]
    q_dim, kv_dim = c["num_attention_heads"] * head_dim, c["num_key_value_heads"] * head_dim
    weights = h * (2 * q_dim + 2 * kv_dim) + 3 * h * c["intermediate_size"]
    return 2 * weights * layers


def goals(out, config_path):
    speed = lines(os.path.join(out, "speed.txt"))
    peak = (lines(os.path.join(out, "peak.json")) or [None])[0]
    profile = load(os.path.join(out, "profile_llama3.2-1b.json")) or {}
    serve = find(lines(os.path.join(out, "serve.txt")), concurrency=64)
    rows = []

    b1 = find(speed, label="new", batch=1)
    if b1:
        share = b1["decode_total_gb_per_s"] / HBM_GB_PER_S
        copy = f", {b1['decode_total_gb_per_s'] / peak['copy_traffic_gb_per_s']:.0%} of the measured copy rate" if peak else ""
        rows.append(("single-stream decode, 1B shape, 128 after 512",
                     f"{b1['decode_tok_per_s']:.0f} tok/s, {b1['decode_total_gb_per_s']:.0f} GB/s: "
                     f"{share:.0%} of the HBM roofline{copy}", ">= 70 %", share >= 0.70))
    else:
        rows.append(("single-stream decode, 1B shape", "missing", ">= 70 %", None))

    small = find(speed, label="new-135m", batch=1)
    rows.append(("single-stream decode, 135M shape",
                 f"{small['decode_tok_per_s']:.0f} tok/s" if small else "missing",
                 ">= 2,000 tok/s", small["decode_tok_per_s"] >= 2000 if small else None))

    b256 = find(speed, label="new", batch=256)
    hf = find(speed, engine="transformers-static", batch=256)
    if b256 and hf:
        ratio = b256["decode_tok_per_s"] / hf["decode_tok_per_s"]
        rows.append(("batched decode, 1B shape, 256 x 128 after 512",
                     f"{b256['decode_tok_per_s']:.0f} tok/s vs transformers static "
                     f"{hf['decode_tok_per_s']:.0f}: {ratio:.1f}x", ">= 10x", ratio >= 10))
    else:
        rows.append(("batched decode, 1B shape, 256",
                     f"tandem {b256['decode_tok_per_s']:.0f} tok/s, transformers missing" if b256
                     else "missing", ">= 10x", None))

    flop_per_token = layer_flop_per_token(config_path)
    # The prefill and scoring goals with the attention of prompts on CUDA cores (the
    # default), then on tensor cores (--tensor-core-attention), when the run measured it.
    for key, how in (("prefill_8x2048", ""), ("prefill_8x2048_tensor_cores", ", tensor-core attention")):
        pre = profile.get(key)
        if pre is None and how:
            continue
        pre = pre or {}
        if pre.get("prefill_tok_s") and flop_per_token and peak:
            tflops = pre["prefill_tok_s"] * flop_per_token / 1e12
            share = tflops / peak["bf16_matmul_tflop_per_s"]
            rows.append((f"prefill, 1B shape, 8 x 2,048{how}",
                         f"{pre['prefill_tok_s']:.0f} tok/s, {tflops:.0f} TFLOP/s: {share:.0%} of the "
                         f"measured {peak['bf16_matmul_tflop_per_s']:.0f}", ">= 50 %", share >= 0.5))
        else:
            rows.append((f"prefill, 1B shape, 8 x 2,048{how}", "missing", ">= 50 %", None))

        if pre.get("scoring_tok_s") and pre.get("prefill_tok_s"):
            ratio = pre["scoring_tok_s"] / pre["prefill_tok_s"]
            rows.append((f"scoring 32 x 2,048, all positions' logprobs{how}",
                         f"{pre['scoring_tok_s']:.0f} tok/s: {ratio:.2f} x the prefill rate",
                         ">= 0.8 x prefill", ratio >= 0.8))
        else:
            rows.append((f"scoring 32 x 2,048{how}", "missing", ">= 0.8 x prefill", None))

    b64 = find(speed, label="new", batch=64)
    if serve and b64:
        step_s = 64 / b64["decode_tok_per_s"]
        ok = serve["itl_p50"] <= 2 * step_s
        rows.append(("server, 1B shape, 64 streams, 512 in, 256 out",
                     f"TTFT p50 {serve['ttft_p50'] * 1e3:.0f} / p99 {serve['ttft_p99'] * 1e3:.0f} ms, "
                     f"ITL p50 {serve['itl_p50'] * 1e3:.1f} / p99 {serve['itl_p99'] * 1e3:.1f} ms, "
                     f"{serve['out_tok_per_s']:.0f} tok/s out; bench B=64 step {step_s * 1e3:.1f} ms "
                     f"(prompts {serve.get('prompt_tokens_mean') or 0:.0f} tokens)",
                     "ITL p50 <= 2 x step", ok))
    else:
        rows.append(("server, 1B shape, 64 streams", "missing", "ITL p50 <= 2 x step", None))

    verdict = {True: "met", False: "not met", None: "not measured"}
    text = ["| workload | measured | goal | |", "| --- | --- | --- | --- |"]
    text += [f"| {w} | {m} | {g} | {verdict[ok]} |" for w, m, g, ok in rows]
    if peak:
        text.append(f"\nDevice: {peak['device']}; bf16 products {peak['bf16_matmul_tflop_per_s']:.0f} "
                    f"TFLOP/s, device copies {peak['copy_traffic_gb_per_s']:.0f} GB/s of traffic.")
    return "\n".join(text)


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    default = "/tmp/tandem-gpu-models/llama3.2-1b-bf16/config.json"
    print(goals(sys.argv[1], sys.argv[2] if len(sys.argv) == 3 else default))
