#!/usr/bin/env python3
"""How far tandem's f32 paths and torch's f32 forward each are from a float64 forward of
the same weights (run on the GPU machine after scripts/gpu_check.sh made the model and
tandem's CUDA scores):

    gpu_f64_check.py MODELS_DIR OUTDIR NAME TANDEM_BIN

Reads MODELS_DIR/<NAME>-f32 (weights), MODELS_DIR/ref_<NAME>.json (sequences, torch f32
logprobs) and OUTDIR/cuda_<NAME>_f32.json (tandem CUDA f32); scores the last sequence with
tandem's exact CPU path (`--device cpu --kernels avx2`) too; prints mean/max |Δlogprob| of
each against torch float64 (TF32 off; transformers computes RoPE angles in f32 in every
dtype, so the f64 forward differs from exact only there).
"""
import json
import subprocess
import sys

import torch
from transformers import AutoModelForCausalLM

models, out, name, tandem = sys.argv[1:5]
torch.backends.cuda.matmul.allow_tf32 = False
ref = json.load(open(f"{models}/ref_{name}.json"))
seqs = ref["tokens"]
model = AutoModelForCausalLM.from_pretrained(
    f"{models}/{name}-f32", dtype=torch.float64, attn_implementation="eager").cuda().eval()
f64 = []
with torch.no_grad():
    for s in seqs:
        ids = torch.tensor([s], device="cuda")
        lp = torch.log_softmax(model(ids).logits[0, :-1].double(), dim=-1)
        f64.append(lp.gather(1, ids[0, 1:, None])[:, 0].cpu().tolist())


def diff(a, b):
    d = [abs(x - y) for sa, sb in zip(a, b) for x, y in zip(sa, sb)]
    return f"mean {sum(d) / len(d):.2e} max {max(d):.2e} ({len(d)} positions)"


cuda = json.load(open(f"{out}/cuda_{name}_f32.json"))["logprobs"]
print(f"{name}: torch f32 vs torch f64: {diff(ref['f32_logprobs'], f64)}")
print(f"{name}: tandem cuda f32 vs torch f64: {diff(cuda, f64)}")
print(f"{name}: tandem cuda f32 vs torch f32: {diff(cuda, ref['f32_logprobs'])}")
last = seqs[-1]
cpu = subprocess.run(
    [tandem, "score", "--model", f"{models}/{name}-f32", "--device", "cpu", "--kernels", "avx2",
     "--tokens", ",".join(map(str, last)), "--json"],
    capture_output=True, text=True, check=True)
cpu_lp = json.loads(cpu.stdout)["token_logprobs"][1:]
print(f"{name}, last sequence: tandem cpu exact vs torch f64: {diff([cpu_lp], [f64[-1]])}")
print(f"{name}, last sequence: torch f32 vs torch f64: {diff([ref['f32_logprobs'][-1]], [f64[-1]])}")
print(f"{name}, last sequence: tandem cuda f32 vs torch f64: {diff([cuda[-1]], [f64[-1]])}")
