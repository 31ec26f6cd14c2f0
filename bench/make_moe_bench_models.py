#!/usr/bin/env python3
"""Writes two GGUF files for the mixture-of-experts speed comparison (BENCHMARKS.md): a
`qwen3moe` model shaped like Qwen3-30B-A3B's layers (hidden 2048, 32 query and 4 key/value
heads of 128, 128 experts of width 768, 8 per token) and a dense `qwen3` model with the same
attention and an MLP of width 8 x 768 = 6144, so that both run the same number of weights per
token (the active parameters). Both have LAYERS layers and every matrix in Q8_0; the
tokenizer (and so the vocabulary, 49152) is the default model's, copied from its GGUF.

The weights are random (the speed of a product does not depend on its values); random
routers spread the tokens over the experts as a trained router roughly does.

Usage: python3 bench/make_moe_bench_models.py DEFAULT_MODEL.gguf OUT_DIR [LAYERS]
(needs the `gguf` and `numpy` packages; about 2.8 GB for the MoE file at 4 layers)
"""

import sys
from pathlib import Path

import numpy as np
import gguf

HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 2048, 32, 4, 128
EXPERTS, PER_TOKEN, EXPERT_FFN = 128, 8, 768
DENSE_FFN = PER_TOKEN * EXPERT_FFN
rng = np.random.default_rng(0)


def q8_0(shape):
    """Random Q8_0 bytes for a tensor of `shape` (outermost first): per block of 32, an f16
    scale and 32 int8 values."""
    *outer, cols = shape
    blocks = int(np.prod(outer)) * cols // 32
    scale = np.full((blocks, 1), 0.02 / 127, dtype=np.float16).view(np.uint8)
    values = rng.integers(-127, 128, size=(blocks, 32), dtype=np.int8).view(np.uint8)
    raw = np.concatenate([scale, values], axis=1)
    return raw.reshape(*outer, cols // 32 * 34)


def f32(shape, std=1.0, mean=0.0):
    return (mean + std * rng.standard_normal(shape)).astype(np.float32)


def copy_tokenizer(src, w):
    r = gguf.GGUFReader(src)
    for name, field in r.fields.items():
        if not name.startswith("tokenizer."):
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            sub = field.types[1]
            if sub == gguf.GGUFValueType.STRING:
                vals = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
            else:
                vals = [field.parts[i][0].item() for i in field.data]
            w.add_array(name, vals)
        elif kind == gguf.GGUFValueType.STRING:
            w.add_string(name, bytes(field.parts[field.data[0]]).decode("utf-8"))
        else:
            w.add_key_value(name, field.parts[field.data[0]][0].item(), kind)
    return len(r.fields["tokenizer.ggml.tokens"].data)


def write(path, arch, layers, tokenizer_src, moe):
    w = gguf.GGUFWriter(str(path), arch)
    vocab = copy_tokenizer(tokenizer_src, w)
    w.add_block_count(layers)
    w.add_context_length(4096)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(EXPERT_FFN if moe else DENSE_FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_key_length(HEAD_DIM)
    w.add_value_length(HEAD_DIM)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    if moe:
        w.add_expert_count(EXPERTS)
        w.add_expert_used_count(PER_TOKEN)
        w.add_expert_feed_forward_length(EXPERT_FFN)
    q8 = gguf.GGMLQuantizationType.Q8_0
    w.add_tensor("token_embd.weight", q8_0([vocab, HIDDEN]), raw_dtype=q8)
    w.add_tensor("output_norm.weight", f32([HIDDEN], 0.1, 1.0))
    w.add_tensor("output.weight", q8_0([vocab, HIDDEN]), raw_dtype=q8)
    for i in range(layers):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", f32([HIDDEN], 0.1, 1.0))
        w.add_tensor(p + "ffn_norm.weight", f32([HIDDEN], 0.1, 1.0))
        w.add_tensor(p + "attn_q_norm.weight", f32([HEAD_DIM], 0.1, 1.0))
        w.add_tensor(p + "attn_k_norm.weight", f32([HEAD_DIM], 0.1, 1.0))
        w.add_tensor(p + "attn_q.weight", q8_0([HEADS * HEAD_DIM, HIDDEN]), raw_dtype=q8)
        w.add_tensor(p + "attn_k.weight", q8_0([KV_HEADS * HEAD_DIM, HIDDEN]), raw_dtype=q8)
        w.add_tensor(p + "attn_v.weight", q8_0([KV_HEADS * HEAD_DIM, HIDDEN]), raw_dtype=q8)
        w.add_tensor(p + "attn_output.weight", q8_0([HIDDEN, HEADS * HEAD_DIM]), raw_dtype=q8)
        if moe:
            w.add_tensor(p + "ffn_gate_inp.weight", f32([EXPERTS, HIDDEN], 0.05))
            for part, shape in [("gate", [EXPERTS, EXPERT_FFN, HIDDEN]),
                                ("up", [EXPERTS, EXPERT_FFN, HIDDEN]),
                                ("down", [EXPERTS, HIDDEN, EXPERT_FFN])]:
                w.add_tensor(p + f"ffn_{part}_exps.weight", q8_0(shape), raw_dtype=q8)
        else:
            w.add_tensor(p + "ffn_gate.weight", q8_0([DENSE_FFN, HIDDEN]), raw_dtype=q8)
            w.add_tensor(p + "ffn_up.weight", q8_0([DENSE_FFN, HIDDEN]), raw_dtype=q8)
            w.add_tensor(p + "ffn_down.weight", q8_0([HIDDEN, DENSE_FFN]), raw_dtype=q8)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{path}: {path.stat().st_size / 1e9:.2f} GB")


def main():
    src, out = sys.argv[1], Path(sys.argv[2])
    layers = int(sys.argv[3]) if len(sys.argv) > 3 else 4
    out.mkdir(parents=True, exist_ok=True)
    write(out / f"moe-{layers}l-q8_0.gguf", "qwen3moe", layers, src, moe=True)
    write(out / f"dense-{layers}l-q8_0.gguf", "qwen3", layers, src, moe=False)


if __name__ == "__main__":
    main()
