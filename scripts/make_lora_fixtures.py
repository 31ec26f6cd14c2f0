#!/usr/bin/env python3
"""Builds the LoRA adapter fixtures under crates/model/tests/fixtures/lora/.

Each fixture is a PEFT adapter of one of the Hugging Face fixtures in
crates/model/tests/fixtures/hf/, as `PeftModel.save_pretrained` writes it
(adapter_config.json, adapter_model.safetensors), with random A and B matrices (PEFT starts
B at zero, which would make the adapter a no-op), and the reference outputs of the base
model with the adapter applied, in the HF fixtures' format:

  reference.json   {"format": 1, versions, "base": the HF fixture, "sequences": [
                     {"input_ids", "logits_file", "argmax"}, ...]}
  logits_<i>.bin   logits of the base fixture's sequence i with the adapter, f32 little-endian.

The adapters cover what a loader must get right: every projection of a Llama with a
per-module rank and alpha (rank_pattern, alpha_pattern); rsLoRA's alpha / sqrt(r) on Qwen2
(q/k/v biases); q/k/v/o of Qwen3 (q/k norms) on one layer only (layers_to_transform);
every projection of Gemma 3; Phi-3's fused qkv_proj and gate_up_proj; the attention of
Mixtral (its GGUF conversion in fixtures/gguf_arch permutes q and k rows, which the adapter
must follow).

Run from the repository root: python3 scripts/make_lora_fixtures.py
Needs torch, transformers and peft. Everything is seeded.
"""

import json
import os

import peft
import torch
import transformers
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

HF = os.path.join("crates", "model", "tests", "fixtures", "hf")
OUT = os.path.join("crates", "model", "tests", "fixtures", "lora")
LORA_STD = 0.2

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
FIXTURES = {
    "llama_tied": dict(
        r=4,
        lora_alpha=8,
        target_modules=ALL,
        rank_pattern={"down_proj": 2},
        alpha_pattern={"o_proj": 3},
    ),
    "qwen2": dict(r=4, lora_alpha=6, target_modules=["q_proj", "k_proj", "v_proj"], use_rslora=True),
    "qwen3": dict(
        r=3,
        lora_alpha=5,
        target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
        layers_to_transform=[1],
    ),
    "gemma3": dict(r=4, lora_alpha=4, target_modules=ALL),
    "phi3": dict(
        r=4, lora_alpha=8, target_modules=["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]
    ),
    "mixtral": dict(r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
}


def randomize_lora(model, seed):
    g = torch.Generator().manual_seed(seed)
    n = 0
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                p.copy_(LORA_STD * torch.randn(p.shape, generator=g))
                n += 1
    assert n > 0


@torch.no_grad()
def logits_of(model, seqs):
    model.eval()
    return [model(torch.tensor([ids])).logits[0].float().contiguous() for ids in seqs]


def build(name, options, seed):
    base_dir = os.path.join(HF, name)
    with open(os.path.join(base_dir, "reference.json")) as f:
        seqs = [s["input_ids"] for s in json.load(f)["sequences"]]
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    plain = logits_of(base, seqs)
    model = get_peft_model(base, LoraConfig(lora_dropout=0.0, **options))
    randomize_lora(model, seed)
    adapted = logits_of(model, seqs)
    # The adapter must change the logits, or a loader that ignores it would pass.
    assert all((a - p).abs().max() > 0.05 for a, p in zip(adapted, plain))
    out_dir = os.path.join(OUT, name)
    os.makedirs(out_dir, exist_ok=True)
    model.save_pretrained(out_dir)
    sequences = []
    for i, (ids, lg) in enumerate(zip(seqs, adapted)):
        fname = f"logits_{i}.bin"
        with open(os.path.join(out_dir, fname), "wb") as f:
            f.write(lg.numpy().astype("<f4").tobytes())
        sequences.append({"input_ids": ids, "logits_file": fname, "argmax": lg.argmax(-1).tolist()})
    ref = {
        "format": 1,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "peft_version": peft.__version__,
        "base": name,
        "logits_encoding": "f32le",
        "sequences": sequences,
    }
    with open(os.path.join(out_dir, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    # save_pretrained writes a README.md model card; the fixture does not need it.
    card = os.path.join(out_dir, "README.md")
    if os.path.exists(card):
        os.remove(card)
    print(f"{name}: max |Δlogit| from the base model {max((a - p).abs().max().item() for a, p in zip(adapted, plain)):.3f}")


def main():
    for seed, (name, options) in enumerate(FIXTURES.items()):
        build(name, options, 1000 + seed)


if __name__ == "__main__":
    main()
