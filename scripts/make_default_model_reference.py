"""Reference fixtures for the default model (SmolLM2-135M-Instruct, GGUF Q4_1/Q8_0).

Writes, under crates/model/tests/fixtures/default_model/:

* tokenizer_reference.json: llama.cpp's token ids for every string of the tokenizer corpus
  (scripts/make_tokenizer_corpus.py), tokenized as a completion prompt
  (`llama_tokenize(add_special=True, parse_special=True)`: BOS only if the GGUF metadata
  asks for it; special-token texts such as <|im_start|> become their ids).
* reference.json: for each prompt of prompts.json, per-position log-probabilities from
  (a) llama.cpp (llama-cpp-python, logits for all positions) and (b) the exact fp32 function
  of the quantized weights (HF transformers loading the GGUF, dequantized to fp32), both on
  the same token ids (llama.cpp's tokenization).
  Layout per reference: token_logprobs[i] = log p(tokens[i] | tokens[:i]) (first is null);
  argmax[i] and top5[i] describe the distribution predicted at position i for the NEXT token
  (so argmax has one entry per token, the last one predicting past the prompt).
* chat_template_reference.json: conversations rendered by transformers'
  apply_chat_template(..., tokenize=False) with the GGUF's tokenizer.chat_template.

Usage: python3 scripts/make_default_model_reference.py [MODEL.gguf]
(default: the TANDEM_TEST_MODEL environment variable).
"""

import hashlib
import json
import math
import os
import platform
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "crates" / "model" / "tests" / "fixtures" / "default_model"
sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_tokenizer_corpus import corpus  # noqa: E402

N_THREADS = 2
TOP_K = 5


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def gguf_metadata(path: Path) -> dict:
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    wanted = ["tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.add_bos_token",
              "tokenizer.ggml.add_eos_token", "tokenizer.ggml.bos_token_id",
              "tokenizer.ggml.eos_token_id", "tokenizer.chat_template"]
    meta = {}
    for key in wanted:
        field = reader.fields.get(key)
        if field is not None:
            meta[key] = field.contents()
    meta["tokens"] = reader.fields["tokenizer.ggml.tokens"].contents()
    return meta


def versions() -> dict:
    import gguf
    import llama_cpp
    import torch
    import transformers
    from importlib.metadata import version

    return {
        "python": platform.python_version(),
        "llama_cpp_python": llama_cpp.__version__,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "gguf": version("gguf"),
        "numpy": np.__version__,
    }


def log_softmax(rows: np.ndarray) -> np.ndarray:
    rows = rows.astype(np.float64)
    m = rows.max(axis=-1, keepdims=True)
    return rows - m - np.log(np.exp(rows - m).sum(axis=-1, keepdims=True))


def summarize(logprobs: np.ndarray, tokens: list[int]) -> dict:
    """logprobs: [num_tokens, vocab] log-distributions; row i predicts token i+1."""
    token_logprobs = [None] + [round(float(logprobs[i, tokens[i + 1]]), 6)
                               for i in range(len(tokens) - 1)]
    argmax = [int(a) for a in logprobs.argmax(axis=-1)]
    top5 = []
    for row in logprobs:
        ids = np.argsort(-row, kind="stable")[:TOP_K]
        top5.append([[int(i), round(float(row[i]), 6)] for i in ids])
    return {"token_logprobs": token_logprobs, "argmax": argmax, "top5": top5}


def llama_cpp_tokenizer_reference(model: Path, meta: dict) -> dict:
    from llama_cpp import Llama

    llm = Llama(model_path=str(model), vocab_only=True, verbose=False)
    cases = []
    for text in corpus():
        # add_bos=True is llama_tokenize's add_special: BOS/EOS only where the metadata
        # asks for them.
        ids = llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)
        cases.append({"text": text, "ids": [int(i) for i in ids]})
    return {
        "description": "llama.cpp token ids for each text, tokenized as a completion prompt "
                       "(llama_tokenize add_special=true, parse_special=true)",
        "tokenizer_model": meta.get("tokenizer.ggml.model"),
        "tokenizer_pre": meta.get("tokenizer.ggml.pre"),
        "add_bos_token": meta.get("tokenizer.ggml.add_bos_token"),
        "cases": cases,
    }


def llama_cpp_logprobs(model: Path, token_lists: list[list[int]]) -> list[np.ndarray]:
    from llama_cpp import Llama

    n_ctx = max(512, max(len(t) for t in token_lists) + 16)
    llm = Llama(model_path=str(model), n_ctx=n_ctx, n_batch=n_ctx, n_threads=N_THREADS,
                logits_all=True, verbose=False)
    out = []
    for tokens in token_lists:
        llm.reset()
        llm.eval(tokens)
        out.append(log_softmax(np.array(llm.scores[: len(tokens)], dtype=np.float32)))
    return out


