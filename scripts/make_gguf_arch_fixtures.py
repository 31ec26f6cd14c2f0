#!/usr/bin/env python3
"""Converts the Gemma 3, Phi-3 (scripts/make_sliding_window_fixtures.py), Qwen3-MoE and
Mixtral (scripts/make_moe_fixtures.py) Hugging Face fixtures to GGUF with llama.cpp's own
converter, convert_hf_to_gguf.py, in f32, into
crates/model/tests/fixtures/gguf_arch/{gemma3,phi3,qwen3_moe_norm,mixtral}.gguf: the tensor
layout, names and metadata llama.cpp writes for those architectures (Gemma's norms stored as
1 + w, Phi-3's fused attn_qkv and ffn_up, the experts merged into one 3-D tensor per matrix
and layer, Mixtral as `llama` with `expert_count`), on weights whose transformers fp32
logits the HF fixtures hold. (The converter writes no `norm_topk_prob`, and llama.cpp
renormalises the chosen experts' weights of every qwen3moe file, so only the renormalising
Qwen3-MoE fixture has a GGUF twin.) `mixtral_q8_0.gguf` is the Mixtral fixture in the
converter's Q8_0, for the int8 kernels' path through the experts.

The fixtures' tiny byte-level tokenizer is not one the converter recognises, so the
vocabulary step is skipped (the files carry no tokenizer: the tests load weights only).
The converter writes no layer pattern for Gemma 3 (llama.cpp then assumes every sixth layer
is global); the fixture's layer_types are added as `gemma3.attention.sliding_window_pattern`,
one flag per layer, the array form llama.cpp reads.

Usage: python3 scripts/make_gguf_arch_fixtures.py LLAMA_CPP_SOURCE_DIR
(the llama.cpp tree bench/build_llama_cpp.sh unpacks: bench/.llama.cpp/src/llama.cpp)
"""

import os
import sys
from pathlib import Path

src = Path(sys.argv[1]).resolve()
sys.path.insert(0, str(src / "gguf-py"))
sys.path.insert(0, str(src))
import convert_hf_to_gguf as conv  # noqa: E402
from conversion.gemma import Gemma3Model  # noqa: E402
from conversion.llama import LlamaModel  # noqa: E402
from conversion.phi import Phi3MiniModel  # noqa: E402
from conversion.qwen import Qwen3MoeModel  # noqa: E402

Gemma3Model.set_vocab = lambda self: None
_gemma3_params = Gemma3Model.set_gguf_parameters


def _gemma3_params_with_pattern(self):
    _gemma3_params(self)
    flags = [t == "sliding_attention" for t in self.hparams["layer_types"]]
    self.gguf_writer.add_array(f"{self.gguf_writer.arch}.attention.sliding_window_pattern", flags)


Gemma3Model.set_gguf_parameters = _gemma3_params_with_pattern
Phi3MiniModel.set_vocab = lambda self: None
LlamaModel.set_vocab = lambda self: None
Qwen3MoeModel.set_vocab = lambda self: None

HF = Path("crates/model/tests/fixtures/hf")
OUT = Path("crates/model/tests/fixtures/gguf_arch")


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    for name, outtype in [("gemma3", "f32"), ("phi3", "f32"), ("qwen3_moe_norm", "f32"),
                          ("mixtral", "f32"), ("mixtral", "q8_0")]:
        suffix = "" if outtype == "f32" else f"_{outtype}"
        out = OUT / f"{name}{suffix}.gguf"
        sys.argv = ["convert_hf_to_gguf.py", str(HF / name), "--outtype", outtype,
                    "--outfile", str(out)]
        conv.main()
        print(f"{out}: {os.path.getsize(out)} bytes")


if __name__ == "__main__":
    main()
