#!/usr/bin/env python3
"""Random-weight models at real shapes, for the CUDA backend's GPU checks.

Usage: make_gpu_models.py OUTDIR [MODEL ...]

For each model writes OUTDIR/<name>-f32/ and OUTDIR/<name>-bf16/ (config.json,
model.safetensors, tokenizer.json, tokenizer_config.json) and OUTDIR/ref_<name>.json with
fixed token sequences (4 x 256 and 1 x 512 random ids) and, per sequence, the torch
log-softmax at the actual next token of every position: `f32_logprobs` (fp32, TF32 off,
eager attention) and `bf16_logprobs` (the same model cast to bf16). Seeds are pinned.
Needs torch and transformers (run on the GPU machine; uses CUDA when available).
"""
import json
import os
import sys

import torch
import transformers

MODELS = {
    "smollm2-135m": dict(
        cls="LlamaForCausalLM", hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, intermediate_size=1536, vocab_size=49152,
        tie_word_embeddings=True, rope_theta=100000.0, rms_norm_eps=1e-5,
        max_position_embeddings=8192),
    "qwen3-0.6b": dict(
        cls="Qwen3ForCausalLM", hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, intermediate_size=3072, vocab_size=151936,
        tie_word_embeddings=True, rope_theta=1000000.0, rms_norm_eps=1e-6,
        max_position_embeddings=40960),
    "llama3.2-1b": dict(
        cls="LlamaForCausalLM", hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
        num_key_value_heads=8, intermediate_size=8192, vocab_size=128256,
        tie_word_embeddings=True, rope_theta=500000.0, rms_norm_eps=1e-5,
        max_position_embeddings=131072,
        rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0,
                          high_freq_factor=4.0, original_max_position_embeddings=8192)),
    # Gemma 3 with the 270M model's layer shapes (head_dim 256, one kv head), six layers
    # (five sliding, one global) and a window of 128 positions, so that the 512-token
    # sequence's late tokens see windows across attention partitions. RoPE bases, the
    # query scale, GeGLU, the norms and the embedding's scale are transformers' Gemma 3
    # defaults.
    "gemma3-small": dict(
        cls="Gemma3ForCausalLM", hidden_size=640, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=1, head_dim=256, intermediate_size=2048, vocab_size=32000,
        tie_word_embeddings=True, rms_norm_eps=1e-6, max_position_embeddings=32768,
        sliding_window=128, query_pre_attn_scalar=256,
        hidden_activation="gelu_pytorch_tanh"),
    # A mixture of experts at Qwen3-30B-A3B's per-expert shapes, scaled down in depth and
    # expert count: 32 experts of width 768, 8 per token, renormalised.
    "qwen3moe-small": dict(
        cls="Qwen3MoeForCausalLM", hidden_size=2048, num_hidden_layers=4,
        num_attention_heads=32, num_key_value_heads=4, head_dim=128, intermediate_size=6144,
        moe_intermediate_size=768, num_experts=32, num_experts_per_tok=8, norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[], vocab_size=32000,
        tie_word_embeddings=False, rope_theta=1000000.0, rms_norm_eps=1e-6,
        max_position_embeddings=40960),
    "qwen2-small": dict(
        cls="Qwen2ForCausalLM", hidden_size=512, num_hidden_layers=4, num_attention_heads=8,
        num_key_value_heads=2, intermediate_size=1024, vocab_size=32000,
        tie_word_embeddings=False, rope_theta=1000000.0, rms_norm_eps=1e-6,
        max_position_embeddings=32768),
}

SEQ_LENS = [256, 256, 256, 256, 512]
# Larger than transformers' default (0.02) so that logits are far from uniform.
INIT_RANGE = 0.04


def bytes_to_unicode():
    """GPT-2's byte -> printable character table (the ByteLevel alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) \
        + list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for _, c in sorted(zip(bs, cs))]


def write_tokenizer(path, vocab_size):
    """A byte-level BPE tokenizer over the whole vocabulary: ids 0..255 are the bytes,
    the rest placeholder pieces, the last id the end-of-sequence token."""
    vocab = {ch: i for i, ch in enumerate(bytes_to_unicode())}
    for i in range(256, vocab_size - 1):
        vocab[f"t{i}"] = i
    vocab["<eos>"] = vocab_size - 1
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": True}
    tok = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": vocab_size - 1, "content": "<eos>", "single_word": False,
                          "lstrip": False, "rstrip": False, "normalized": False,
                          "special": True}],
        "normalizer": None, "pre_tokenizer": byte_level, "post_processor": None,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }
    with open(os.path.join(path, "tokenizer.json"), "w") as f:
        json.dump(tok, f)
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"eos_token": "<eos>", "bos_token": None, "add_bos_token": False}, f)


def build(name, spec, device):
    spec = dict(spec)
    cls = getattr(transformers, spec.pop("cls"))
    config_cls = cls.config_class
    config = config_cls(**spec, initializer_range=INIT_RANGE, attn_implementation="eager",
                        eos_token_id=spec["vocab_size"] - 1, bos_token_id=None)
    torch.manual_seed(1234)
    with torch.device(device):
        model = cls(config).float().eval()
    return model


@torch.no_grad()
def logprobs(model, seqs, device):
    out = []
    for s in seqs:
        ids = torch.tensor([s], device=device)
        logits = model(ids).logits[0].float()
        lp = torch.log_softmax(logits[:-1], dim=-1)
        out.append(lp.gather(1, ids[0, 1:, None])[:, 0].cpu().tolist())
    return out


def make(outdir, name, device):
    spec = MODELS[name]
    model = build(name, spec, device)
    gen = torch.Generator().manual_seed(99)
    seqs = [torch.randint(0, spec["vocab_size"] - 1, (n,), generator=gen).tolist()
            for n in SEQ_LENS]
    f32 = logprobs(model, seqs, device)
    for tag, dtype in [("f32", torch.float32), ("bf16", torch.bfloat16)]:
        path = os.path.join(outdir, f"{name}-{tag}")
        model.to(dtype).save_pretrained(path, safe_serialization=True)
        write_tokenizer(path, spec["vocab_size"])
    bf16 = logprobs(model, seqs, device)  # the model is bf16 now
    with open(os.path.join(outdir, f"ref_{name}.json"), "w") as f:
        json.dump({"model": name, "tokens": seqs, "f32_logprobs": f32,
                   "bf16_logprobs": bf16}, f)
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    print(f"{name}: written", flush=True)


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    outdir = sys.argv[1]
    names = sys.argv[2:] or list(MODELS)
    os.makedirs(outdir, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    failed = []
    for name in names:
        try:
            make(outdir, name, device)
        except Exception as e:  # keep going: one run should tell as much as possible
            print(f"{name}: FAILED: {e!r}", flush=True)
            failed.append(name)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
