#!/usr/bin/env python3
"""Two builds of tandem, alternately, on one workload: medians and their ratio.

    bench/ab.py engine NEW_TANDEM OLD_TANDEM REPS -- BENCH_ARGS...
        `tandem bench --json BENCH_ARGS` with each binary, REPS times each, alternating
        (new first on even repetitions, old first on odd ones); prints the median decode and
        prefill tok/s of each, their ratio, and every run.
    bench/ab.py kernels NEW_MATMUL_BENCH OLD_MATMUL_BENCH REPS -- MATMUL_BENCH_ARGS...
        the same with `examples/matmul_bench` binaries: the median GFLOP/s of the `packed`
        column (and of the exact one, a control the change did not touch) per shape and
        token count.

The machine this project measures on is shared and noisy: alternation spreads other
tenants' load over both builds, and medians resist outliers. Build the old commit in a
worktree (`git worktree add --detach DIR COMMIT`, `CARGO_TARGET_DIR=... cargo build
--release ...`).
"""
import json
import statistics
import subprocess
import sys
from collections import defaultdict


def alternate(new, old, reps, run):
    runs = {"new": defaultdict(list), "old": defaultdict(list)}
    for i in range(reps):
        order = [("new", new), ("old", old)] if i % 2 == 0 else [("old", old), ("new", new)]
        for tag, binary in order:
            for key, value in run(binary):
                runs[tag][key].append(value)
    return runs


def engine_run(args):
    def run(binary):
        out = subprocess.run([binary, "bench", "--json", *args], capture_output=True,
                             text=True, check=True).stdout
        for line in out.splitlines():
            if line.startswith("{"):
                row = json.loads(line)
                for key in ("decode_tok_per_s", "prefill_tok_per_s"):
                    yield key, row[key]
    return run


def kernels_run(args):
    def run(binary):
        out = subprocess.run([binary, *args], capture_output=True, text=True,
                             check=True).stdout
        for line in out.splitlines()[1:]:
            f = line.split()
            if len(f) >= 6:
                shape = f"{f[0]} {f[1]} tok={f[2]}"
                yield f"{shape} packed", float(f[-1])
                yield f"{shape} exact", float(f[-2])
    return run


def main():
    if len(sys.argv) < 5 or sys.argv[1] not in ("engine", "kernels") or "--" not in sys.argv:
        sys.exit(__doc__)
    mode, new, old, reps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    args = sys.argv[sys.argv.index("--") + 1:]
    run = engine_run(args) if mode == "engine" else kernels_run(args)
    runs = alternate(new, old, reps, run)
    for key in runs["new"]:
        n, o = statistics.median(runs["new"][key]), statistics.median(runs["old"][key])
        print(f"{key}: new {n:.1f} old {o:.1f} ratio {n / o:.3f}")
        print(f"    new {[round(v, 1) for v in runs['new'][key]]}")
        print(f"    old {[round(v, 1) for v in runs['old'][key]]}")


if __name__ == "__main__":
    main()
