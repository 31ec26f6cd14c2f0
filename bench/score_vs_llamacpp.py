#!/usr/bin/env python3
"""Times teacher-forced scoring of N tokens: `tandem score --tokens ...` against llama.cpp
(through llama-cpp-python, logits for every position), alternating, several repetitions,
medians. Both use the same GGUF file, the same token ids and the same thread count.

usage: bench/score_vs_llamacpp.py MODEL [--tokens 512] [--threads 2] [--reps 5]
MODEL: a GGUF file or a model tandem knows by name (`gemma3-270m`).
Needs: a release build of tandem (cargo build --release) and `pip install llama-cpp-python`.
"""
import argparse, json, statistics, subprocess, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from model_file import gguf_path  # noqa: E402


def text_tokens(llm, n):
    prompts = json.loads((ROOT / "crates/model/tests/fixtures/default_model/prompts.json").read_text())
    ids = llm.tokenize(("\n\n".join(prompts) * 8).encode(), add_bos=False, special=True)
    assert len(ids) >= n, "not enough text"
    return ids[:n]


def time_tandem(model, ids, threads):
    cmd = [str(ROOT / "target/release/tandem"), "score", "--model", model, "--threads", str(threads),
           "--tokens", ",".join(map(str, ids)), "--json"]
    t = time.perf_counter()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    wall = time.perf_counter() - t
    return wall, json.loads(out)["perplexity"]


def time_llama(llm, ids):
    import numpy as np
    llm.reset()
    t = time.perf_counter()
    llm.eval(ids)
    elapsed = time.perf_counter() - t
    logits = np.asarray(llm.scores[: len(ids)], dtype=np.float64)
    m = logits.max(axis=1, keepdims=True)
    lp = logits - m - np.log(np.exp(logits - m).sum(axis=1, keepdims=True))
    nll = -np.mean([lp[i, ids[i + 1]] for i in range(len(ids) - 1)])
    return elapsed, float(np.exp(nll))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    a.model = gguf_path(a.model)
    import llama_cpp
    llm = llama_cpp.Llama(a.model, n_ctx=max(a.tokens, 512), n_batch=a.tokens, n_ubatch=a.tokens,
                          n_threads=a.threads, n_threads_batch=a.threads, logits_all=True, verbose=False)
    ids = text_tokens(llm, a.tokens)
    tw, lw = [], []
    for _ in range(a.reps):
        t, ppl_t = time_tandem(a.model, ids, a.threads)
        l, ppl_l = time_llama(llm, ids)
        tw.append(t)
        lw.append(l)
    mt, ml = statistics.median(tw), statistics.median(lw)
    print(json.dumps({
        "tokens": a.tokens, "threads": a.threads, "reps": a.reps,
        "tandem_wall_s_median": round(mt, 3), "tandem_tok_per_s": round(a.tokens / mt, 1),
        "tandem_wall_s_all": [round(x, 3) for x in tw],
        "llama_cpp_eval_s_median": round(ml, 3), "llama_cpp_tok_per_s": round(a.tokens / ml, 1),
        "llama_cpp_eval_s_all": [round(x, 3) for x in lw],
        "ratio_tandem_over_llama_cpp_speed": round(ml / mt, 3),
        "perplexity_tandem": ppl_t, "perplexity_llama_cpp": ppl_l,
        "llama_cpp_python": llama_cpp.__version__,
    }))


if __name__ == "__main__":
    main()
