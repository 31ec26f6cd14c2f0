#!/usr/bin/env python3
"""Converts the Gemma 3 and Phi-3 Hugging Face fixtures (scripts/make_sliding_window_fixtures.py)
to GGUF with llama.cpp's own converter, convert_hf_to_gguf.py, in f32, into
crates/model/tests/fixtures/gguf_arch/{gemma3,phi3}.gguf: the tensor layout, names and
metadata llama.cpp writes for those architectures (Gemma's norms stored as 1 + w, Phi-3's
fused attn_qkv and ffn_up), on weights whose transformers fp32 logits the HF fixtures hold.

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
from conversion.phi import Phi3MiniModel  # noqa: E402

Gemma3Model.set_vocab = lambda self: None
_gemma3_params = Gemma3Model.set_gguf_parameters


def _gemma3_params_with_pattern(self):
    _gemma3_params(self)
    flags = [t == "sliding_attention" for t in self.hparams["layer_types"]]
    self.gguf_writer.add_array(f"{self.gguf_writer.arch}.attention.sliding_window_pattern", flags)


Gemma3Model.set_gguf_parameters = _gemma3_params_with_pattern
Phi3MiniModel.set_vocab = lambda self: None

HF = Path("crates/model/tests/fixtures/hf")
OUT = Path("crates/model/tests/fixtures/gguf_arch")


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    for name in ["gemma3", "phi3"]:
        out = OUT / f"{name}.gguf"
        sys.argv = ["convert_hf_to_gguf.py", str(HF / name), "--outtype", "f32",
                    "--outfile", str(out)]
        conv.main()
        print(f"{out}: {os.path.getsize(out)} bytes")


if __name__ == "__main__":
    main()
