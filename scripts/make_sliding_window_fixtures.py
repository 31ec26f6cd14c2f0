#!/usr/bin/env python3
"""Builds the Hugging Face fixtures of the sliding-window architectures under
crates/model/tests/fixtures/hf/, in the layout of scripts/make_hf_fixtures.py (whose helpers
this script uses: same tokenizer, same reference.json format, same fp32 eager reference):

  gemma3        Gemma3ForCausalLM, 3 layers [sliding, full, sliding] with a window
                of 8 positions (the test prompts have 20 and 33 tokens), local RoPE base
                10000 vs global 1e6 with linear scaling 4 on the global layer,
                query_pre_attn_scalar 16 (= head_dim: llama.cpp's GGUF keeps no other), final logit soft-capping 5.
  mistral_swa   MistralForCausalLM with sliding_window 8 on every layer.
  phi3          Phi3ForCausalLM (fused qkv_proj and gate_up_proj) with sliding_window 8.

Run from the repository root: python3 scripts/make_sliding_window_fixtures.py
Everything is seeded; re-running reproduces the same files for the same library versions.
"""

import os
import sys

import torch
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    MistralConfig,
    MistralForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_hf_fixtures as hf  # noqa: E402

WINDOW = 8


def randomize_gemma(model, seed):
    """Like `make_hf_fixtures.randomize`, but Gemma's norm weights are stored as `w` for a
    gain `1 + w`: random around 0, so that the gains are random around 1."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(0.25 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(hf.WEIGHT_STD * torch.randn(p.shape, generator=g))


def build_gemma3(tok):
    cfg = Gemma3TextConfig(
        vocab_size=hf.VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-6,
        max_position_embeddings=512, sliding_window=WINDOW, query_pre_attn_scalar=16,
        final_logit_softcapping=5.0, bos_token_id=1, eos_token_id=2, pad_token_id=0,
        tie_word_embeddings=True,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
    )
    cfg._attn_implementation = "eager"
    seed = 7
    torch.manual_seed(seed)
    model = Gemma3ForCausalLM(cfg).to(torch.float32)
    randomize_gemma(model, seed)
    seqs = hf.input_sequences(seed + 1000)
    logits = hf.reference_logits(model, seqs)
    # The window must matter (the prompts are longer than it), and so must the soft-cap.
    full = Gemma3ForCausalLM(Gemma3TextConfig(**{**cfg.to_dict(), "sliding_window": 512}))
    full.config._attn_implementation = "eager"
    full.load_state_dict(model.state_dict())
    delta = (hf.reference_logits(full, seqs)[1] - logits[1]).abs().max().item()
    assert delta > 0.1, f"the sliding window barely changes the logits ({delta})"
    assert logits[1].abs().max().item() > 2.0, "the soft-cap is never approached"
    hf.save_fixture("gemma3", model, tok, seqs, logits, hf.llama_gen())


def build_mistral_swa(tok):
    cfg = MistralConfig(**hf.COMMON, num_attention_heads=4, num_key_value_heads=2,
                        rms_norm_eps=1e-5, max_position_embeddings=512, sliding_window=WINDOW,
                        bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
                        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    model, seqs, logits = hf.build_and_save("mistral_swa", MistralForCausalLM, cfg, 8, tok,
                                            hf.llama_gen())
    full = MistralForCausalLM(MistralConfig(**{**cfg.to_dict(), "sliding_window": None}))
    full.config._attn_implementation = "eager"
    full.load_state_dict(model.state_dict())
    delta = (hf.reference_logits(full, seqs)[1] - logits[1]).abs().max().item()
    assert delta > 0.1, f"the sliding window barely changes the logits ({delta})"


def build_phi3(tok):
    cfg = Phi3Config(vocab_size=hf.VOCAB, hidden_size=64, intermediate_size=96,
                     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                     rms_norm_eps=1e-5, max_position_embeddings=512,
                     original_max_position_embeddings=512, sliding_window=WINDOW,
                     bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False,
                     rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    hf.build_and_save("phi3", Phi3ForCausalLM, cfg, 9, tok, hf.llama_gen())


def main():
    tok = hf.build_tokenizer()
    build_gemma3(tok)
    build_mistral_swa(tok)
    build_phi3(tok)


if __name__ == "__main__":
    main()
