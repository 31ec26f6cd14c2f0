#!/usr/bin/env python3
"""Builds the small Hugging Face fixtures under crates/model/tests/fixtures/hf/.

Each fixture is a directory as `save_pretrained` writes it (config.json,
generation_config.json, model.safetensors or model-0000k-of-0000n.safetensors +
model.safetensors.index.json), plus a tiny byte-level BPE tokenizer (tokenizer.json,
tokenizer_config.json) and the reference outputs:

  reference.json   {
    "format": 1,
    "transformers_version", "torch_version": versions that produced it,
    "model_class": e.g. "LlamaForCausalLM",
    "stored_dtype": "float32" | "bfloat16" | "float16",
    "reference_dtype": "float32" (the forward always runs in fp32),
    "vocab_size": int,
    "logits_encoding": "f32le" (raw little-endian IEEE-754 binary32, row-major),
    "sequences": [ { "input_ids": [int, ...],
                     "logits_file": "logits_<i>.bin",   # [len(input_ids), vocab_size]
                     "argmax": [int, ...] },             # per position, for quick checks
                   ... ] }
  logits_<i>.bin   model(input_ids).logits[0] of sequence i, f32 little-endian.

The low-precision fixtures (llama_tied_bf16, llama_tied_f16) store llama_tied's weights
cast to bf16/f16; their reference logits come from those cast weights upcast back to fp32,
so the reference is the exact function of the stored bytes.

Run from the repository root: python3 scripts/make_hf_fixtures.py
Everything is seeded; re-running reproduces the same files for the same library versions.
"""

import copy
import json
import os
import shutil

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

OUT = os.path.join("crates", "model", "tests", "fixtures", "hf")
VOCAB = 320
SEQ_LENS = (20, 33)
WEIGHT_STD = 0.2
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TRAIN_TEXT = [
    "The quick brown fox jumps over the lazy dog.",
    "A tiny language model reads a tiny amount of text and learns a few merges.",
    "Rotary position embeddings rotate pairs of dimensions by an angle that grows with position.",
    "Grouped-query attention shares each key and value head among several query heads.",
    "The tokenizer splits text into bytes, then merges the most frequent pairs again and again.",
    "Hello, world! How are you today? I am fine, thank you; and you?",
    "Numbers like 12345 and 67890 appear too, as do symbols: #, $, %, &, *.",
    "Inference engines batch requests continuously and cache keys and values in blocks.",
]

COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    hidden_act="silu",
)


def build_tokenizer():
    """A byte-level BPE trained to exactly VOCAB entries (ids 0..2 are the specials)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TRAIN_TEXT * 4, trainer=trainer)
    assert tok.get_vocab_size() == VOCAB, tok.get_vocab_size()
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == i
    return tok


def save_tokenizer(tok, out_dir, bos, eos):
    """tokenizer.json as the `tokenizers` library writes it, and a tokenizer_config.json in
    the common (transformers 4.x) form with the chat template inline."""
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    added = {
        str(i): {"content": s, "lstrip": False, "normalized": False, "rstrip": False,
                 "single_word": False, "special": True}
        for i, s in enumerate(SPECIALS)
    }
    cfg = {
        "add_bos_token": False,
        "add_eos_token": False,
        "added_tokens_decoder": added,
        "bos_token": bos,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": eos,
        "model_max_length": 4096,
        "pad_token": SPECIALS[0],
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    # The files must load back in transformers and tokenize as the trained tokenizer does.
    back = PreTrainedTokenizerFast.from_pretrained(out_dir)
    text = TRAIN_TEXT[3]
    assert back(text)["input_ids"] == tok.encode(text).ids
    assert back.eos_token == eos and back.chat_template == CHAT_TEMPLATE


def randomize(model, seed):
    """Re-initialises every parameter so that logits are far from 0 and norms are not 1."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                # RMSNorm gains (incl. Qwen3 q_norm/k_norm): random around 1.
                p.copy_(1.0 + 0.25 * torch.randn(p.shape, generator=g))
            else:
                # Linear weights, biases and the embedding.
                p.copy_(WEIGHT_STD * torch.randn(p.shape, generator=g))


def input_sequences(seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in SEQ_LENS]


@torch.no_grad()
def reference_logits(model, seqs):
    model.eval()
    out = []
    for ids in seqs:
        logits = model(torch.tensor([ids])).logits[0]  # [seq_len, vocab]
        assert logits.dtype == torch.float32 and logits.shape == (len(ids), VOCAB)
        out.append(logits.contiguous())
    return out


