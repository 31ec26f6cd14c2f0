#!/usr/bin/env python3
"""`tandem score` vs llama.cpp's `llama-perplexity` on the same text, same GGUF, same threads
(issue: CPU performance, goal: tandem at least 2x faster over 4,096 tokens).

Both score one window of --tokens tokens of the same text in a single forward (llama-perplexity
with `-c N --chunks 1 -b N -ub N`, which needs a text of at least 2N tokens; tandem scores the
first N tokens of that text, tokenized by its own tokenizer, which matches llama.cpp's). Whole
processes are timed, alternating, --reps times; medians and the ratio are printed as JSON.

    python3 bench/score_vs_perplexity.py [--model M] [--tokens 4096] [--threads 2] [--reps 3]

M: a GGUF file or a model tandem knows by name (`gemma3-270m`; default: the default model).
"""
import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from model_file import gguf_path  # noqa: E402
TANDEM = ROOT / "target/release/tandem"


def llama_bin():
    out = subprocess.run(["bash", str(ROOT / "bench/build_llama_cpp.sh")], check=True,
                         capture_output=True, text=True).stdout
    return Path(out.strip().splitlines()[-1])


def timed(cmd):
    t = time.perf_counter()
    p = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return time.perf_counter() - t, p


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m", help="a GGUF file or a known model's name")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    a.model = gguf_path(a.model)
    n = a.tokens
    prompts = json.loads((ROOT / "crates/model/tests/fixtures/default_model/prompts.json").read_text())
    text = "\n\n".join(prompts)
    # Repeat until tandem's tokenizer sees at least 2N tokens (llama-perplexity's minimum).
    with tempfile.TemporaryDirectory() as d:
        full = Path(d) / "full.txt"
        body = "\n\n".join([text] * 16)
        while True:
            full.write_text(body)
            # Tokenize (and score, once) in windows of N tokens.
            _, p = timed([str(TANDEM), "score", "--model", a.model, "--file", str(full), "--json",
                          "--window", str(n), "--stride", str(n)])
            ids = json.loads(p.stdout)["tokens"]
            if len(ids) >= 2 * n + 8:
                break
            body = body + "\n\n" + "\n\n".join([text] * 4)
        first = ",".join(map(str, ids[:n]))
        bin_dir = llama_bin()
        tandem_cmd = [str(TANDEM), "score", "--model", a.model, "--threads", str(a.threads),
                      "--tokens", first, "--json"]
        llama_cmd = [str(bin_dir / "llama-perplexity"), "-m", a.model, "-f", str(full), "-t", str(a.threads),
                     "-c", str(n), "-b", str(n), "-ub", str(n), "--chunks", "1"]
        t_times, l_times = [], []
        for r in range(a.reps):
            t, p = timed(tandem_cmd)
            t_times.append(t)
            tp = json.loads(p.stdout)["perplexity"]
            l, p = timed(llama_cmd)
            l_times.append(l)
            print(json.dumps({"rep": r, "tandem_s": round(t, 3), "llama_perplexity_s": round(l, 3),
                              "tandem_ppl": tp}))
        tm, lm = statistics.median(t_times), statistics.median(l_times)
        print(json.dumps({"tokens": n, "threads": a.threads, "tandem_median_s": round(tm, 3),
                          "llama_perplexity_median_s": round(lm, 3), "ratio_llama_over_tandem": round(lm / tm, 3)}))


if __name__ == "__main__":
    main()
