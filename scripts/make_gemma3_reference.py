#!/usr/bin/env python3
"""References for Gemma 3 270M (`--model gemma3-270m`, GGUF Q4_K_M).

Writes, under crates/model/tests/fixtures/gemma3_270m/:

* reference.json: for each prompt (prose, code, multilingual, a chat turn, and a text of
  over 1,000 tokens, twice the sliding window of 512), llama.cpp's token ids and the
  per-position log-probabilities of the exact fp32 function of the quantized weights
  (HF transformers loading the GGUF, dequantized to fp32, eager attention):
  token_logprobs[i] = log p(tokens[i] | tokens[:i]) (first is null); argmax[i] is the most
  likely token after position i.
* tokenizer_reference.json: llama.cpp's ids for
every string of the tokenizer corpus (scripts/make_tokenizer_corpus.py) plus prose, code,
multilingual text and rendered Gemma chat turns, each tokenized as a completion prompt
(add_special=true: BOS as the metadata asks; parse_special=true: special-token texts such as
<start_of_turn> become their ids), in the format of the default model's fixture.

llama.cpp is asked through its server's /tokenize endpoint (the binary that
bench/build_llama_cpp.sh builds), started here on a loopback port and stopped at the end.

Usage: python3 scripts/make_gemma3_reference.py MODEL.gguf LLAMA_CPP_BIN_DIR
"""

import hashlib
import json
import os
import platform
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_tokenizer_corpus import corpus  # noqa: E402

DIR = Path("crates/model/tests/fixtures/gemma3_270m")
OUT = DIR / "tokenizer_reference.json"
PROMPTS = [
    "The history of the printing press begins in the fifteenth century, when",
    "def merge_sort(xs):\n    if len(xs) <= 1:\n        return xs\n    mid = len(xs) // 2\n",
    "La Tour Eiffel a été construite pour l'Exposition universelle de 1889 à Paris.",
    "<start_of_turn>user\nName three primary colors.<end_of_turn>\n<start_of_turn>model\n",
    " ".join(f"Entry {i}: the river rose by {i % 7} inches near mill {i % 5}, and the farmers "
            f"of the valley wrote it down in ledger number {i // 10}." for i in range(48)),
]
PORT = 18397

EXTRA = [
    "The Gemma 3 family runs on laptops; this one has 270 million parameters.",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "fn main() {\n\tprintln!(\"{}\", 1 + 2 * 3);\n}\n",
    "Le cœur a ses raisons que la raison ne connaît point.",
    "Füße, Straße, Ärger — und ein paar Ümläute.",
    "日本語のテキストとカタカナ、ひらがな、漢字。",
    "中文文本：你好，世界！",
    "Русский текст с пунктуацией: «ёлки-палки».",
    "العربية من اليمين إلى اليسار",
    "हिन्दी में कुछ शब्द",
    "한국어 문장입니다.",
    "emoji 🤖🚀✨ and symbols ∑∫√ ≤ ≥",
    "<start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n",
    "<bos><start_of_turn>user\nYou are terse.\n\nHi!<end_of_turn>\n<start_of_turn>model\nHello."
    "<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n",
    "literal <start_of_turn without closing, and <eos> mid-text",
]


def post(path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def main():
    model, bin_dir = Path(sys.argv[1]), Path(sys.argv[2])
    env = dict(os.environ, LD_LIBRARY_PATH=str(bin_dir))
    server = subprocess.Popen(
        [str(bin_dir / "llama-server"), "-m", str(model), "--host", "127.0.0.1", "--port",
         str(PORT), "-c", "512", "-t", "1", "--no-warmup"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(120):
            try:
                post("/tokenize", {"content": "x"})
                break
            except OSError:
                time.sleep(0.5)
        cases = []
        for text in corpus() + EXTRA:
            ids = post("/tokenize", {"content": text, "add_special": True,
                                     "parse_special": True})["tokens"]
            cases.append({"text": text, "ids": ids})
        props = post("/tokenize", {"content": "", "add_special": True})["tokens"]
        prompt_ids = [post("/tokenize", {"content": t, "add_special": True,
                                         "parse_special": True})["tokens"] for t in PROMPTS]
    finally:
        server.terminate()
        server.wait()
    sha = hashlib.sha256(model.read_bytes()).hexdigest()
    out = {
        "description": "llama.cpp token ids for each text, tokenized as a completion prompt "
                       "(llama-server /tokenize, add_special=true, parse_special=true)",
        "tokenizer_model": "llama",
        "add_bos_token": props == [2],
        "cases": cases,
        "versions": {"python": platform.python_version(),
                     "llama_cpp_build": os.environ.get("LLAMA_CPP_BIN_VERSION", "11434.0.0")},
        "model_sha256": sha,
    }
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(out, ensure_ascii=False, indent=0) + "\n")
    print(f"{OUT}: {len(cases)} cases")
    write_logprob_reference(model, prompt_ids, sha)


def write_logprob_reference(model, prompt_ids, sha):
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(model.parent), gguf_file=model.name,
                                              dtype=torch.float32, attn_implementation="eager")
    hf.eval()
    prompts = []
    with torch.no_grad():
        for text, ids in zip(PROMPTS, prompt_ids):
            logits = hf(torch.tensor([ids])).logits[0].double()
            lp = torch.log_softmax(logits, -1)
            token_lp = [None] + [round(lp[i - 1, ids[i]].item(), 7) for i in range(1, len(ids))]
            prompts.append({"text": text, "tokens": ids,
                            "hf_fp32": {"token_logprobs": token_lp,
                                        "argmax": lp.argmax(-1).tolist()}})
    out = {
        "model_sha256": sha,
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__},
        "prompts": prompts,
    }
    path = DIR / "reference.json"
    path.write_text(json.dumps(out, ensure_ascii=False) + "\n")
    print(f"{path}: {[len(p) for p in prompt_ids]} tokens")


if __name__ == "__main__":
    main()