def write_reference(out_dir, model, seqs, logits, stored_dtype):
    sequences = []
    for i, (ids, lg) in enumerate(zip(seqs, logits)):
        fname = f"logits_{i}.bin"
        with open(os.path.join(out_dir, fname), "wb") as f:
            f.write(lg.numpy().astype("<f4").tobytes())
        sequences.append(
            {"input_ids": ids, "logits_file": fname, "argmax": lg.argmax(-1).tolist()}
        )
    ref = {
        "format": 1,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "model_class": type(model).__name__,
        "stored_dtype": stored_dtype,
        "reference_dtype": "float32",
        "vocab_size": VOCAB,
        "logits_encoding": "f32le",
        "sequences": sequences,
    }
    with open(os.path.join(out_dir, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")


def save_fixture(name, model, tok, seqs, logits, gen, stored_dtype="float32", shard=None):
    out_dir = os.path.join(OUT, name)
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    kwargs = {"safe_serialization": True}
    if shard is not None:
        kwargs["max_shard_size"] = shard
    model.save_pretrained(out_dir, **kwargs)
    model.generation_config = gen
    gen.save_pretrained(out_dir)
    cfg = model.config
    bos = tok.id_to_token(cfg.bos_token_id) if cfg.bos_token_id is not None else None
    save_tokenizer(tok, out_dir, bos=bos, eos=SPECIALS[2])
    write_reference(out_dir, model, seqs, logits, stored_dtype)
    check_round_trip(out_dir, seqs, logits)
    print(f"{name}: {sorted(os.listdir(out_dir))}")


def check_round_trip(out_dir, seqs, logits):
    """The saved directory, loaded back by transformers in fp32, reproduces the reference."""
    back = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32,
                                                attn_implementation="eager")
    for got, want in zip(reference_logits(back, seqs), logits):
        assert torch.equal(got, want), (out_dir, (got - want).abs().max().item())


def make(cls, config, seed):
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = cls(config).to(torch.float32)
    randomize(model, seed)
    return model


def llama_cfg(**kw):
    base = dict(COMMON, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                rms_norm_eps=1e-5, max_position_embeddings=256, bos_token_id=1,
                eos_token_id=2, tie_word_embeddings=True, rope_theta=10000.0)
    base.update(kw)
    rope = {"rope_type": "default", "rope_theta": base.pop("rope_theta")}
    return LlamaConfig(rope_parameters=base.pop("rope_parameters", rope), **base)


def llama_gen():
    return GenerationConfig(bos_token_id=1, eos_token_id=2)


def qwen_gen():
    # Like Qwen's instruct models: several stop ids, the first differing from config.json.
    return GenerationConfig(eos_token_id=[2, 0])


def build_and_save(name, cls, cfg, seed, tok, gen, shard=None):
    model = make(cls, cfg, seed)
    seqs = input_sequences(seed + 1000)
    logits = reference_logits(model, seqs)
    save_fixture(name, model, tok, seqs, logits, gen, shard=shard)
    return model, seqs, logits


def low_precision_variant(name, model, tok, seqs, dtype, label):
    """`model`'s weights cast to `dtype`; the reference runs those values in fp32."""
    upcast = copy.deepcopy(model)
    with torch.no_grad():
        for p in upcast.parameters():
            p.copy_(p.to(dtype).to(torch.float32))
    logits = reference_logits(upcast, seqs)
    stored = copy.deepcopy(model).to(dtype)
    save_fixture(name, stored, tok, seqs, logits, llama_gen(), stored_dtype=label)


def main():
    tok = build_tokenizer()
    tied, seqs, _ = build_and_save("llama_tied", LlamaForCausalLM, llama_cfg(), 1, tok, llama_gen())
    build_and_save("llama_untied", LlamaForCausalLM,
                   llama_cfg(num_key_value_heads=4, head_dim=None, tie_word_embeddings=False,
                             rms_norm_eps=1e-6),
                   2, tok, llama_gen())
    # Llama 3 scaling with head_dim 16, theta 5e5: wavelengths 2*pi*theta^(2i/16) are
    # 6.3, 32.4, 167, 860, ... With original_max_position_embeddings 64 and
    # low/high_freq_factor 1/4 the thresholds are 64 and 16: pair 0 is kept, pair 1 is
    # smoothed, pairs 2..7 are divided by the factor. None lies near a threshold.
    rope3 = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
             "low_freq_factor": 1.0, "high_freq_factor": 4.0,
             "original_max_position_embeddings": 64}
    r3, r3_seqs, r3_logits = build_and_save(
        "llama3_rope", LlamaForCausalLM, llama_cfg(rope_parameters=rope3), 3, tok, llama_gen())
    # Sanity: the scaling must change the logits, or the fixture tests nothing.
    plain = copy.deepcopy(r3)
    plain.config.rope_parameters = {"rope_type": "default", "rope_theta": 500000.0}
    plain.model.rotary_emb = type(plain.model.rotary_emb)(plain.config)
    delta = (reference_logits(plain, r3_seqs)[1] - r3_logits[1]).abs().max().item()
    assert delta > 0.1, f"llama3 scaling barely changes the logits ({delta})"

    mistral = MistralConfig(**COMMON, num_attention_heads=4, num_key_value_heads=2,
                            rms_norm_eps=1e-5, max_position_embeddings=512, sliding_window=None,
                            bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
                            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    build_and_save("mistral", MistralForCausalLM, mistral, 4, tok, llama_gen())

    qwen2 = Qwen2Config(**COMMON, num_attention_heads=4, num_key_value_heads=2,
                        rms_norm_eps=1e-6, max_position_embeddings=1024, bos_token_id=None,
                        eos_token_id=0, tie_word_embeddings=True, use_sliding_window=False,
                        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    build_and_save("qwen2", Qwen2ForCausalLM, qwen2, 5, tok, qwen_gen())

    # head_dim 32 != hidden/heads (16): q has 128 outputs for a hidden size of 64.
    qwen3 = Qwen3Config(**COMMON, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                        rms_norm_eps=1e-6, max_position_embeddings=1024, bos_token_id=None,
                        eos_token_id=0, tie_word_embeddings=True, use_sliding_window=False,
                        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    build_and_save("qwen3", Qwen3ForCausalLM, qwen3, 6, tok, qwen_gen())

    # llama_tied's architecture and seed, split into shards of at most 150 kB.
    build_and_save("llama_sharded", LlamaForCausalLM, llama_cfg(), 1, tok, llama_gen(),
                   shard="150KB")

    low_precision_variant("llama_tied_bf16", tied, tok, seqs, torch.bfloat16, "bfloat16")
    low_precision_variant("llama_tied_f16", tied, tok, seqs, torch.float16, "float16")


if __name__ == "__main__":
    main()
