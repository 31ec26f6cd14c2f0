#!/usr/bin/env python3
"""What LoRA adapters cost: `tandem bench` without an adapter and with random adapters of
the given ranks on every projection (bench/make_lora_adapter.py, the default model's shape
unless told otherwise), alternately, REPS times each; prints the median prefill and decode
tok/s of each configuration and its ratio to the base model, per batch size.

    python3 bench/lora_cost.py --binary target/release/tandem [--reps 5] [--ranks 16,64]
        [--dtypes auto,bf16] [--adapter-args "--layers 30 ..."] -- BENCH_ARGS...

Each rank runs once per `--lora-dtype` in --dtypes (default: auto only).

BENCH_ARGS go to `tandem bench` (e.g. `--model M --threads 2 --batch 1 --batch 16
--prompt-len 128 --gen-len 32`). Needs numpy and safetensors (for the adapters).
"""
import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))


def run(binary, bench_args, extra):
    out = subprocess.run([binary, "bench", *bench_args, *extra], capture_output=True,
                         text=True, check=True).stdout
    for line in out.splitlines():
        if line.startswith("{"):
            d = json.loads(line)
            yield d["batch"], d["prefill_tok_per_s"], d["decode_tok_per_s"]


def main():
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser()
    p.add_argument("--binary", required=True)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--ranks", default="16,64")
    p.add_argument("--adapter-args", default="")
    p.add_argument("--dtypes", default="auto", help="--lora-dtype values, comma-separated")
    a = p.parse_args(argv[:split])
    bench_args = argv[split + 1:]
    tmp = tempfile.mkdtemp(prefix="tandem-lora-cost-")
    configs = [("base", [])]
    for r in a.ranks.split(","):
        out = os.path.join(tmp, f"rank{r}")
        subprocess.run([sys.executable, os.path.join(HERE, "make_lora_adapter.py"), out,
                        "--rank", r, *shlex.split(a.adapter_args)], check=True)
        for d in a.dtypes.split(","):
            name = f"rank {r}" + ("" if d == "auto" else f" {d}")
            configs.append((name, ["--lora-modules", f"a={out}", "--lora", "a", "--lora-dtype", d]))
    runs = defaultdict(list)
    for i in range(a.reps):
        order = configs if i % 2 == 0 else configs[::-1]
        for name, extra in order:
            for batch, prefill, decode in run(a.binary, bench_args, extra):
                runs[(name, batch)].append((prefill, decode))
    print("| adapter | batch | prefill tok/s | ratio | decode tok/s | ratio |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for (name, batch), values in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0] != "base", kv[0][0])):
        pre = statistics.median(v[0] for v in values)
        dec = statistics.median(v[1] for v in values)
        base = runs[("base", batch)]
        bp, bd = statistics.median(v[0] for v in base), statistics.median(v[1] for v in base)
        print(f"| {name} | {batch} | {pre:.0f} | {pre / bp:.2f}x | {dec:.1f} | {dec / bd:.2f}x |")
    print(f"\nmedians of {a.reps} alternations; every run: {dict(runs)}", file=sys.stderr)


if __name__ == "__main__":
    main()
