#!/usr/bin/env python3
"""Greedy chat generation side by side: `tandem generate --chat` (default int8 kernels and the
exact fp32 path) against llama.cpp's llama-server on the same GGUF (and on llama.cpp's own F32
copy of it, the exact function of the quantized weights), same user messages.

llama.cpp renders the chat template itself (`/apply-template`: its built-in template named by
`--chat-template`, `gemma` by default, as the Gemma 3 GGUF carries none; "" for the GGUF's own
through its Jinja engine) and
generates with `/completion` at temperature 0 and top-k 1, returning its token ids; tandem
renders its own and reports its token ids (`generate --json`). For each prompt and engine:
the prompt's length in tokens, the generated ids, where they first differ from llama.cpp's
on the same file, the finish reason and the text.

    python3 bench/chat_greedy.py [--model gemma3-270m] [--chat-template gemma] [--max-tokens 96]
                                 [--threads 2]

Needs a release build of tandem and llama.cpp from bench/build_llama_cpp.sh.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TANDEM = ROOT / "target/release/tandem"
sys.path.insert(0, str(ROOT / "bench"))
from model_file import gguf_path  # noqa: E402

PROMPTS = [
    "Name three primary colors.",
    "Write a Python function that returns the factorial of n.",
    "Explique en deux phrases pourquoi le ciel est bleu.",
    "What is the capital of Japan? Answer in one word.",
]


def llama_bin():
    out = subprocess.run(["bash", str(ROOT / "bench/build_llama_cpp.sh")], check=True,
                         capture_output=True, text=True).stdout
    return Path(out.strip().splitlines()[-1])


def tandem(model, prompt, a, kernels=None):
    cmd = [str(TANDEM), "generate", "--model", model, "--chat", "--prompt", prompt,
           "--temperature", "0", "--max-tokens", str(a.max_tokens), "--threads", str(a.threads),
           "--json"]
    if kernels:
        cmd += ["--kernels", kernels]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    r = json.loads(out.strip().splitlines()[-1])
    return {"prompt_tokens": r["usage"]["prompt_tokens"], "ids": r["token_ids"],
            "finish_reason": r["finish_reason"], "text": r["text"]}


class LlamaServer:
    """llama-server on a free loopback port for the length of a `with` block."""

    def __init__(self, bin_dir, model, threads, template):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        env = dict(os.environ, LD_LIBRARY_PATH=str(bin_dir))
        self.proc = subprocess.Popen(
            [str(bin_dir / "llama-server"), "-m", model, "--host", "127.0.0.1", "--port",
             str(self.port), "-c", "2048", "-t", str(threads), "-tb", str(threads), "-np", "1",
             *(["--no-jinja", "--chat-template", template] if template else ["--jinja"])],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def post(self, path, body):
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}",
                                     json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as r:
            return json.loads(r.read())

    def __enter__(self):
        for _ in range(600):
            try:
                self.post("/tokenize", {"content": "x"})
                return self
            except OSError:
                assert self.proc.poll() is None, "llama-server exited"
                time.sleep(0.2)
        raise RuntimeError("llama-server did not start")

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait()

    def chat(self, prompt, max_tokens):
        rendered = self.post("/apply-template",
                             {"messages": [{"role": "user", "content": prompt}]})["prompt"]
        ids = self.post("/tokenize", {"content": rendered, "add_special": True,
                                      "parse_special": True})["tokens"]
        r = self.post("/completion", {"prompt": ids, "n_predict": max_tokens, "temperature": 0,
                                      "top_k": 1, "repeat_penalty": 1.0, "return_tokens": True,
                                      "cache_prompt": False})
        finish = "length" if r.get("stop_type") == "limit" else "stop"
        return {"prompt_tokens": len(ids), "ids": r["tokens"], "finish_reason": finish,
                "text": r["content"]}


def first_difference(ids, ref):
    """The first index where the two id lists differ (None when equal)."""
    for i, (x, y) in enumerate(zip(ids, ref)):
        if x != y:
            return i
    return None if len(ids) == len(ref) else min(len(ids), len(ref))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gemma3-270m", help="a GGUF file or a known model's name")
    ap.add_argument("--chat-template", default="gemma",
                    help="llama.cpp's built-in template; \"\" for the GGUF's own")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    model = gguf_path(a.model)
    bin_dir = llama_bin()
    f32 = Path(model).with_suffix(".f32.gguf")
    if not f32.exists():
        subprocess.run([str(bin_dir / "llama-quantize"), "--allow-requantize", model, str(f32),
                        "F32"], check=True, capture_output=True)
    runs = {p: {} for p in PROMPTS}
    for name, path in (("llama_cpp", model), ("llama_cpp_f32", str(f32))):
        with LlamaServer(bin_dir, path, a.threads, a.chat_template) as server:
            for p in PROMPTS:
                runs[p][name] = server.chat(p, a.max_tokens)
    for p in PROMPTS:
        runs[p]["tandem_int8"] = tandem(model, p, a)
        runs[p]["tandem_exact"] = tandem(model, p, a, "avx512")
    print("\n| prompt | engine | prompt tokens | generated | first difference vs llama.cpp "
          "(same file) | vs llama.cpp F32 | finish | text (first 48 characters) |\n"
          "| --- | --- | --- | --- | --- | --- | --- | --- |")
    for p, by in runs.items():
        for name in ("llama_cpp", "llama_cpp_f32", "tandem_int8", "tandem_exact"):
            r = by[name]
            diffs = [first_difference(r["ids"], by[ref]["ids"])
                     for ref in ("llama_cpp", "llama_cpp_f32")]
            r["first_difference_vs_llama_cpp"], r["first_difference_vs_llama_cpp_f32"] = diffs
            print(json.dumps({"prompt": p, "engine": name, **r}, ensure_ascii=False),
                  file=sys.stderr)
            cells = " | ".join("none" if d is None else str(d) for d in diffs)
            text = r["text"][:48].replace("\n", "\\n").replace("|", "\\|")
            print(f"| {p} | {name} | {r['prompt_tokens']} | {len(r['ids'])} | {cells} | "
                  f"{r['finish_reason']} | {text} |")


if __name__ == "__main__":
    main()
