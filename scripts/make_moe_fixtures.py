#!/usr/bin/env python3
"""Builds the Hugging Face fixtures of the mixture-of-experts architectures under
crates/model/tests/fixtures/hf/, in the layout of scripts/make_hf_fixtures.py (whose helpers
this script uses: same tokenizer, same reference.json format, same fp32 eager reference):

  qwen3_moe        Qwen3MoeForCausalLM, 8 experts, 2 per token, norm_topk_prob false
                   (the softmax weights of the chosen experts used as they are)
  qwen3_moe_norm   the same architecture with norm_topk_prob true (weights renormalised)
  mixtral          MixtralForCausalLM, 8 experts, 2 per token (always renormalised)

Each fixture is checked to exercise its routing: every token's k-th and (k+1)-th expert
weights differ by more than 1e-4 (so that rounding cannot flip a choice between
implementations), and the routing changes between tokens (every expert is used by some
token of the test prompts).

Run from the repository root: python3 scripts/make_moe_fixtures.py
Everything is seeded; re-running reproduces the same files for the same library versions.
"""

import os
import sys

import torch
from transformers import MixtralConfig, MixtralForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_hf_fixtures as hf  # noqa: E402

EXPERTS = 8
PER_TOKEN = 2
MIN_GAP = 1e-4

SMALL = dict(vocab_size=hf.VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=8, max_position_embeddings=512, bos_token_id=1,
             eos_token_id=2, tie_word_embeddings=True, num_local_experts=EXPERTS,
             num_experts_per_tok=PER_TOKEN,
             rope_parameters={"rope_type": "default", "rope_theta": 10000.0})


def check_routing(model, seqs, router_suffix):
    """Every router's top-k is unambiguous, and every expert serves some token."""
    used = {}
    gaps = []

    def hook(name):
        def run(_module, _inputs, output):
            logits = output[0] if isinstance(output, tuple) else output
            probs = torch.softmax(logits.float(), dim=-1)
            top = probs.topk(PER_TOKEN + 1, dim=-1).values
            gaps.append((top[:, PER_TOKEN - 1] - top[:, PER_TOKEN]).min().item())
            chosen = probs.topk(PER_TOKEN, dim=-1).indices.flatten().tolist()
            used.setdefault(name, set()).update(chosen)
        return run

    handles = [m.register_forward_hook(hook(n)) for n, m in model.named_modules()
               if n.endswith(router_suffix)]
    assert handles, f"no module ends with {router_suffix}"
    hf.reference_logits(model, seqs)
    for h in handles:
        h.remove()
    assert min(gaps) > MIN_GAP, f"a routing choice is ambiguous (gap {min(gaps)})"
    for name, experts in used.items():
        assert len(experts) == EXPERTS, f"{name} uses only experts {sorted(experts)}"


def build(name, cls, cfg, seed, tok, router_suffix):
    model = hf.make(cls, cfg, seed)
    seqs = hf.input_sequences(seed + 1000)
    check_routing(model, seqs, router_suffix)
    logits = hf.reference_logits(model, seqs)
    hf.save_fixture(name, model, tok, seqs, logits, hf.llama_gen())


def main():
    tok = hf.build_tokenizer()
    for name, norm, seed in [("qwen3_moe", False, 21), ("qwen3_moe_norm", True, 22)]:
        cfg = Qwen3MoeConfig(**SMALL, intermediate_size=48, moe_intermediate_size=16,
                             norm_topk_prob=norm, rms_norm_eps=1e-6)
        build(name, Qwen3MoeForCausalLM, cfg, seed, tok, "mlp.gate")
    cfg = MixtralConfig(**SMALL, intermediate_size=32, rms_norm_eps=1e-5, sliding_window=None)
    build("mixtral", MixtralForCausalLM, cfg, 23, tok, "mlp.gate")


if __name__ == "__main__":
    main()
