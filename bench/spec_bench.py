#!/usr/bin/env python3
"""Speculative decoding benchmark: decode tok/s through the engine (`tandem bench --engine`)
with and without speculation, interleaved repeats, medians.

usage: bench/spec_bench.py TANDEM_BINARY MODEL [--reps 3] [--gen-len 128]

Prints one markdown table for single-stream decode on the prompts in bench/spec_prompts/
(plain, n-gram, the model drafting for itself always or when it pays) and one for batches of 1..16 copies of a
prompt (plain vs n-gram with the batch switch off).
"""
import argparse
import json
import statistics
import subprocess
from pathlib import Path

PROMPTS = Path(__file__).parent / "spec_prompts"


def bench(binary, model, extra, batches, gen_len, prompt):
    cmd = [binary, "bench", "--model", model, "--engine", "--gen-len", str(gen_len),
           "--prompt-file", str(PROMPTS / f"{prompt}.txt")]
    for b in batches:
        cmd += ["--batch", str(b)]
    out = subprocess.run(cmd + extra, check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def print_single(single, modes):
    print("| prompt | mode | decode tok/s (median) | runs | x plain | acceptance | mean run |")
    print("|---|---|---|---|---|---|---|")
    for prompt in ["rewrite", "code_edit", "fresh"]:
        base = statistics.median(r["decode_tok_per_s"] for r in single[(prompt, "plain")])
        for name in modes:
            rs = single[(prompt, name)]
            med = statistics.median(r["decode_tok_per_s"] for r in rs)
            runs = ", ".join(f"{r['decode_tok_per_s']:.0f}" for r in rs)
            acc = statistics.median(r["spec_acceptance_rate"] for r in rs)
            run_len = statistics.median(r["spec_mean_acceptance_length"] for r in rs)
            print(f"| {prompt} | {name} | {med:.1f} | {runs} | {med / base:.2f} | "
                  f"{acc:.2f} | {run_len:.2f} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binary")
    ap.add_argument("model")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--skip-batches", action="store_true")
    ap.add_argument("--skip-single", action="store_true")
    ap.add_argument("--gen-len", type=int, default=128)
    a = ap.parse_args()
    modes = {
        "plain": [],
        "ngram k=4": ["--speculative", "ngram", "--num-speculative-tokens", "4"],
        "draft=self k=4, always": ["--speculative", f"draft:{a.model}",
                                   "--num-speculative-tokens", "4", "--speculative-draft-cost", "0"],
        "draft=self k=4, adaptive": ["--speculative", f"draft:{a.model}",
                                     "--num-speculative-tokens", "4"],
    }
    single = {}
    for _ in range(0 if a.skip_single else a.reps):
        for prompt in ["rewrite", "code_edit", "fresh"]:
            for name, extra in modes.items():
                r = bench(a.binary, a.model, extra, [1], a.gen_len, prompt)[0]
                single.setdefault((prompt, name), []).append(r)
    if not a.skip_single:
        print_single(single, modes)
    if a.skip_batches:
        return
    batches = [1, 2, 4, 8, 16]
    multi = {}
    on = ["--speculative", "ngram", "--speculative-max-batch", "64"]
    for _ in range(a.reps):
        for prompt in ["rewrite", "fresh"]:
            for name, extra in {"plain": [], "ngram k=4": on}.items():
                for r in bench(a.binary, a.model, extra, batches, a.gen_len, prompt):
                    multi.setdefault((prompt, name, r["batch"]), []).append(r)
    print()
    print("| prompt | batch | plain tok/s | ngram tok/s | x plain | acceptance |")
    print("|---|---|---|---|---|---|")
    for prompt in ["rewrite", "fresh"]:
        for b in batches:
            p = statistics.median(r["decode_tok_per_s"] for r in multi[(prompt, "plain", b)])
            ng = multi[(prompt, "ngram k=4", b)]
            s = statistics.median(r["decode_tok_per_s"] for r in ng)
            acc = statistics.median(r["spec_acceptance_rate"] for r in ng)
            print(f"| {prompt} | {b} | {p:.1f} | {s:.1f} | {s / p:.2f} | {acc:.2f} |")


if __name__ == "__main__":
    main()
