#!/usr/bin/env python3
"""Writes a random PEFT LoRA adapter of a given model shape, to measure what adapters cost
(`tandem bench --lora-modules NAME=DIR --lora NAME`); its numbers mean nothing.

The files are PEFT's (adapter_config.json, adapter_model.safetensors with
`base_model.model.model.layers.{l}.{self_attn|mlp}.{m}.lora_A|lora_B.weight`), written with
numpy and safetensors only. The default shape is the default model's (SmolLM2-135M: 30
layers, hidden 576, 9 query heads and 3 key/value heads of 64, MLP 1536).

Usage: python3 bench/make_lora_adapter.py OUT_DIR [--rank 16] [--layers 30] [--hidden 576]
           [--q-dim 576] [--kv-dim 192] [--ffn 1536] [--modules q,k,v,o,gate,up,down]
Needs: pip install numpy safetensors
"""

import argparse
import json
import os

import numpy as np
from safetensors.numpy import save_file

PATHS = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
         "o": "self_attn.o_proj", "gate": "mlp.gate_proj", "up": "mlp.up_proj",
         "down": "mlp.down_proj"}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--hidden", type=int, default=576)
    p.add_argument("--q-dim", type=int, default=576)
    p.add_argument("--kv-dim", type=int, default=192)
    p.add_argument("--ffn", type=int, default=1536)
    p.add_argument("--modules", default="q,k,v,o,gate,up,down")
    a = p.parse_args()
    h, q, kv, ff = a.hidden, a.q_dim, a.kv_dim, a.ffn
    shapes = {"q": (h, q), "k": (h, kv), "v": (h, kv), "o": (q, h), "gate": (h, ff),
              "up": (h, ff), "down": (ff, h)}  # (in, out)
    modules = a.modules.split(",")
    rng = np.random.default_rng(0)
    tensors = {}
    for layer in range(a.layers):
        for m in modules:
            fan_in, fan_out = shapes[m]
            name = f"base_model.model.model.layers.{layer}.{PATHS[m]}"
            tensors[f"{name}.lora_A.weight"] = (rng.standard_normal((a.rank, fan_in)) * 0.01).astype(np.float32)
            tensors[f"{name}.lora_B.weight"] = (rng.standard_normal((fan_out, a.rank)) * 0.01).astype(np.float32)
    os.makedirs(a.out, exist_ok=True)
    save_file(tensors, os.path.join(a.out, "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": a.rank, "lora_alpha": 2 * a.rank, "bias": "none",
              "target_modules": [PATHS[m].split(".")[1] for m in modules], "use_rslora": False,
              "use_dora": False, "fan_in_fan_out": False, "modules_to_save": None}
    with open(os.path.join(a.out, "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=1)
    print(f"{a.out}: rank {a.rank}, {len(modules)} modules x {a.layers} layers")


if __name__ == "__main__":
    main()