def hf_fp32_logprobs(model: Path, token_lists: list[list[int]]) -> list[np.ndarray]:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_pretrained(str(model.parent), gguf_file=model.name,
                                              dtype=torch.float32)
    hf.eval()
    out = []
    with torch.no_grad():
        for tokens in token_lists:
            logits = hf(torch.tensor([tokens], dtype=torch.long)).logits[0]
            out.append(log_softmax(logits.double().numpy()))
    return out


def compare(prompts: list[dict]) -> dict:
    diffs, agree, total = [], 0, 0
    nll = {"hf_fp32": [], "llama_cpp": []}
    for p in prompts:
        a, b = p["hf_fp32"], p["llama_cpp"]
        for x, y in zip(a["token_logprobs"][1:], b["token_logprobs"][1:]):
            diffs.append(abs(x - y))
            nll["hf_fp32"].append(-x)
            nll["llama_cpp"].append(-y)
        for x, y in zip(a["argmax"], b["argmax"]):
            agree += int(x == y)
            total += 1
    return {
        "mean_abs_dlogprob": float(np.mean(diffs)),
        "max_abs_dlogprob": float(np.max(diffs)),
        "top1_agreement": agree / total,
        "perplexity_hf_fp32": math.exp(float(np.mean(nll["hf_fp32"]))),
        "perplexity_llama_cpp": math.exp(float(np.mean(nll["llama_cpp"]))),
    }


CONVERSATIONS = [
    [{"role": "system", "content": "You are a terse assistant."},
     {"role": "user", "content": "What is 2 + 2?"}],
    [{"role": "user", "content": "Hello there!"}],
    [{"role": "user", "content": "Name a colour."},
     {"role": "assistant", "content": "Blue."},
     {"role": "user", "content": "Another one, please."}],
    [{"role": "system", "content": "Réponds en français. 🙂"},
     {"role": "user", "content": "  Bonjour !\nÇa va ?  "},
     {"role": "assistant", "content": "Oui, très bien."}],
    [{"role": "user", "content": ""}],
    [{"role": "assistant", "content": "I speak first."},
     {"role": "user", "content": "<|im_start|> inside {{ braces }} {% raw %}"}],
]


def chat_template_reference(meta: dict) -> dict:
    from transformers import PreTrainedTokenizerFast
    from tokenizers import Tokenizer, models

    template = meta["tokenizer.chat_template"]
    tokens = meta["tokens"]
    bos = tokens[meta["tokenizer.ggml.bos_token_id"]]
    eos = tokens[meta["tokenizer.ggml.eos_token_id"]]
    # Only the template rendering matters here; a trivial tokenizer object carries it.
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()),
                                  bos_token=bos, eos_token=eos)
    cases = []
    for messages in CONVERSATIONS:
        for add_generation_prompt in (False, True):
            text = tok.apply_chat_template(messages, chat_template=template, tokenize=False,
                                           add_generation_prompt=add_generation_prompt)
            cases.append({"messages": messages, "add_generation_prompt": add_generation_prompt,
                          "text": text})
    return {"bos_token": bos, "eos_token": eos, "cases": cases}


def write_json(name: str, value) -> None:
    path = FIXTURES / name
    path.write_text(json.dumps(value, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {path.relative_to(ROOT)} ({path.stat().st_size} bytes)")


def main() -> None:
    model = Path(sys.argv[1] if len(sys.argv) > 1 else os.environ["TANDEM_TEST_MODEL"])
    meta = gguf_metadata(model)
    print("tokenizer:", meta.get("tokenizer.ggml.model"), "pre:", meta.get("tokenizer.ggml.pre"),
          "add_bos:", meta.get("tokenizer.ggml.add_bos_token"))
    vers = versions()
    model_sha = sha256(model)

    tok_ref = llama_cpp_tokenizer_reference(model, meta)
    tok_ref["versions"] = vers
    tok_ref["model_sha256"] = model_sha
    write_json("tokenizer_reference.json", tok_ref)
    write_json("chat_template_reference.json", chat_template_reference(meta))

    from llama_cpp import Llama

    vocab = Llama(model_path=str(model), vocab_only=True, verbose=False)
    texts = json.loads((FIXTURES / "prompts.json").read_text(encoding="utf-8"))
    token_lists = [[int(i) for i in vocab.tokenize(t.encode("utf-8"), add_bos=True, special=True)]
                   for t in texts]
    lc = llama_cpp_logprobs(model, token_lists)
    hf = hf_fp32_logprobs(model, token_lists)
    prompts = [{"text": t, "tokens": toks, "hf_fp32": summarize(h, toks),
                "llama_cpp": summarize(l, toks)}
               for t, toks, h, l in zip(texts, token_lists, hf, lc)]
    stats = compare(prompts)
    print(json.dumps(stats, indent=1))
    write_json("reference.json", {"model_sha256": model_sha, "versions": vers,
                                  "n_threads_llama_cpp": N_THREADS,
                                  "llama_cpp_vs_hf_fp32": stats, "prompts": prompts})


if __name__ == "__main__":
    main()
